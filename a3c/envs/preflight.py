"""The checks a run makes once, before any run folder is written, of what a config names
outside itself: the environment's modules, entry point, wrappers and id (imported and
looked up, so that a typo is reported with the rest and not by every actor), the ALE's
vector env where env.atari_backend asks for it, the learner device, and the queue's room
for the local actors; and, as a run starts, one environment made and stepped once
(`probe_env`), so that one on gymnasium's old API is named in one line, not by every
actor in turn. `a3c.config` checks only the config's own values and imports none of
these.

Every problem is collected and raised as one ConfigError, as the config's own are."""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from ..config import Config, ConfigError, EnvConfig
from ..files import excerpt
from .masks import MASK_KEY, MaskError, has_mask_entry, random_action
from .multiagent import probe_game
from .sources import MODULE, EnvError, check_env_factory, import_env_module, load_object, make_env, wrapper_spec
from .vector import ale_missing

__all__ = ["device_available", "device_problems", "preflight", "probe", "probe_env"]


def preflight(cfg: Config, env_factory: Callable | None = None) -> None:
    """Raise one ConfigError listing every problem of the config's environment, device and
    queue; an EnvError when `env_factory` cannot reach the actors it would have to."""
    problems: list[str] = []
    _check_env(cfg.env, problems)
    problems += device_problems(cfg.learners.device)
    problems += device_problems(cfg.actors.device, "actors.device")
    problems += _producer_problems(cfg)
    if problems:
        raise ConfigError(problems)
    check_env_factory(env_factory, cfg.actors.mode)


def probe_env(cfg: Config, env_factory: Callable | None = None) -> None:
    """One environment of the run, made, reset and stepped once as a run starts (after the
    model is built from its spaces, whose problems come first), or an EnvError saying in
    one line what it returned that gymnasium's API (0.26 and later) does not."""
    if cfg.env.multiagent:  # a PettingZoo game: its own probe
        return probe_game(cfg, env_factory)
    env = make_env(cfg.env, env_factory=env_factory)
    try:
        probe(env, f"env.id {cfg.env.id!r}", unread_masks=cfg.env.action_mask == "auto")
    finally:
        env.close()


def probe(env: gym.Env, what: str, unread_masks: bool = False) -> None:
    """One reset and one step of `env`, or an EnvError naming what it returned that
    gymnasium's API does not: reset gives (observation, info), step gives (observation,
    reward, terminated, truncated, info). `unread_masks`: also an EnvError when reset's
    info holds an action mask that nothing reads (env.action_mask auto finds masks in the
    observation space or a method, before any reset)."""
    old_api = ("; an environment written for gym < 0.26 runs in gymnasium through shimmy's "
               "GymV21CompatibilityV0 (or GymV26CompatibilityV0) wrapper")
    try:
        reset = env.reset(seed=0)
    except MaskError as error:  # the environment's masks, not its API
        raise EnvError(f"{what}: {error}") from None
    except Exception as error:  # a user's reset may raise anything, gymnasium's checker too
        raise EnvError(f"{what}: reset(seed=0) raised {type(error).__name__}: {excerpt(error)}"
                       f"{old_api}") from None
    if not (isinstance(reset, tuple) and len(reset) == 2 and isinstance(reset[1], dict)):
        raise EnvError(f"{what}: reset() returned {_shape_of(reset)}, where gymnasium's API returns "
                       f"(observation, info){old_api}")
    if unread_masks and MASK_KEY in reset[1] and not has_mask_entry(env.observation_space):
        raise EnvError(f"{what}: reset's info holds an 'action_mask', which env.action_mask: auto does not "
                       f"read (it looks before any reset); set env.action_mask: info to use it, or none")
    try:
        mask = reset[0][MASK_KEY] if has_mask_entry(env.observation_space) else None
        step = env.step(random_action(env.action_space, mask))
    except MaskError as error:
        raise EnvError(f"{what}: {error}") from None
    except Exception as error:
        raise EnvError(f"{what}: step() raised {type(error).__name__}: {excerpt(error)}{old_api}") from None
    if not (isinstance(step, tuple) and len(step) == 5):
        raise EnvError(f"{what}: step() returned {_shape_of(step)}, where gymnasium's API returns "
                       f"(observation, reward, terminated, truncated, info){old_api}")


def _shape_of(value: Any) -> str:
    return f"a tuple of {len(value)}" if isinstance(value, tuple) else f"a {type(value).__name__}"


def _check_env(env: EnvConfig, problems: list[str]) -> None:
    """Where the environment comes from: the modules to import, the entry point, the
    wrappers and the id, each imported and looked up now, so that a typo is reported with
    the rest and not by every actor."""
    def resolves(key: str, resolve: Any, arg: Any) -> bool:
        try:
            resolve(arg)
            return True
        except EnvError as error:
            problems.append(f"{key}: {error}")
            return False

    # Imports first: they may register env.id.
    for i, name in enumerate(env.imports):
        if not MODULE.fullmatch(name):
            problems.append(f"env.imports[{i}]: {name!r} is not a module name; use a dotted name "
                            f"such as minatar or my_pkg.envs")
        else:
            resolves(f"env.imports[{i}]", import_env_module, name)
    if env.entry_point is not None:
        resolves("env.entry_point", load_object, env.entry_point)
    for i, item in enumerate(env.wrappers):
        try:
            path, _ = wrapper_spec(item)
        except EnvError as error:
            problems.append(f"env.wrappers[{i}]: {error}")
            continue
        resolves(f"env.wrappers[{i}]", load_object, path)
    if env.atari and env.atari_backend == "ale":  # auto takes gymnasium where the ALE's is missing
        missing = ale_missing()
        if missing is not None:
            problems.append(missing)
    if env.entry_point is None and env.factory is None:
        _check_env_id(env, problems, resolves)


def _check_env_id(env: EnvConfig, problems: list[str], resolves: Any) -> None:
    module, colon, name = env.id.rpartition(":")
    if colon and not (MODULE.fullmatch(module) and name):
        problems.append(f"env.id: {env.id!r} is not an id or module:EnvId (e.g. my_pkg.envs:MyEnv-v0)")
        return
    if colon and not resolves("env.id", import_env_module, module):
        return
    if name.startswith("ALE/"):
        try:
            import ale_py
        except ImportError:
            if not (env.atari and env.atari_backend == "ale"):  # else said once, naming the extra
                problems.append(f"env.id: {env.id!r} needs ale-py, which is not installed; pip install ale-py")
            return
        gym.register_envs(ale_py)
    registry = gym.envs.registry
    if name not in registry:
        close = [f"{module}{colon}{match}" for match in difflib.get_close_matches(name, list(registry), n=3)]
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else \
            f"module {module!r} registers no such id" if colon else "see gymnasium.envs.registry"
        if not colon:
            hint += "; a package that registers it on import goes in env.imports"
        problems.append(f"env.id: {env.id!r} is not a registered gymnasium environment; {hint}")
    elif env.atari and {**registry[name].kwargs, **env.kwargs}.get("frameskip", 1) != 1:
        skip = {**registry[name].kwargs, **env.kwargs}["frameskip"]
        problems.append(f"env.kwargs.frameskip: {skip!r} is not allowed with env.atari true; use 1 "
                        f"(the Atari preprocessing skips frames itself)")


def device_problems(device: str, key: str = "learners.device") -> list[str]:
    """Why this host cannot run `key` (a learner's or the actors' device) on `device` (its
    form is the config's to check)."""
    if not device.startswith("cuda"):
        return []
    import torch

    index = re.fullmatch(r"cuda(?::(\d+))?", device).group(1)
    if not torch.cuda.is_available():
        return [f"{key}: {device!r} but CUDA is not available; use cpu"]
    if index and int(index) >= torch.cuda.device_count():
        return [f"{key}: {device!r} but only {torch.cuda.device_count()} CUDA device(s) are "
                f"visible; allowed: cuda:0 .. cuda:{torch.cuda.device_count() - 1}"]
    return []


def device_available(device: str) -> bool:
    return not device_problems(device)


def _producer_problems(cfg: Config) -> list[str]:
    """Every local actor puts into one queue, which registers a bounded number of putting
    threads at once (native/rq.h); remote actors put through one thread of the trainer's."""
    if cfg.actors.mode == "ray":
        return []
    from replay.queue import MAX_PRODUCERS  # the compiled queue: only where a run is checked

    if cfg.actors.num <= MAX_PRODUCERS:
        return []
    return [f"actors.num: {cfg.actors.num} local actors each put into one queue, which takes "
            f"{MAX_PRODUCERS} at once; use at most {MAX_PRODUCERS}, or actors.mode: ray "
            f"(one thread puts for every remote actor)"]
