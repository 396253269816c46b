"""Observation and action spaces: how each is stored in a fragment record and handed to
the model.

A plain observation space (Box, Discrete, MultiBinary, MultiDiscrete) is one array per
observation. A Dict or Tuple space (nested or not) is a set of *leaves*, each named by
its path (`"image"`, `"0"`, `"goal.position"`): a fragment stores it as a structured
field with one sub-field per leaf, and the model receives a dict of tensors, one per
leaf. Graph, Text, Sequence and OneOf spaces have no fixed size and are refused with one
line naming the space.
"""
from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

__all__ = ["Obs", "UnsupportedSpace", "action_record", "as_batch", "check_action_space", "flat_obs",
           "leaves", "obs_record", "obs_to_torch", "stack_obs", "tree_map", "write_obs"]

# A batch of observations as the model takes it: one tensor, or one per leaf.
Obs = torch.Tensor | dict[str, torch.Tensor]

_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)


class UnsupportedSpace(ValueError):
    """A space that the trainer cannot store or model."""


def leaves(space: gym.Space, path: str = "") -> list[tuple[str, gym.Space]]:
    """The leaf spaces of a Dict or Tuple space, with their paths, in gymnasium's order
    (a Dict's keys as the space keeps them); [("", space)] for a plain space."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, sub in space.spaces.items()
                for leaf in leaves(sub, f"{path}.{key}" if path else str(key))]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces)
                for leaf in leaves(sub, f"{path}.{i}" if path else str(i))]
    if not isinstance(space, _LEAVES):
        where = f" (at {path!r})" if path else ""
        raise UnsupportedSpace(
            f"observation space {type(space).__name__}{where} is not supported: observations "
            "must be Box, Discrete, MultiBinary or MultiDiscrete, or Dict/Tuple of them; "
            "wrap the environment (env.wrappers) to turn it into one of these")
    return [(path, space)]


def is_composite(space: gym.Space) -> bool:
    return isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))


def _leaf_record(space: gym.Space) -> tuple[np.dtype, tuple[int, ...]]:
    if isinstance(space, gym.spaces.Discrete):
        return np.dtype(np.int64), ()
    return np.dtype(space.dtype), tuple(space.shape)


def obs_record(space: gym.Space) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape) of one observation in a record: the space's own for a plain space
    (uint8 and bool images stay compact); for a Dict or Tuple, a structured dtype with one
    field per leaf path, and shape ()."""
    if not is_composite(space):
        leaves(space)  # refuses what is not a leaf
        return _leaf_record(space)
    return np.dtype([(path, *_leaf_record(leaf)) for path, leaf in leaves(space)]), ()


def flat_obs(obs, space: gym.Space) -> np.ndarray | dict[str, np.ndarray]:
    """An observation (or a batch of them) as the environment returns it -> one array,
    or a dict {leaf path: array} for a Dict or Tuple space."""
    if not is_composite(space):
        return np.asarray(obs)
    out: dict[str, np.ndarray] = {}

    def walk(value, sub, path):
        if isinstance(sub, gym.spaces.Dict):
            for key, s in sub.spaces.items():
                walk(value[key], s, f"{path}.{key}" if path else str(key))
        elif isinstance(sub, gym.spaces.Tuple):
            for i, s in enumerate(sub.spaces):
                walk(value[i], s, f"{path}.{i}" if path else str(i))
        else:
            out[path] = np.asarray(value)

    walk(obs, space, "")
    return out


def stack_obs(observations: list, space: gym.Space) -> np.ndarray | dict[str, np.ndarray]:
    """Single observations (as the environment returns them) -> one batch."""
    flat = [flat_obs(o, space) for o in observations]
    if isinstance(flat[0], dict):
        return {path: np.stack([f[path] for f in flat]) for path in flat[0]}
    return np.stack(flat)


def as_batch(obs, space: gym.Space) -> tuple[np.ndarray | dict[str, np.ndarray], bool]:
    """(a batch, whether `obs` was a single observation) of what a user passes to
    `predict`: one observation of `space`, or a batch of them."""
    flat = flat_obs(obs, space)
    if isinstance(flat, dict):
        shapes = dict(leaves(space))
        single = all(value.shape == _leaf_record(shapes[path])[1] for path, value in flat.items())
        return ({path: value[None] for path, value in flat.items()} if single else flat), single
    single = flat.shape == _leaf_record(space)[1]
    return (flat[None] if single else flat), single


def write_obs(field: np.ndarray, obs) -> None:
    """Store observations (an array, or a dict of leaf arrays) into a record field of the
    same leading shape, leaf by leaf."""
    if isinstance(obs, dict):
        for path, value in obs.items():
            field[path] = value
    else:
        field[...] = obs


def obs_to_torch(obs, device: torch.device | str | None = None) -> Obs:
    """Observations as the model takes them: an array (or a structured record field, or a
    dict of leaf arrays) -> a tensor, or a dict of tensors. Structured fields are strided
    in their records: each leaf is copied out once."""
    if isinstance(obs, np.ndarray) and obs.dtype.names:
        return {name: _tensor(np.ascontiguousarray(obs[name]), device) for name in obs.dtype.names}
    if isinstance(obs, dict):
        return {name: _tensor(np.ascontiguousarray(value), device) for name, value in obs.items()}
    return _tensor(np.ascontiguousarray(obs), device)


def _tensor(array: np.ndarray, device) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor if device is None else tensor.to(device)


def tree_map(fn: Callable[[torch.Tensor], torch.Tensor], obs: Obs) -> Obs:
    """`fn` applied to the tensor, or to each leaf's tensor."""
    if isinstance(obs, dict):
        return {name: fn(value) for name, value in obs.items()}
    return fn(obs)


def batch_size(obs: Obs) -> int:
    return len(next(iter(obs.values())) if isinstance(obs, dict) else obs)


# ---- actions ---------------------------------------------------------------------------


def check_action_space(space: gym.Space) -> None:
    """Refuse, in one line, an action space the model has no head for."""
    if isinstance(space, gym.spaces.Discrete):
        return
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) == 1:
        return
    if isinstance(space, gym.spaces.MultiBinary) and len(space.shape) == 1:
        return
    raise UnsupportedSpace(
        f"action space {space} is not supported: actions must be Discrete, MultiDiscrete "
        "(1-D), MultiBinary (1-D) or a 1-D Box; wrap the environment (env.wrappers) to "
        "flatten it")


def action_record(space: gym.Space) -> tuple[np.dtype, tuple[int, ...]]:
    """(dtype, shape) of one action in a record: float32 for a Box, int64 indices from 0
    for Discrete and MultiDiscrete, int8 for MultiBinary."""
    check_action_space(space)
    if isinstance(space, gym.spaces.Box):
        return np.dtype(np.float32), tuple(space.shape)
    if isinstance(space, gym.spaces.Discrete):
        return np.dtype(np.int64), ()
    if isinstance(space, gym.spaces.MultiBinary):
        return np.dtype(np.int8), tuple(space.shape)
    return np.dtype(np.int64), tuple(space.nvec.shape)
