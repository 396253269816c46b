"""The Python API, in the shape Stable-Baselines3 users know.

    model = A3C("configs/cartpole.yaml", actors__num=4).learn(200_000)
    action, _ = model.predict(obs, deterministic=True)
    model.save("cartpole.pt"); model = A3C.load("cartpole.pt")
    model = A3C({"env": {"id": "Corridor"}}, env=make_corridor).learn()   # your own environment
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import Config, config_here, config_to_dict, load_config, save_config
from .envs import check_env_factory, env_action, factory_name, make_env
from .metrics import Sink
from .spaces import as_batch, batch_size, obs_to_torch
from .runner import Trainer, build_default_model, check_compatible, check_learner_settings, load_state

__all__ = ["A3C", "evaluate", "new_run_dir"]


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

    `config` is a path to a YAML file, a dict or a `Config`; keyword overrides use `__`
    for the dots (`optim__lr=3e-4` sets `optim.lr`). `model` replaces the default
    network with any `torch.nn.Module` that has the interface of `a3c.model.ActorCritic`.

    `env` is a callable returning a `gymnasium.Env` (a class, a module-level function, a
    `functools.partial` of one), called with `env.kwargs`. It makes every environment of
    the run (actors, the model's probe, `evaluate(..., env=agent.env_factory)`) in place of
    `env.id` and `env.entry_point`, which then only name the environment;
    `env.max_episode_steps`, `env.atari` and `env.wrappers` still apply to what it returns.
    With actor processes it must pickle. A config cannot hold it: the run's config records
    its name as `env.factory`, and `A3C.load` of such a run needs `env=` again.
    """

    def __init__(self, config: str | os.PathLike | dict | Config = "configs/cartpole.yaml",
                 model: torch.nn.Module | None = None, env: Callable[..., gym.Env] | None = None,
                 **overrides):
        items = {k.replace("__", "."): v for k, v in overrides.items()}
        if env is not None:
            items["env.factory"] = factory_name(env)
        self.config = load_config(config, items)
        check_env_factory(env, self.config.actors.mode)  # before any run folder
        self.env_factory = env
        self.model = model if model is not None else build_default_model(self.config, env)
        check_learner_settings(self.config, self.model)  # settings this model cannot take
        self._state: dict | None = None  # optimizer state and counters after learn()
        self.run_dir: Path | None = None
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
              sink: Sink | None = None) -> A3C:
        """Train for `total_timesteps` more env steps (default: the config's)."""
        more = int(total_timesteps if total_timesteps is not None else self.config.total_timesteps)
        if more < 1:
            raise ValueError(f"learn({total_timesteps}): train for at least 1 more env step")
        cfg = dataclasses.replace(self.config, total_timesteps=self.num_timesteps + more)
        if self._state is not None:  # before any folder: the trained state fits this config
            check_compatible(cfg, self._state)
        if cfg.actors.mode == "ray":
            from .remote import check_cluster

            check_cluster(cfg.ray)  # Ray installed, its cluster reachable: before any folder
        self.run_dir = Path(run_dir) if run_dir is not None else new_run_dir(cfg)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, self.run_dir / "config.yaml")
        trainer = Trainer(cfg, self.run_dir, self.model, self._state, sink, self.env_factory)
        try:
            trainer.train()
        finally:
            # Also after an interruption: the model was trained in place, so the optimizer
            # statistics and counters must follow it into the next learn().
            self._state = {"model": None, "optimizer": trainer.optimizer.state_dict(),
                           "config": config_to_dict(cfg), "counters": trainer.counters.snapshot(),
                           "proximal": trainer.proximal_state()}
            monitor = getattr(trainer, "monitor", None)
            self.recent_returns = list(monitor.recent_returns) if monitor else []
        return self

    def predict(self, obs, state: np.ndarray | None = None, episode_start=None,
                deterministic: bool = True):
        """Action(s) for one observation or a batch; returns (action, state) as SB3 (and
        sb3-contrib's RecurrentPPO) does. Observations of a Dict or Tuple space come as
        the environment returns them (a batch: each leaf stacked, as a vector environment
        returns them).

        A recurrent model (`model.lstm`) reads each observation from `state` (None: the
        start of an episode) and returns the state to pass with the next observation;
        `episode_start` (a bool, or one per observation) marks observations that begin a
        new episode, where the state is reset. Without a core, `state` comes back None."""
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

    def save(self, path: str | os.PathLike) -> None:
        state = self._state or {"optimizer": {}, "counters": {}}
        save_checkpoint(path, self.model.state_dict(), state["optimizer"],
                        config_to_dict(self.config), state["counters"], state.get("proximal"))

    @classmethod
    def load(cls, path: str | os.PathLike, model: torch.nn.Module | None = None,
             env: Callable[..., gym.Env] | None = None) -> A3C:
        """Load a file written by `save`, or a run folder's checkpoint.pt. A run trained with
        `A3C(config, env=factory)` needs the factory again: a checkpoint holds only its name."""
        path = Path(path)
        state = load_checkpoint(latest_checkpoint(path) if path.is_dir() else path)
        config = config_here(state["config"])  # trained on a GPU this host may not have
        agent = cls(config, model=model, env=env)
        load_state(state, agent.model)
        if state["optimizer"]:
            agent._state = {**state, "config": config, "model": None}
        return agent


def evaluate(model: torch.nn.Module, cfg: Config, episodes: int, seed: int = 0,
             deterministic: bool = True, env: Callable[..., gym.Env] | None = None) -> np.ndarray:
    """Returns of `episodes` episodes played by the greedy (or sampled) policy, in the
    config's environment or the one `env` makes (an agent's `env_factory`)."""
    made = make_env(cfg.env, env_factory=env)
    try:
        return play(model, made, episodes, seed, deterministic)
    finally:
        made.close()


def play(model: torch.nn.Module, env: gym.Env, episodes: int, seed: int = 0,
         deterministic: bool = True, on_state: Callable[[gym.Env], None] | None = None) -> np.ndarray:
    """The episode loop of `evaluate` (and of `a3c.video`): returns of `episodes` episodes,
    the i-th reset with `seed + i`. `on_state(env)` is called after every reset and every
    step, e.g. to render a frame."""
    returns = []
    recurrent = getattr(model, "is_recurrent", False)
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        state = model.initial_state(1) if recurrent else None  # carried through the episode
        no_start = torch.zeros(1, dtype=torch.bool)
        if on_state is not None:
            on_state(env)
        while not done:
            batch = obs_to_torch(as_batch(obs, env.observation_space)[0])
            if recurrent:
                action, _, _, state = model.act_recurrent(batch, state, no_start, deterministic)
            else:
                action, _, _ = model.act(batch, deterministic)
            action = action.numpy()[0]
            obs, reward, terminated, truncated, _ = env.step(env_action(action, env.action_space))
            total += float(reward)
            done = terminated or truncated
            if on_state is not None:
                on_state(env)
        returns.append(total)
    return np.asarray(returns)
