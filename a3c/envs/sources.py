"""One environment: where it comes from and the wrappers around it (`make_env`).

    env.imports          imported first (packages that register their ids on import)
    the environment      A3C(config, env=factory)   factory(**env.kwargs)
                         env.entry_point            module:callable(**env.kwargs)
                         env.id                     gymnasium.make(id, **env.kwargs); `module:EnvId`
                                                    imports the module first, as gymnasium does
    env.max_episode_steps  the time limit (gymnasium.make's own, else a TimeLimit wrapper)
    env.atari            Atari preprocessing and frame stacking
    env.wrappers         applied in order
    env.action_mask      last, masked observations (a3c.envs.masks)

a3c.envs.vector makes the vector of them an actor steps, for Atari with the ALE's own
vector env, preprocessed as make_env's are.
"""
from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import re
from collections.abc import Callable, Mapping
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ..config import EnvConfig
from ..files import excerpt
from .masks import MaskError, with_action_mask

__all__ = ["FRAME_SKIP", "NOOP_MAX", "SCREEN_SIZE", "EnvError", "check_env_factory", "env_action",
           "factory_keywords", "factory_name", "import_env_module", "import_listed_modules", "is_game",
           "load_object", "make_env", "registered_id", "wrapper_spec"]

MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
OBJECT_PATH = re.compile(rf"({MODULE.pattern}):({MODULE.pattern})")  # module:name, gymnasium's form

# Atari preprocessing, the same in both backends (env.atari_backend; the ALE's is in
# a3c.envs.vector): frames skipped per step (the last two max-pooled), the side of the
# square gray frame, and the most no-op actions at a reset (a random count, which each
# backend draws in its own way; 0: none in either, as the tests set it to compare the two
# frame by frame).
FRAME_SKIP, SCREEN_SIZE, NOOP_MAX = 4, 84, 30


class EnvError(RuntimeError):
    """The environment could not be created."""


# ------------------------------------------------------------------------------ where envs come from
_HOOKS_RUN: set[str] = set()  # gymnasium.envs hooks already run in this process


def import_env_module(name: str) -> None:
    """Import `name`, then run the `gymnasium.envs` registration hook its package declares,
    if any. gymnasium 0.x ran those hooks at start-up and 1.0 no longer does; some packages
    (MinAtar) still register their ids only that way. EnvError says what failed and the fix."""
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise EnvError(_not_found(name, error)) from None
    except Exception as error:  # a module may raise anything while it is imported
        raise EnvError(f"importing module {name!r} raised {type(error).__name__}: "
                       f"{excerpt(error)}; fix that module") from None
    top = name.partition(".")[0]
    for hook in importlib.metadata.entry_points(group="gymnasium.envs"):
        if hook.module.partition(".")[0] == top and hook.value not in _HOOKS_RUN:
            _HOOKS_RUN.add(hook.value)
            try:
                hook.load()()
            except Exception as error:  # third-party code: name it and the cause
                raise EnvError(f"the gymnasium.envs hook {hook.value} of {top} raised "
                               f"{type(error).__name__}: {excerpt(error)}") from None


def _not_found(name: str, error: ModuleNotFoundError) -> str:
    missing = error.name or name
    if missing != name and not name.startswith(missing + "."):  # a module that `name` imports
        return (f"importing module {name!r} failed: no module named {missing!r}; "
                f"pip install {missing.partition('.')[0]}")
    if "." in missing:
        return f"module {name!r} does not exist; fix the name"
    if Path(missing + ".py").is_file() or Path(missing).is_dir():
        return (f"module {name!r} cannot be imported: {missing} is in the current folder, which is "
                f"not on the module search path here; run with PYTHONPATH=.")
    return (f"module {name!r} cannot be imported: no module named {missing!r}; is it installed? "
            f"pip install {missing} (or the package that provides it), or fix the name")


def load_object(path: str) -> Any:
    """The object `module:name` names (`name` may be dotted: `module:Class.create`)."""
    match = OBJECT_PATH.fullmatch(path)
    if match is None:
        raise EnvError(f"{path!r} is not of the form module:name{_colon_hint(path)}")
    module_name, attr = match.groups()
    import_env_module(module_name)
    obj: Any = importlib.import_module(module_name)
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            where = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=1)
            hint = f"did you mean {close[0]!r}?" if close else "fix the name"
            raise EnvError(f"{where} has no attribute {part!r}; {hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvError(f"{path} is a {type(obj).__name__}, not a class or a function")
    return obj


def _colon_hint(path: str) -> str:
    """`pkg.module.Name` (RL Zoo's form) -> a suggestion of `pkg.module:Name`."""
    module, dot, name = path.rpartition(".")
    if dot and MODULE.fullmatch(module) and re.fullmatch(r"[A-Za-z_]\w*", name):
        return f"; did you mean '{module}:{name}'?"
    return "; e.g. my_pkg.envs:MyEnv"


def wrapper_spec(item: Any) -> tuple[str, dict[str, Any]]:
    """(module:Wrapper, kwargs) for one item of env.wrappers, written as RL Zoo's
    env_wrapper items are: `module:Wrapper`, or a one-key mapping `{module:Wrapper: {kwargs}}`."""
    if isinstance(item, str):
        return item, {}
    if isinstance(item, Mapping) and len(item) == 1:
        ((path, kwargs),) = item.items()
        if isinstance(path, str) and isinstance(kwargs, (Mapping, type(None))):
            return path, dict(kwargs or {})
    raise EnvError(f"{item!r} is not a wrapper; write module:Wrapper, or a mapping of one "
                   f"module:Wrapper to its keyword arguments")


def _unwrapped(env_factory: Callable) -> tuple[Callable, dict[str, Any]]:
    """(the function a functools.partial wraps, the keyword arguments it binds, nested
    partials' merged); a factory that is no partial, with none."""
    keywords: dict[str, Any] = {}
    while isinstance(env_factory, functools.partial):
        keywords = {**env_factory.keywords, **keywords}
        env_factory = env_factory.func
    return env_factory, keywords


def factory_keywords(env_factory: Callable) -> dict[str, Any]:
    """The keyword arguments a functools.partial binds, which a run's config records in
    env.kwargs: called with them, the function the partial wraps makes the same
    environment, so the command line can make it from `module:name` alone."""
    return _unwrapped(env_factory)[1]


def factory_name(env_factory: Callable) -> str:
    """`module:qualname` of a factory (of the function a functools.partial wraps)."""
    function = _unwrapped(env_factory)[0]
    named = function if hasattr(function, "__qualname__") else type(function)
    return f"{getattr(named, '__module__', None) or '?'}:{named.__qualname__}"


def check_env_factory(env_factory: Callable | None, actors_mode: str) -> None:
    """Actor processes restarted from the fork server receive the factory pickled: a
    factory that cannot be pickled would only fail at the first restart, so say so now."""
    if env_factory is None or actors_mode != "process":
        return
    try:
        ForkingPickler.dumps(env_factory)
    except Exception as error:  # PicklingError, AttributeError, TypeError: all mean the same
        name = factory_name(env_factory)
        what = ("a lambda" if "<lambda>" in name else "a local function" if "<locals>" in name
                else f"not picklable ({type(error).__name__}: {excerpt(error, 120)})")
        raise EnvError(
            f"env: the factory {name} is {what}, and actor processes receive it pickled; define it "
            f"at module level (functools.partial binds arguments), or set actors.mode=thread"
        ) from None


# ------------------------------------------------------------------------------------ making one
def make_env(cfg: EnvConfig, render_mode: str | None = None,
             env_factory: Callable | None = None) -> gym.Env:
    """Create one environment from the config's source (or `env_factory`), with its time
    limit, Atari preprocessing, frame stacking and wrappers."""
    if cfg.multiagent:  # a3c.envs.multiagent makes those
        raise EnvError("env.multiagent: a game of several agents is not a gymnasium environment, and this "
                       "plays one (a3c eval and --video do); evaluate it with selfplay.eval_games")
    import_listed_modules(cfg)
    if env_factory is not None or cfg.factory is not None:
        if env_factory is None:
            raise EnvError(
                f"env.factory: this run's environment came from the Python callable {cfg.factory} "
                f"(A3C(config, env=...)), which a config cannot hold; pass it again: "
                f"A3C.load(path, env=...), or on the command line --env {cfg.factory}, or describe "
                f"the environment with env.entry_point")
        env = _call(f"env factory {factory_name(env_factory)}", env_factory, cfg, render_mode)
    elif cfg.entry_point is not None:
        entry_point = _named("env.entry_point", load_object, cfg.entry_point)
        env = _call(f"env.entry_point {cfg.entry_point!r}", entry_point, cfg, render_mode)
    else:
        env = _make_registered(cfg, render_mode)
    try:
        if cfg.atari:
            # 84x84 grayscale, 4-frame skip with max-pooling, up to NOOP_MAX no-ops at reset;
            # zero frames before the first, as the ALE backend stacks them.
            env = gym.wrappers.AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP,
                                                  screen_size=SCREEN_SIZE)
            env = gym.wrappers.FrameStackObservation(env, cfg.frame_stack, padding_type="zero")
    except Exception as error:  # gymnasium raises many kinds; name the env and the cause
        raise EnvError(f"env.atari with env.id {cfg.id!r}: {error}") from error
    for i, item in enumerate(cfg.wrappers):
        path, kwargs = _named(f"env.wrappers[{i}]", wrapper_spec, item)
        wrapper = _named(f"env.wrappers[{i}]", load_object, path)
        env = _checked(f"env.wrappers[{i}] {path!r}", lambda: wrapper(env, **kwargs), kwargs)
    try:  # last: the masked observation is what the model and the fragments see
        return with_action_mask(env, cfg.action_mask, lambda: f"env.id {cfg.id!r}")
    except MaskError as error:
        raise EnvError(str(error)) from None


def import_listed_modules(cfg: EnvConfig) -> None:
    """Import env.imports in order, an EnvError naming the item that failed."""
    for i, name in enumerate(cfg.imports):
        _named(f"env.imports[{i}]", import_env_module, name)


def _named(key: str, resolve: Callable, arg: Any) -> Any:
    """resolve(arg), with the config key that holds `arg` in front of any EnvError."""
    try:
        return resolve(arg)
    except EnvError as error:
        raise EnvError(f"{key}: {error}") from None


def registered_id(cfg: EnvConfig) -> str:
    """The id in gymnasium's registry of env.id (`module:EnvId` -> `EnvId`), its module
    imported and ALE ids registered."""
    module, colon, name = cfg.id.rpartition(":")
    if colon:  # gymnasium's module:EnvId; imported here too, so that its hooks run
        _named("env.id", import_env_module, module)
    if name.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
    return name


def _make_registered(cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    registered_id(cfg)
    kwargs = dict(cfg.kwargs, **_render_mode(render_mode))
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    return _checked(f"env.id {cfg.id!r}", lambda: gym.make(cfg.id, **kwargs), cfg.kwargs)


def _render_mode(render_mode: str | None) -> dict[str, str]:
    """The render_mode keyword, only when a mode is asked for: gymnasium.make passes
    every keyword it is given to the constructor, and many environments written by users
    take no render_mode argument."""
    return {} if render_mode is None else {"render_mode": render_mode}


def _call(what: str, make: Callable, cfg: EnvConfig, render_mode: str | None) -> gym.Env:
    """make(**env.kwargs) (plus render_mode when one is asked for), within the time limit."""
    kwargs = dict(cfg.kwargs, **_render_mode(render_mode))
    env = _checked(what, lambda: make(**kwargs), cfg.kwargs)
    if cfg.max_episode_steps is not None:
        env = gym.wrappers.TimeLimit(env, cfg.max_episode_steps)
    return env


def _checked(what: str, make: Callable[[], Any], kwargs: Mapping[str, Any]) -> gym.Env:
    try:
        env = make()
    except Exception as error:  # a constructor may raise anything; name it and the cause
        raise EnvError(f"{what} with kwargs {dict(kwargs)}: {type(error).__name__}: {error}") from error
    if not isinstance(env, gym.Env):
        fix = ("it is a PettingZoo environment: set env.multiagent: true" if is_game(env) else
               "subclass gymnasium.Env (or gymnasium.Wrapper)")
        raise EnvError(f"{what} returned a {type(env).__name__}, not a gymnasium.Env; {fix}")
    return env


def is_game(obj: Any) -> bool:
    """Whether `obj` is a PettingZoo environment (AEC or Parallel): a3c.envs.multiagent's."""
    try:
        from pettingzoo import AECEnv, ParallelEnv
    except ImportError:
        return False
    return isinstance(obj, (AECEnv, ParallelEnv))


def env_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """An action the environment accepts: Gaussian samples are unbounded, so clip them to
    a Box space; indices from 0 (the model's) are shifted to a Discrete or MultiDiscrete
    space's `start`; other actions pass through."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(space.start):
        return action + space.start
    return action
