"""Environments: where one comes from, the wrappers around it, and the vector of them an
actor steps.

    env.imports          imported first (packages that register their ids on import)
    the environment      A3C(config, env=factory)   factory(**env.kwargs)
                         env.entry_point            module:callable(**env.kwargs)
                         env.id                     gymnasium.make(id, **env.kwargs); `module:EnvId`
                                                    imports the module first, as gymnasium does
    env.max_episode_steps  the time limit (gymnasium.make's own, else a TimeLimit wrapper)
    env.atari            Atari preprocessing and frame stacking
    env.wrappers         applied in order
    env.action_mask      last, masked observations (a3c.envs.masks)

An actor steps a vector of environments (`make_vector_env`): gymnasium's SyncVectorEnv of
the above, or, for Atari (`env.atari_backend`, resolved by `atari_backend`), one of
ale_py's AtariVectorEnv, which emulates and preprocesses its environments in C++ threads.
The two give the same frames: 84x84 gray, 4 frames skipped with the last two max-pooled,
up to NOOP_MAX no-ops at reset, `env.frame_stack` frames stacked oldest first with zero
frames before the first; rewards unclipped; no FIRE at reset, no end at a lost life. An
AtariVectorEnv takes an ALE/ id's ROM and its spec's kwargs (sticky actions, action set,
frame limit) merged with env.kwargs; what it cannot make (wrappers, an entry point, a
time limit) stays with gymnasium (`a3c.config.rules.ale_obstacle` says why).
"""
from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import inspect
import os
import re
from collections.abc import Callable, Mapping
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from ..config import EnvConfig
from ..config.rules import ale_obstacle
from ..files import excerpt
from .masks import MaskError, with_action_mask

__all__ = ["NOOP_MAX", "EnvError", "ale_missing", "ale_vector_env", "atari_backend", "check_env_factory",
           "env_action", "factory_keywords", "factory_name", "import_env_module", "import_listed_modules", "is_game",
           "load_object", "make_env", "make_vector_env", "wrapper_spec"]

MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
OBJECT_PATH = re.compile(rf"({MODULE.pattern}):({MODULE.pattern})")  # module:name, gymnasium's form

# Atari preprocessing, the same in both backends (env.atari_backend): frames skipped per
# step (the last two max-pooled), the side of the square gray frame, and the most no-op
# actions at a reset (a random count, which each backend draws in its own way; 0: none in
# either, as the tests set it to compare the two frame by frame).
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


def _registered(cfg: EnvConfig) -> str:
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
    _registered(cfg)
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


def make_vector_env(cfg: EnvConfig, num_envs: int, env_factory: Callable | None = None
                    ) -> gym.vector.VectorEnv:
    """`num_envs` copies stepped in this process. SAME_STEP autoreset returns the reset
    observation at once and the final one in `info["final_obs"]`, so a fragment never
    holds a dummy step and a truncated episode can bootstrap from its final observation.
    For Atari, one AtariVectorEnv where `atari_backend` says ale; close it (the caller
    does, in a finally) to end its threads."""
    if env_factory is None and atari_backend(cfg) == "ale":
        return _make_ale_vector_env(cfg, num_envs)
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(cfg, env_factory=env_factory) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


# ----------------------------------------------------------------------- the ALE's vector env
_EXTRA = '"a3c-replay[atari]" (from a clone: pip install {}-e ".[atari]")'


def atari_backend(cfg: EnvConfig) -> str:
    """What steps an actor's environments, "ale" or "gymnasium" (env.atari_backend): auto
    is ale where nothing in the config keeps the ALE from making them (`ale_obstacle`)
    and the installed ale-py has its vector env. An explicit ale that cannot be honoured
    is an EnvError (the config's checks report it first, in the same words)."""
    if not cfg.atari or cfg.atari_backend == "gymnasium":
        return "gymnasium"
    obstacle = ale_obstacle(cfg)
    if cfg.atari_backend == "ale":
        if obstacle is not None:
            raise EnvError(f"env.atari_backend: ale {obstacle}")
        return "ale"
    return "ale" if obstacle is None and ale_vector_env() is not None else "gymnasium"


def ale_vector_env() -> type | None:
    """ale_py's AtariVectorEnv, if the installed ale-py has one that autoresets in the same
    step (a3c.actors.loop needs `final_obs`); else None."""
    try:
        from ale_py.vector_env import AtariVectorEnv
    except ImportError:
        return None
    return AtariVectorEnv if "autoreset_mode" in inspect.signature(AtariVectorEnv).parameters else None


def ale_missing() -> str | None:
    """Why env.atari_backend: ale cannot run here, in one line naming what to install; None
    where it can."""
    if ale_vector_env() is not None:
        return None
    try:
        import ale_py
    except ImportError:
        return (f"env.atari_backend: ale needs ale-py, which is not installed; install the 'atari' "
                f"extra: pip install {_EXTRA.format('')}")
    version = getattr(ale_py, "__version__", "?")
    return (f"env.atari_backend: ale needs ale_py.vector_env with same-step autoreset, which ale-py "
            f"{version} lacks; upgrade it with the 'atari' extra: pip install -U {_EXTRA.format('-U ')}, "
            f"or set env.atari_backend: gymnasium")


def _make_ale_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """One AtariVectorEnv of `num_envs` environments, preprocessed as make_env's are."""
    base = ale_vector_env()
    if base is None:
        raise EnvError(ale_missing())
    import_listed_modules(cfg)
    name = _registered(cfg)
    try:
        spec = gym.spec(name)
    except gym.error.Error as error:
        raise EnvError(f"env.id {cfg.id!r}: {error}") from None
    kwargs = {**spec.kwargs, **cfg.kwargs}  # env.kwargs override the id's, as gymnasium.make's do
    # gymnasium's frame limit counts emulated frames; None or 0 is none (AtariVectorEnv
    # would end every episode at once). A TimeLimit the spec adds counts frames too, as
    # it wraps the environment below the frame skip.
    limits = [n for n in (kwargs.get("max_num_frames_per_episode"), spec.max_episode_steps) if n]
    try:
        return _closing(base)(
            kwargs["game"], num_envs,
            # The whole vector each step: a smaller batch_size steps asynchronously and
            # returns whichever environments are ready, which does not fit fragments of
            # one environment's consecutive steps.
            batch_size=0,
            # A thread per environment, up to the cores this process may run on: the
            # threads sleep (they do not spin) while the actor runs its policy, so the
            # threads of several actors on one machine compete only while they step; and
            # no pinning (thread_affinity_offset -1), which every actor would make to the
            # same first cores.
            num_threads=min(num_envs, _cores()), thread_affinity_offset=-1,
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            max_num_frames_per_episode=min(limits) if limits else 2**31 - 1,
            repeat_action_probability=float(kwargs.get("repeat_action_probability", 0.0)),
            full_action_space=bool(kwargs.get("full_action_space", False)),
            img_height=SCREEN_SIZE, img_width=SCREEN_SIZE, grayscale=True,
            stack_num=cfg.frame_stack, frameskip=FRAME_SKIP, maxpool=True, noop_max=NOOP_MAX,
            # As gymnasium's AtariPreprocessing: an episode is a game, not a life; no FIRE
            # at reset; the game's own rewards (the charts show the unclipped returns;
            # clipping for learning would be the learner's to do).
            episodic_life=False, life_loss_info=False, reward_clipping=False, use_fire_reset=False)
    except Exception as error:  # the ROM missing, a bad keyword value: name the env and the cause
        raise EnvError(f"env.id {cfg.id!r} (env.atari_backend ale) with kwargs {dict(cfg.kwargs)}: "
                       f"{type(error).__name__}: {excerpt(error)}") from error


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@functools.cache
def _closing(base: type) -> type:
    """AtariVectorEnv (`base`) with what it lacks here: a close that ends its C++ threads
    (ale_py's close leaves them running until the interface is freed, which the garbage
    collector may do late or, in a process that exits first, never), and seeds past the
    ALE's 32-bit range folded into it (an actor's seed is run seed x 10 000 + ...)."""

    class ClosingAtariVectorEnv(base):
        def reset(self, *, seed: int | np.ndarray | None = None, options: dict[str, Any] | None = None):
            if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
                mask = (options or {}).get("reset_mask")
                count = self.num_envs if mask is None else int(np.count_nonzero(mask))
                # Consecutive seeds from `seed`, as AtariVectorEnv and gymnasium give them.
                seed = (int(seed) % 2**31 + np.arange(count)) % 2**31
            return super().reset(seed=seed, options=options)

        def close_extras(self, **kwargs: Any) -> None:
            # Its last reference: the interface is freed, and its destructor joins the threads.
            self.__dict__.pop("ale", None)

    return ClosingAtariVectorEnv


def env_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """An action the environment accepts: Gaussian samples are unbounded, so clip them to
    a Box space; indices from 0 (the model's) are shifted to a Discrete or MultiDiscrete
    space's `start`; other actions pass through."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)) and np.any(space.start):
        return action + space.start
    return action
