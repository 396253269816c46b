"""The vector of environments an actor steps (`make_vector_env`): gymnasium's SyncVectorEnv
of make_env's environments, or, for Atari (`env.atari_backend`, resolved by
`atari_backend`), one of ale_py's AtariVectorEnv, which emulates and preprocesses its
environments in C++ threads.
The two give the same frames: 84x84 gray, 4 frames skipped with the last two max-pooled,
up to NOOP_MAX no-ops at reset, `env.frame_stack` frames stacked oldest first with zero
frames before the first; rewards unclipped; no FIRE at reset, no end at a lost life. An
AtariVectorEnv takes an ALE/ id's ROM and its spec's kwargs (sticky actions, action set,
frame limit) merged with env.kwargs; what it cannot make (wrappers, an entry point, a
time limit) stays with gymnasium (`a3c.config.rules.ale_obstacle` says why).
"""
from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from ..config import EnvConfig
from ..config.rules import ale_obstacle
from ..files import excerpt
from .sources import FRAME_SKIP, NOOP_MAX, SCREEN_SIZE, EnvError, import_listed_modules, make_env, registered_id

__all__ = ["ale_missing", "ale_vector_env", "atari_backend", "make_vector_env"]


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
    name = registered_id(cfg)
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
