"""Tiny environments with composite observations and factorised actions, for
tests/test_spaces_end_to_end.py; importable by name, so that actor processes can make
them."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class MatchTheCue(gym.Env):
    """Dict observations (a cue among 3, a position, a small image) and MultiDiscrete
    actions [2, 3]: reward 1 when the second component names the cue. 8 steps an episode."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Dict({
            "cue": spaces.Discrete(3),
            "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "view": spaces.Box(0, 255, (6, 6, 1), np.uint8),
        })
        self.action_space = spaces.MultiDiscrete([2, 3])
        self.t, self.cue = 0, 0

    def _obs(self):
        view = np.zeros((6, 6, 1), np.uint8)
        view[self.cue] = 255
        return {"cue": self.cue, "position": self.np_random.uniform(-1, 1, 2).astype(np.float32),
                "view": view}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(3))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action[1]) == self.cue)
        self.t += 1
        self.cue = int(self.np_random.integers(3))
        return self._obs(), reward, False, self.t >= 8, {}


class CopyTheBits(gym.Env):
    """Tuple observations (a Discrete and 3 bits) and MultiBinary(3) actions: reward is
    the share of bits copied. 8 steps an episode, ending by a time limit (truncation)."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Tuple((spaces.Discrete(4), spaces.MultiBinary(3)))
        self.action_space = spaces.MultiBinary(3)
        self.t, self.bits = 0, np.zeros(3, np.int8)

    def _obs(self):
        self.bits = self.np_random.integers(0, 2, 3).astype(np.int8)
        return (self.t % 4, self.bits)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(np.mean(np.asarray(action) == self.bits))
        self.t += 1
        return self._obs(), reward, False, self.t >= 8, {}
