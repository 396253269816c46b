"""Several agents: PettingZoo environments (`env.multiagent: true`), each seen as the
turns of its agents.

A game is a PettingZoo `AECEnv` (turn-based: one agent acts at a time) or `ParallelEnv`
(every live agent acts at each step), made by `env.entry_point` or A3C's `env=` factory
with `env.kwargs`, then wrapped by `env.wrappers` (PettingZoo wrappers, SuperSuit's for
instance). `Game` gives both APIs one shape: `reset` and `step` return *turns*, one per
agent whose turn has come or whose episode has ended, each with the reward the agent
collected since its last action, so that every agent's steps form a trajectory of their
own (a3c.actors.agents). One policy acts for every agent, so every agent must have the
same observation and action spaces.

Action masks come as PettingZoo Classic gives them: the observation's "action_mask"
entry (`env.action_mask` auto or observation), or the agent's info["action_mask"]
(`env.action_mask: info`). Observations are then masked observations (a3c.envs.masks).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from ..config import Config, EnvConfig
from .masks import MASK_KEY, OBS_KEY, MaskError, flat_mask, has_mask_entry, masked_space, random_action
from .sources import (EnvError, _named, env_action, factory_name, import_listed_modules, is_game, load_object,
                      make_env, wrapper_spec)

__all__ = ["Game", "Spaces", "Turn", "make_game", "probe_game", "run_spaces", "unmasked"]

INSTALL = "pip install 'a3c-replay[multiagent]'"


class Turn(NamedTuple):
    """One agent's turn, or the end of its episode."""
    agent: int  # index in Game.agents
    obs: Any  # the observation as the game gives it, a masked observation where it has masks
    reward: float  # collected since the agent's last action (its first turn: since the reset)
    terminated: bool
    truncated: bool


class Game:
    """A PettingZoo environment as turns. `agents` are its possible agents, in its order;
    `observation_space` and `action_space` are every agent's (masked observations where
    `action_mask` finds masks). `reset` and `step` return the turns that follow: in an AEC
    game, those of the agents whose episodes ended (in the order the game visits them) and
    then of the one agent to act; in a Parallel game, every agent's of the step. An agent
    whose turn is not an end acts in the next `step`. `over` once no agent is left."""

    def __init__(self, env: Any, action_mask: str = "auto"):
        from pettingzoo import ParallelEnv

        self.env, self.parallel = env, isinstance(env, ParallelEnv)
        self.agents = list(env.possible_agents)
        self._index = {agent: i for i, agent in enumerate(self.agents)}
        observations, self.action_space = shared_spaces(env, self.agents)
        self._mask = _mask_source(observations, action_mask)
        self._own_dict = isinstance(observations, gym.spaces.Dict)
        self.observation_space = observations if self._mask is None else \
            masked_space(observations, self.action_space)
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self._start = int(self.action_space.start) if discrete else None  # an index from 0 -> the game's

    @property
    def over(self) -> bool:
        return not self.env.agents

    def reset(self, seed: int | None = None) -> list[Turn]:
        if self.parallel:
            obs, infos = self.env.reset(seed=seed)
            return [Turn(self._index[a], self._observe(o, infos.get(a, {})), 0.0, False, False)
                    for a, o in obs.items()]
        self.env.reset(seed=seed)
        return self._advance()

    def step(self, actions: dict[int, np.ndarray]) -> list[Turn]:
        """Step with `actions`, by agent index, for the agents whose turn it is."""
        if self.parallel:
            obs, rewards, terminated, truncated, infos = self.env.step(
                {self.agents[i]: self._action(a) for i, a in actions.items()})
            return [Turn(self._index[a], self._observe(o, infos.get(a, {})), float(rewards.get(a, 0.0)),
                         bool(terminated.get(a, False)), bool(truncated.get(a, False)))
                    for a, o in obs.items()]
        self.env.step(self._action(actions[self._index[self.env.agent_selection]]))
        return self._advance()

    def _advance(self) -> list[Turn]:
        """The AEC game's turns up to the next agent to act: an agent whose episode has
        ended is stepped with None, as PettingZoo's API asks."""
        turns = []
        while self.env.agents:
            agent = self.env.agent_selection
            obs, reward, terminated, truncated, info = self.env.last()
            turns.append(Turn(self._index[agent], self._observe(obs, info), float(reward),
                              bool(terminated), bool(truncated)))
            if not (terminated or truncated):
                break
            self.env.step(None)
        return turns

    def _observe(self, obs: Any, info: dict) -> Any:
        if self._mask is not None:
            mask = obs[MASK_KEY] if self._mask == "observation" else info.get(MASK_KEY)
            if mask is None:
                raise EnvError(f"env.action_mask: info, but an agent's info has no 'action_mask' ({sorted(info)})")
            entries = {k: v for k, v in obs.items() if k != MASK_KEY} if self._own_dict else {OBS_KEY: obs}
            obs = {**entries, MASK_KEY: flat_mask(mask, self.action_space)}
        return obs

    def _action(self, action: np.ndarray) -> Any:
        """The model's action as the game takes it (a Discrete one as an int)."""
        if self._start is not None:  # env_action's shift, without its checks: once per move
            return int(action) + self._start
        return env_action(action, self.action_space)

    def close(self) -> None:
        self.env.close()


def unmasked(obs: Any) -> tuple[Any, np.ndarray | None]:
    """(the observation without its mask, the flat mask or None) of a turn's observation:
    what a fixed opponent's function reads (a3c.selfplay)."""
    if not (isinstance(obs, dict) and MASK_KEY in obs):
        return obs, None
    rest = {k: v for k, v in obs.items() if k != MASK_KEY}
    return (rest[OBS_KEY] if list(rest) == [OBS_KEY] else rest), obs[MASK_KEY]


def shared_spaces(env: Any, agents: Sequence[str]) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces every agent shares, or an EnvError naming two
    agents whose spaces differ."""
    if not agents:
        raise EnvError("env: the PettingZoo environment has no possible_agents")
    first = agents[0]
    obs, act = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        other_obs, other_act = env.observation_space(agent), env.action_space(agent)
        if other_obs != obs or other_act != act:
            what = (f"observations {obs} and {other_obs}" if other_obs != obs else
                    f"actions {act} and {other_act}")
            raise EnvError(f"env: one policy acts for every agent, and agents {first!r} and {agent!r} "
                           f"have different spaces ({what}); give them one space, e.g. with SuperSuit's "
                           f"pad_observations_v0 and pad_action_space_v0 in env.wrappers")
    return obs, act


def _mask_source(space: gym.Space, setting: str) -> str | None:
    """Where the agents' masks come from under `env.action_mask` (None: no masks)."""
    has_entry = has_mask_entry(space)
    if setting == "auto":
        return "observation" if has_entry else None
    if setting == "observation" and not has_entry:
        raise EnvError(f"env.action_mask: observation, but the agents' observation space has no "
                       f"'action_mask' entry ({space}); use info, auto or none")
    if setting == "method":
        raise EnvError("env.action_mask: method reads a gymnasium environment's action_masks(); a "
                       "PettingZoo agent's mask comes in its observation or info: use auto or info")
    return None if setting == "none" else setting


# ------------------------------------------------------------------------------------ making one
def make_game(cfg: EnvConfig, env_factory: Callable | None = None) -> Game:
    """One game from the config's entry point (or `env_factory`), called with env.kwargs,
    then env.wrappers."""
    import_listed_modules(cfg)
    kwargs = dict(cfg.kwargs)
    if env_factory is not None:
        what, make = f"env factory {factory_name(env_factory)}", env_factory
    elif cfg.factory is not None:
        raise EnvError(f"env.factory: this run's game came from the Python callable {cfg.factory}, which a "
                       f"config cannot hold; pass it again: A3C.load(path, env=...)")
    elif cfg.entry_point is not None:
        what, make = f"env.entry_point {cfg.entry_point!r}", _named("env.entry_point", load_object, cfg.entry_point)
    else:
        raise EnvError("env.multiagent: true needs env.entry_point (module:callable returning a PettingZoo "
                       "environment) or A3C(config, env=factory)")
    env = _made(what, lambda: make(**kwargs), kwargs)
    for i, item in enumerate(cfg.wrappers):
        path, wrapper_kwargs = _named(f"env.wrappers[{i}]", wrapper_spec, item)
        wrapper = _named(f"env.wrappers[{i}]", load_object, path)
        env = _made(f"env.wrappers[{i}] {path!r}", lambda: wrapper(env, **wrapper_kwargs), wrapper_kwargs)
    try:
        return Game(env, cfg.action_mask)
    except MaskError as error:
        raise EnvError(f"env.id {cfg.id!r}: {error}") from None


def _made(what: str, make: Callable[[], Any], kwargs: dict) -> Any:
    try:
        env = make()
    except Exception as error:  # a constructor may raise anything; name it and the cause
        raise EnvError(f"{what} with kwargs {dict(kwargs)}: {type(error).__name__}: {error}") from error
    if not is_game(env):
        try:
            import pettingzoo  # noqa: F401
        except ImportError:
            raise EnvError(f"env.multiagent: true needs PettingZoo, which is not installed; {INSTALL}") from None
        hint = ("; set env.multiagent: false for a gymnasium environment" if isinstance(env, gym.Env)
                else "")
        raise EnvError(f"{what} returned a {type(env).__name__}, not a PettingZoo AECEnv or ParallelEnv "
                       f"(env.multiagent is true){hint}")
    return env


class Spaces(NamedTuple):
    """What the model and the fragments are made for."""
    observation: gym.Space
    action: gym.Space
    agents: tuple[str, ...]  # a game's agents (env.multiagent), else ()


def run_spaces(cfg: EnvConfig, env_factory: Callable | None = None) -> Spaces:
    """The observation and action spaces of the run's environment, or with env.multiagent
    those every agent of its game shares, and the game's agents."""
    if cfg.multiagent:
        game = make_game(cfg, env_factory)
        try:
            return Spaces(game.observation_space, game.action_space, tuple(game.agents))
        finally:
            game.close()
    env = make_env(cfg, env_factory=env_factory)
    try:
        return Spaces(env.observation_space, env.action_space, ())
    finally:
        env.close()


def probe_game(cfg: Config, env_factory: Callable | None = None) -> None:
    """One game of the run, reset and stepped once with random (valid) actions, and the
    evaluator's opponent looked up: as a run starts, so that a problem is said in one
    line, not by every actor."""
    if cfg.selfplay.eval_games and cfg.selfplay.eval_opponent != "random":
        _named("selfplay.eval_opponent", load_object, cfg.selfplay.eval_opponent)
    game = make_game(cfg.env, env_factory)
    stage = "reset(seed=0)"
    try:
        turns = game.reset(seed=0)
        stage = "step()"
        game.step({t.agent: np.asarray(random_action(game.action_space, unmasked(t.obs)[1]))
                   for t in turns if not (t.terminated or t.truncated)})
    except EnvError:
        raise
    except Exception as error:  # a user's game may raise anything
        raise EnvError(f"env.id {cfg.env.id!r}: {stage} raised {type(error).__name__}: {error}") from None
    finally:
        game.close()


