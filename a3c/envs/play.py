"""Episodes played by a policy: the loop of `evaluate` (and of `a3c.envs.video`)."""
from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from ..config import Config
from .sources import env_action, make_env
from .spaces import as_batch, obs_to_torch

__all__ = ["evaluate", "play"]


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
    """The episode loop of `evaluate` (and of `a3c.envs.video`): returns of `episodes` episodes,
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
