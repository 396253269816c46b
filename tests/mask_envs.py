"""Environments with action masks, written as users write them (no render_mode, no spec),
one per convention a3c.envs.masks reads; importable by name, so that actor processes can
make them. scripts/bench_masks.py trains on `ChooseBest`."""
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class RandomMasks(gym.Env):
    """Each step a random set of valid actions (at least one per component), given the
    way `convention` says: "observation" (a Dict with an "action_mask" entry), "info", or
    "method" (RandomMasksByMethod). `nvec` None: Discrete(5) actions; else MultiDiscrete(nvec), whose mask is
    flat unless `per_component`. An invalid action raises, as a game engine's would."""

    def __init__(self, convention="method", nvec=None, per_component=False, length=10):
        self.convention, self.per_component, self.length = convention, per_component, length
        self.action_space = spaces.Discrete(5) if nvec is None else spaces.MultiDiscrete(nvec)
        self.sizes = [5] if nvec is None else [int(n) for n in nvec]
        position = spaces.Box(-1.0, 1.0, (3,), np.float32)
        if convention == "observation":
            mask = (spaces.Tuple([spaces.MultiBinary(n) for n in self.sizes]) if per_component
                    else spaces.Box(0, 1, (sum(self.sizes),), np.int8))
            self.observation_space = spaces.Dict({"position": position, "action_mask": mask})
        else:
            self.observation_space = position
        self.t, self.mask = 0, None

    def _new_mask(self):
        parts = []
        for n in self.sizes:
            part = (self.np_random.random(n) < 0.4).astype(np.int8)
            part[self.np_random.integers(n)] = 1
            parts.append(part)
        self.mask = parts

    def _given_mask(self):
        return tuple(self.mask) if self.per_component else np.concatenate(self.mask)

    def _obs(self):
        position = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        if self.convention == "observation":
            return {"position": position, "action_mask": self._given_mask()}
        return position

    def _info(self):
        return {"action_mask": self._given_mask()} if self.convention == "info" else {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self._new_mask()
        return self._obs(), self._info()

    def step(self, action):
        chosen = [int(action)] if isinstance(self.action_space, spaces.Discrete) else [int(a) for a in action]
        for part, a in zip(self.mask, chosen):
            if not part[a]:
                raise ValueError(f"invalid action {chosen} under the mask {self.mask}")
        self.t += 1
        self._new_mask()
        return self._obs(), 0.0, False, self.t >= self.length, self._info()


class RandomMasksByMethod(RandomMasks):
    """RandomMasks whose masks come from an `action_masks()` method."""

    def __init__(self, nvec=None, per_component=False, length=10):
        super().__init__("method", nvec, per_component, length)

    def action_masks(self):
        return self._given_mask()


class ChooseBest(gym.Env):
    """A task that needs masks to be learned at all. Each step 3 of 8 actions are valid,
    at random, and only the action masks say which; the observation is one of 4 contexts
    (one-hot), each ranking the 8 actions in its own order. Reward 1 for the valid action
    that the context ranks first among the valid ones, 0 for another valid one; an invalid
    action ends the episode. 20 steps an episode: a uniformly random valid choice scores
    about 6.7, the best policy 20. The masks come from `action_masks()`, as sb3-contrib's
    MaskablePPO reads them. It draws the valid actions as lit cells (rgb_array)."""

    N, VALID, CONTEXTS, LENGTH = 8, 3, 4, 20
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, 1.0, (self.CONTEXTS,), np.float32)
        self.action_space = spaces.Discrete(self.N)
        # rank[c, a]: how context c ranks action a (higher is better), a permutation each.
        self.rank = np.array([[(a * (2 * c + 1) + 3 * c) % self.N for a in range(self.N)]
                              for c in range(self.CONTEXTS)])
        self.t, self.context, self.mask = 0, 0, np.ones(self.N, bool)

    def _draw(self):
        self.context = int(self.np_random.integers(self.CONTEXTS))
        self.mask = np.zeros(self.N, bool)
        self.mask[self.np_random.choice(self.N, self.VALID, replace=False)] = True
        return np.eye(self.CONTEXTS, dtype=np.float32)[self.context]

    def action_masks(self):
        return self.mask.copy()

    def render(self):
        cells = np.repeat(np.repeat(self.mask.astype(np.uint8) * 255, 8)[None], 8, 0)
        return np.stack([cells, cells, np.full_like(cells, 40 * self.context)], -1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw(), {}

    def step(self, action):
        action = int(action)
        if not self.mask[action]:
            return self._draw(), 0.0, True, False, {}
        ranks = np.where(self.mask, self.rank[self.context], -1)
        reward = float(action == int(ranks.argmax()))
        self.t += 1
        return self._draw(), reward, False, self.t >= self.LENGTH, {}
