"""Action masks: which actions are valid in the current state, read where users put them,
and handed to the model in one form.

Three conventions are read (`env.action_mask` in the config):

    observation  a Dict observation with an "action_mask" entry (Sample Factory, RLlib,
                 TorchRL, PettingZoo Classic); the other entries are the observation
    info         info["action_mask"] after reset and each step (Shimmy's OpenSpiel)
    method       an `action_masks()` method of the environment, called after reset and
                 each step (sb3-contrib's MaskablePPO)

`auto` (the default) takes the first when the observation space has the entry, else the
third when the environment has the method; `info` must be named, because the observation
space has to be known before anything is reset.

A mask is 1 (or True) for a valid action. For a Discrete space of n actions it has n
entries; for a MultiDiscrete space either one flat vector of sum(nvec) entries, component
after component (MaskablePPO's form), or one vector per component (gymnasium's
`sample(mask=...)` form).

`ActionMasked` puts every convention into one form, the *masked observation*: a Dict
whose "action_mask" entry is the flat mask as a MultiBinary leaf, beside the other
entries of a Dict observation, or beside `"observation"` for any other space. The mask
then travels as an ordinary observation leaf, in fragments, through the queue and the
replay buffers, into checkpoints' spaces and `predict`, and the model masks its logits
with it (a3c.models.actor_critic).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["MASK_KEY", "OBS_KEY", "ActionMasked", "MaskError", "flat_mask", "mask_size", "mask_source",
           "has_mask_entry", "masked_space", "random_action", "sample_valid", "with_action_mask"]

MASK_KEY = "action_mask"
OBS_KEY = "observation"  # the entry of a masked observation that holds a non-Dict observation


class MaskError(ValueError):
    """An action mask that does not fit its action space, or that allows no action."""


def mask_size(action_space: gym.Space) -> int:
    """Entries of the flat mask of `action_space`, or a MaskError for a space that no mask fits."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.MultiDiscrete) and action_space.nvec.ndim == 1:
        return int(action_space.nvec.sum())
    raise MaskError(f"action masks need a Discrete or a 1-D MultiDiscrete action space, and this "
                    f"environment's is {action_space}; set env.action_mask: none")


def flat_mask(mask: Any, action_space: gym.Space) -> np.ndarray:
    """A mask (or a batch of them: the leading axes are kept) in its flat form: int8
    [..., mask_size], 1 where the action is valid. A MultiDiscrete mask may come as one
    vector per component (a tuple or list of them)."""
    size = mask_size(action_space)
    if isinstance(mask, (tuple, list)) and isinstance(action_space, gym.spaces.MultiDiscrete) \
            and len(mask) == len(action_space.nvec) and not np.isscalar(mask[0]):
        parts = [np.asarray(part) for part in mask]
        if [part.shape[-1] for part in parts] != [int(n) for n in action_space.nvec]:
            raise MaskError(f"action mask of {len(parts)} parts of sizes {[p.shape[-1] for p in parts]}, where "
                            f"{action_space} needs sizes {list(map(int, action_space.nvec))}")
        mask = np.concatenate(parts, axis=-1)
    mask = np.asarray(mask)
    if mask.ndim == 0 or mask.shape[-1] != size:
        raise MaskError(f"action mask of shape {mask.shape}, where {action_space} needs {size} entries, "
                        f"one per action (a MultiDiscrete's components one after another)")
    return (mask != 0).astype(np.int8)


def masked_space(observation_space: gym.Space, action_space: gym.Space) -> gym.spaces.Dict:
    """The space of masked observations: a Dict's entries with "action_mask" (flat) in
    place of its own, or `"observation"` and "action_mask"."""
    mask = gym.spaces.MultiBinary(mask_size(action_space))
    if isinstance(observation_space, gym.spaces.Dict):
        entries = {k: v for k, v in observation_space.spaces.items() if k != MASK_KEY}
    else:
        entries = {OBS_KEY: observation_space}
    return gym.spaces.Dict({**entries, MASK_KEY: mask})


def _components(mask: np.ndarray, action_space: gym.Space) -> list[np.ndarray]:
    """A flat mask as one mask per component (one for a Discrete space)."""
    if isinstance(action_space, gym.spaces.Discrete):
        return [mask]
    return np.split(mask, np.cumsum(action_space.nvec)[:-1], axis=-1)


def has_mask_entry(space: gym.Space) -> bool:
    """Whether observations of `space` carry a mask: a Dict with an "action_mask" entry."""
    return isinstance(space, gym.spaces.Dict) and MASK_KEY in space.spaces


def random_action(action_space: gym.Space, mask: np.ndarray | None = None) -> Any:
    """A uniformly random action: among those a flat mask allows, where there is one."""
    return action_space.sample() if mask is None else sample_valid(action_space, mask)


def sample_valid(action_space: gym.Space, mask: np.ndarray) -> Any:
    """A uniformly random action among those a flat mask allows, as the space gives it."""
    parts = _components(np.asarray(mask, np.int8), action_space)
    return action_space.sample(mask=parts[0] if isinstance(action_space, gym.spaces.Discrete) else tuple(parts))


class ActionMasked(gym.Wrapper):
    """An environment whose observations are masked observations (see the module's
    docstring), from the mask where `source` ("observation", "info" or "method") says the
    environment gives it. A mask that allows no action (in some component, for a
    MultiDiscrete space) is a MaskError naming the step of the episode."""

    def __init__(self, env: gym.Env, source: str):
        super().__init__(env)
        if source not in ("observation", "info", "method"):
            raise ValueError(f"source must be observation, info or method, got {source!r}")
        self.source = source
        self.observation_space = masked_space(env.observation_space, env.action_space)
        self._own_dict = isinstance(env.observation_space, gym.spaces.Dict)
        self._step = 0
        space = env.action_space
        self._size = mask_size(space)
        # Where each component's entries start, for np.logical_or.reduceat (None: one component).
        self._starts = None if isinstance(space, gym.spaces.Discrete) else \
            np.concatenate([[0], np.cumsum(space.nvec)[:-1]]).astype(np.intp)
        # Bound once: looking a method up through the wrappers costs more than a step.
        self._method = env.get_wrapper_attr("action_masks") if source == "method" else None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._step = 0
        return self._masked(obs, info), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._step += 1
        return self._masked(obs, info), reward, terminated, truncated, info

    def _read(self, obs, info: Mapping) -> Any:
        if self._method is not None:
            return self._method()
        if self.source == "observation":
            return obs[MASK_KEY]
        if MASK_KEY not in info:
            raise MaskError(f"step {self._step} of the episode: info has no 'action_mask' "
                            f"(env.action_mask: info); return it from reset and every step")
        return info[MASK_KEY]

    def _masked(self, obs, info: Mapping) -> dict:
        raw = self._read(obs, info)
        if isinstance(raw, np.ndarray) and raw.shape == (self._size,):  # the common form, fast
            mask = (raw != 0).view(np.int8)
        else:
            try:
                mask = flat_mask(raw, self.env.action_space)
            except MaskError as error:
                raise MaskError(f"step {self._step} of the episode: {error}") from None
        if not (mask.any() if self._starts is None else np.logical_or.reduceat(mask, self._starts).all()):
            raise MaskError(f"step {self._step} of the episode: the action mask allows no action; "
                            f"every state needs at least one valid action (one per component)")
        entries = {k: v for k, v in obs.items() if k != MASK_KEY} if self._own_dict else {OBS_KEY: obs}
        return {**entries, MASK_KEY: mask}


def _has_method(env: gym.Env) -> bool:
    try:
        return callable(env.get_wrapper_attr("action_masks"))
    except AttributeError:
        return False


def mask_source(env: gym.Env, setting: str) -> str | None:
    """Where `env` gives its masks under the config's `env.action_mask` setting (None:
    no masks). `auto` finds the observation's entry or the method; the others are taken
    as they are said."""
    if setting == "none":
        return None
    if setting != "auto":
        return setting
    if has_mask_entry(env.observation_space):
        return "observation"
    return "method" if _has_method(env) else None


def with_action_mask(env: gym.Env, setting: str, describe: Callable[[], str] = lambda: "env") -> gym.Env:
    """`env` with masked observations when `setting` finds its masks, else `env` itself.
    A setting that names a convention the environment does not follow is a MaskError."""
    source = mask_source(env, setting)
    if source is None:
        return env
    space = env.observation_space
    if source == "observation" and not has_mask_entry(space):
        raise MaskError(f"env.action_mask: observation, but {describe()}'s observation space has no "
                        f"'action_mask' entry ({space}); use info, method or auto")
    if source == "method" and not _has_method(env):
        raise MaskError(f"env.action_mask: method, but {describe()} has no action_masks() method; "
                        f"use observation, info or auto")
    mask_size(env.action_space)  # a space no mask fits: one line, now
    return ActionMasked(env, source)
