"""Tiny environments and wrappers for tests/test_env_sources.py, importable by name
(`envs_for_tests:Corridor`) as a user's own package would be. Importing this module
registers `TestCorridor-v0`, as packages that register on import do."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces

REGISTERED_ID = "TestCorridor-v0"
PLAIN_ID = "TestPlainCorridor-v0"


class PlainCorridor(gym.Env):
    """Walk to the right end of a corridor of `length` cells, starting at the left end.
    Action 1 steps right, 0 steps left (a wall stops it at the start). Reaching the end
    gives reward 1 and ends the episode; there is no other reward. The observation is the
    one-hot position. The optimal return is 1; with length 8 and a time limit of 16 steps,
    a uniformly random walk reaches the end in about one episode in eight.

    Written as many users write an environment: a constructor that takes no
    `render_mode`, no `metadata` of its own, no `spec`, and no `render`."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.position = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return self._obs(), {}

    def step(self, action):
        self.position = max(0, self.position + (1 if int(action) == 1 else -1))
        at_end = self.position == self.length - 1
        return self._obs(), float(at_end), at_end, False, {}

    def _obs(self):
        obs = np.zeros(self.length, np.float32)
        obs[self.position] = 1.0
        return obs


class Corridor(PlainCorridor):
    """The corridor with gymnasium's render_mode argument (and no render modes)."""

    metadata = {"render_modes": []}

    def __init__(self, length: int = 5, render_mode=None):
        super().__init__(length)
        self.render_mode = render_mode


class OldApiCorridor(PlainCorridor):
    """The corridor on gym's API before 0.26: reset returns the observation alone, step
    returns (observation, reward, done, info)."""

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=seed)[0]

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated or truncated, info


def make_corridor(length: int = 5) -> gym.Env:
    """A factory function, as A3C(config, env=...) and env.entry_point take."""
    return Corridor(length=length)


def not_an_env(**kwargs):
    return "a string"


class Offset(gym.ObservationWrapper):
    """Adds `offset` to every observation."""

    def __init__(self, env, offset: float = 1.0):
        super().__init__(env)
        self.offset = offset
        self.observation_space = spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)

    def observation(self, observation):
        return (observation + self.offset).astype(np.float32)


class Scale(gym.ObservationWrapper):
    """Multiplies every observation by `factor`."""

    def __init__(self, env, factor: float = 10.0):
        super().__init__(env)
        self.factor = factor
        self.observation_space = spaces.Box(-np.inf, np.inf, env.observation_space.shape, np.float32)

    def observation(self, observation):
        return (observation * self.factor).astype(np.float32)


if REGISTERED_ID not in gym.envs.registry:
    gym.register(REGISTERED_ID, entry_point=Corridor, max_episode_steps=10)
if PLAIN_ID not in gym.envs.registry:
    gym.register(PLAIN_ID, entry_point=PlainCorridor, max_episode_steps=10)
