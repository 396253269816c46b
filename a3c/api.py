"""The Python API, in the shape Stable-Baselines3 users know, and the one run pipeline:
the command line's `a3c train` and `a3c eval` call it too.

    agent = A3C("cartpole", actors__num=4).learn(200_000)   # a shipped config, by name
    action, _ = agent.predict(obs)
    agent.save("cartpole.pt"); agent = A3C.load("cartpole.pt")
    agent = A3C.resume("runs/cartpole-20261207-120000").learn()   # a run folder goes on
    agent = A3C({"env": {"id": "Corridor"}}, env=make_corridor).learn()   # a user's own environment

A run: the config is loaded and validated, `preflight` checks what it names (the
environment, the device, the queue), the model is built and checked against the
learner's settings; only then is a run folder written, and the trainer started.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from .checkpoint import (check_compatible, config_here, latest_checkpoint, load_checkpoint,
                         load_state, save_checkpoint)
from .config import Config, ConfigError, config_to_dict, load_config, save_config
from .envs import env_action, factory_keywords, factory_name
from .envs.masks import MASK_KEY, OBS_KEY, flat_mask
from .envs.play import evaluate
from .envs.preflight import preflight, probe_env
from .envs.spaces import as_batch, batch_size, obs_to_torch
from .evaluator import existing_best
from .metrics import Sink
from .trainer import Trainer, build_default_model, check_learner_settings

__all__ = ["A3C", "evaluate", "new_run_dir"]

DEFAULT_CONFIG = "cartpole"


def new_run_dir(cfg: Config) -> Path:
    """Create runs/<name>-<YYYYmmdd-HHMMSS>, with a suffix if another run (perhaps started
    at the same second) has that name already."""
    base = Path(cfg.logging.run_root) / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.parent.mkdir(parents=True, exist_ok=True)
    run_dir, n = base, 1
    while True:
        try:
            run_dir.mkdir()  # atomic: exactly one run gets each name
            return run_dir
        except FileExistsError:
            run_dir, n = base.with_name(f"{base.name}-{n}"), n + 1


class A3C:
    """An A3C/V-trace agent.

    `config` is a shipped config's name (`"cartpole"`, the default; `a3c.config.shipped_configs`
    lists them), a path to a YAML file, a dict or a `Config`; keyword overrides use `__`
    for the dots (`optim__lr=3e-4` sets `optim.lr`). `model` replaces the default
    network with any `torch.nn.Module` that has the interface of `a3c.models.ActorCritic`.

    `env` is a callable returning a `gymnasium.Env` (a class, a module-level function, a
    `functools.partial` of one), called with `env.kwargs`. It makes every environment of
    the run (actors, the model's probe, `evaluate(..., env=agent.env_factory)`) in place of
    `env.id` and `env.entry_point`, which then only name the environment;
    `env.max_episode_steps`, `env.atari` and `env.wrappers` still apply to what it returns.
    With actor processes it must pickle. A config cannot hold it: the run's config records
    its name as `env.factory` (and a `functools.partial`'s keyword arguments in
    `env.kwargs`), and `A3C.load` of such a run needs `env=` again, as `a3c eval` needs
    `--env module:name`.

    A run whose environment the overrides (or `env`) change, and not its name, is named
    after the environment: `A3C("cartpole", env__id="Acrobot-v1")` makes `runs/Acrobot-v1-...`.
    """

    def __init__(self, config: str | os.PathLike | dict | Config = DEFAULT_CONFIG,
                 model: torch.nn.Module | None = None, env: Callable[..., gym.Env] | None = None,
                 **overrides):
        items = {k.replace("__", "."): v for k, v in overrides.items()}
        if env is not None:
            items["env.factory"] = factory_name(env)
        self.config = load_config(config, items)
        if env is not None:  # a partial's arguments, recorded with the run
            kwargs = {**factory_keywords(env), **self.config.env.kwargs}
            self.config = dataclasses.replace(self.config, env=dataclasses.replace(self.config.env, kwargs=kwargs))
        preflight(self.config, env)  # what the config names: before any model or run folder
        self.env_factory = env
        self.model = model if model is not None else build_default_model(self.config, env)
        check_learner_settings(self.config, self.model)  # settings this model cannot take
        self._state: dict | None = None  # optimizer state and counters after learn()
        # The run's folder: the latest learn()'s, or after A3C.resume the one it goes on in.
        self.run_dir: Path | None = None
        self._resume = False  # whether the next learn() goes on with the run in run_dir
        self.final_checkpoint = False  # whether the latest learn() wrote its final checkpoint
        # The returns of the last episodes of the latest learn(); empty before one.
        self.recent_returns: list[float] = []

    @property
    def counters(self) -> dict:
        """The run's counters after `learn()`: steps, episodes, updates, restarts, and
        seconds spent per part (actor_env_s, actor_policy_s, ..., summed over workers)."""
        return dict(self._state["counters"]) if self._state else {}

    @property
    def num_timesteps(self) -> int:
        return int(self.counters.get("env_steps", 0))

    def learn(self, total_timesteps: int | None = None, run_dir: str | os.PathLike | None = None,
              sink: Sink | None = None, on_start: Callable[[Path], None] | None = None) -> A3C:
        """Train for `total_timesteps` more env steps (default: the config's), in a new run
        folder (or `run_dir`). After `A3C.resume`, by default the run goes on in its own
        folder until its config's `total_timesteps`. `on_start(run_dir)` is called once the
        run folder is written, before any worker starts."""
        resume, self._resume = self._resume, False
        if total_timesteps is not None:
            more = int(total_timesteps)
        elif resume:
            more = self.config.total_timesteps - self.num_timesteps
        else:
            more = self.config.total_timesteps
        if more < 1:
            raise ValueError(f"learn({total_timesteps}): train for at least 1 more env step")
        cfg = dataclasses.replace(self.config, total_timesteps=self.num_timesteps + more)
        if self._state is not None:  # before any folder: the trained state fits this config
            check_compatible(cfg, self._state)
        if cfg.actors.mode == "ray":
            from .actors.cluster import check_cluster

            check_cluster(cfg.ray)  # Ray installed, its cluster reachable: before any folder
        probe_env(cfg, self.env_factory)  # one reset and step: an environment on gym's old API
        if run_dir is not None:
            self.run_dir = Path(run_dir)
        elif not resume:
            self.run_dir = new_run_dir(cfg)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        if on_start is not None:
            on_start(self.run_dir)
        trainer = Trainer(cfg, self.run_dir, self.model, self._state, sink, self.env_factory)
        try:
            trainer.train()
        finally:
            # Also after an interruption: the model was trained in place, so the optimizer
            # statistics and counters must follow it into the next learn().
            self._state = {"model": None, "optimizer": trainer.optimizer.state_dict(),
                           "config": config_to_dict(cfg), "counters": trainer.counters.snapshot(),
                           "proximal": trainer.proximal_state()}
            self.final_checkpoint = trainer.saved
            monitor = getattr(trainer, "monitor", None)
            self.recent_returns = list(monitor.recent_returns) if monitor else []
        return self

    def predict(self, obs, state: np.ndarray | None = None, episode_start=None, *,
                action_masks=None, deterministic: bool = True):
        """Action(s) for one observation or a batch; returns (action, state) as SB3 (and
        sb3-contrib's RecurrentPPO) does. `deterministic` is True by default, where SB3's
        is False: a trained policy is used for what it does best, as `a3c eval` plays it;
        pass False to sample from the policy, as the actors do while training.
        Observations of a Dict or Tuple space come as the environment returns them (a
        batch: each leaf stacked, as a vector environment returns them).

        A recurrent model (`model.lstm`) reads each observation from `state` (None: the
        start of an episode) and returns the state to pass with the next observation;
        `episode_start` (a bool, or one per observation) marks observations that begin a
        new episode, where the state is reset. Without a core, `state` comes back None.

        A policy trained with action masks (a3c.envs.masks) takes the environment's
        observation with `action_masks` (1 where an action is valid; a batch: one row
        per observation), as sb3-contrib's MaskablePPO does, or the masked observation
        the run's environment returns (its "action_mask" entry in place). Without
        either, every action is valid. `action_masks` and `deterministic` are keywords
        only, so that SB3's positional `deterministic` cannot be taken for a mask."""
        obs = self._masked(obs, action_masks)
        observations = getattr(self.model, "observation_space", None)
        if observations is None:  # a custom model: arrays only
            obs, single = np.asarray(obs), False
        else:
            obs, single = as_batch(obs, observations)
        obs = obs_to_torch(obs)
        if getattr(self.model, "is_recurrent", False):
            n = batch_size(obs)
            state = self.model.initial_state(n) if state is None else \
                torch.as_tensor(np.asarray(state, np.float32)).reshape(n, -1)
            starts = torch.zeros(n, dtype=torch.bool) if episode_start is None else \
                torch.as_tensor(np.asarray(episode_start, bool)).reshape(n)
            action, _, _, state = self.model.act_recurrent(obs, state, starts, deterministic)
            state = state.numpy()
        else:
            action, _, _ = self.model.act(obs, deterministic=deterministic)
            state = None
        action = action.numpy()
        if getattr(self.model, "action_space", None) is not None:
            action = env_action(action, self.model.action_space)
        return (action[0] if single else action), state

    def _masked(self, obs, action_masks):
        """`obs` as the model reads it: with its action mask where the model reads one."""
        if getattr(self.model, "mask_key", None) is None:
            if action_masks is not None:
                raise ValueError("predict: action_masks given, but this policy reads no action masks "
                                 "(its environment gives none: see env.action_mask)")
            return obs
        masked_space = self.model.observation_space
        entries = dict(obs) if isinstance(obs, Mapping) else {OBS_KEY: obs}
        if action_masks is None:
            action_masks = entries.pop(MASK_KEY, None)
        if action_masks is None:  # every action valid, for each observation
            others = gym.spaces.Dict({k: v for k, v in masked_space.spaces.items() if k != MASK_KEY})
            batch, single = as_batch(entries, others)
            size = masked_space[MASK_KEY].shape[0]
            action_masks = np.ones(size if single else (batch_size(batch), size), np.int8)
        return {**entries, MASK_KEY: flat_mask(action_masks, self.model.action_space)}

    def save(self, path: str | os.PathLike) -> None:
        state = self._state or {"optimizer": {}, "counters": {}}
        save_checkpoint(path, self.model.state_dict(), state["optimizer"],
                        config_to_dict(self.config), state["counters"], state.get("proximal"))

    @classmethod
    def load(cls, path: str | os.PathLike, model: torch.nn.Module | None = None,
             env: Callable[..., gym.Env] | None = None, best: bool = False) -> A3C:
        """Load a file written by `save`, or a run folder's checkpoint.pt (`best`: its
        best.pt, the weights of its best evaluation while training). A run trained with
        `A3C(config, env=factory)` needs the factory again: a checkpoint holds only its name."""
        path = Path(path)
        if best:
            path = existing_best(path)
        state = load_checkpoint(latest_checkpoint(path) if path.is_dir() else path)
        config = config_here(state["config"])  # trained on a GPU this host may not have
        agent = cls(config, model=model, env=env)
        load_state(state, agent.model)
        if state["optimizer"]:
            agent._state = {**state, "config": config, "model": None}
        return agent

    @classmethod
    def resume(cls, run_dir: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = (),
               model: torch.nn.Module | None = None, env: Callable[..., gym.Env] | None = None) -> A3C:
        """The run of a run folder, from its last checkpoint, to go on with: its config.yaml
        with `overrides` (`["total_timesteps=2000000"]`, or a mapping), and `learn()` then
        trains on in that folder until the config's `total_timesteps`. Refused, before
        anything is written, if the checkpoint does not fit the config, or the run has no
        budget left."""
        run_dir = Path(run_dir)
        if run_dir.is_file():  # the run's checkpoint file named in place of its folder
            if run_dir != latest_checkpoint(run_dir.parent):
                raise ConfigError([f"--resume {run_dir}: a run resumes from its folder (which holds "
                                   "config.yaml and checkpoint.pt); give the run folder"])
            run_dir = run_dir.parent
        config = load_config(run_dir / "config.yaml", overrides)
        state = load_checkpoint(latest_checkpoint(run_dir))
        check_compatible(config, state)  # before anything is built or written
        agent = cls(config, model=model, env=env)
        load_state(state, agent.model)  # settings this model cannot take were checked first
        done = int(state["counters"].get("env_steps", 0))
        if done >= config.total_timesteps:
            raise ConfigError([f"total_timesteps: the run has trained {done} env steps of its "
                               f"{config.total_timesteps}, so its budget is spent; to train on, raise "
                               f"it: a3c train --resume {run_dir} total_timesteps={2 * config.total_timesteps}"])
        agent._state = {**state, "model": None}  # the model holds its weights now
        agent.run_dir, agent._resume = run_dir, True
        return agent

