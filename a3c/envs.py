"""Environments: one gymnasium env per config, and the vector of them an actor steps."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from .config import EnvConfig

__all__ = ["EnvError", "env_action", "make_env", "make_vector_env"]


class EnvError(RuntimeError):
    """The environment could not be created."""


def make_env(cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """Create one environment, with Atari preprocessing and frame stacking if asked."""
    if cfg.id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
    kwargs = dict(cfg.kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps
    try:
        env = gym.make(cfg.id, render_mode=render_mode, **kwargs)
        if cfg.atari:
            # 84x84 grayscale, 4-frame skip with max-pooling, up to 30 no-ops at reset.
            env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
            env = gym.wrappers.FrameStackObservation(env, cfg.frame_stack)
    except Exception as error:  # gymnasium raises many kinds; name the env and the cause
        raise EnvError(f"env.id {cfg.id!r} with env.kwargs {cfg.kwargs}: {error}") from error
    return env


def make_vector_env(cfg: EnvConfig, num_envs: int) -> gym.vector.VectorEnv:
    """`num_envs` copies stepped in this process. SAME_STEP autoreset returns the reset
    observation at once and the final one in `info["final_obs"]`, so a fragment never
    holds a dummy step and a truncated episode can bootstrap from its final observation."""
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(cfg) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def env_action(action: np.ndarray, space: gym.Space) -> np.ndarray:
    """An action the environment accepts: Gaussian samples are unbounded, so clip them to
    a Box space; other actions pass through."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    return action
