"""Environment wrappers a config can name in `env.wrappers`, as `a3c.wrappers:Name`."""
from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

__all__ = ["KeepObservation"]


class KeepObservation(gym.ObservationWrapper):
    """Keeps only the entries `indices` of a rank-1 Box observation. With the velocities
    left out, the classic control tasks need memory: CartPole's [0, 2] (position and
    angle) is RL Zoo's CartPoleNoVel-v1."""

    def __init__(self, env: gym.Env, indices: Sequence[int]):
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"KeepObservation needs a rank-1 Box observation space, got {space}")
        self.indices = np.asarray(indices, dtype=np.int64)
        if self.indices.ndim != 1 or not len(self.indices) or \
                not ((0 <= self.indices) & (self.indices < space.shape[0])).all():
            raise ValueError(f"indices must be a non-empty list of entries from 0 to "
                             f"{space.shape[0] - 1}, got {list(indices)}")
        self.observation_space = gym.spaces.Box(space.low[self.indices], space.high[self.indices],
                                                dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.indices]
