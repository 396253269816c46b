"""Torsos: what turns a batch of raw observations into features for the heads.

- an MLP for vector observations (and one-hot encoded discrete ones);
- a CNN for images: the Nature-DQN torso, or MinAtar's small one for small grids;
- `MultiInputTorso` for Dict and Tuple observations: a CNN per image leaf, the rest
  concatenated, then the MLP.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..envs.spaces import is_composite, leaves
from .normalize import _module_name

__all__ = ["MultiInputTorso", "Residual", "ScaledConv2d", "chw", "cnn_arch_for", "cnn_torso", "encode", "image_scale",
           "is_image", "mlp_torso", "orthogonal", "torso_for", "vector_dim"]

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


# Images at least this high and wide get the Nature-DQN torso; smaller ones (MinAtar's
# 10x10 grids) the small one: Nature's 8x8 stride-4 first layer needs 36x36.
_NATURE_MIN_SIDE = 36


def orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights and zero bias, the usual actor-critic initialisation."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def mlp_torso(in_dim: int, hidden_sizes: Sequence[int], activation: str,
               layer_norm: bool = False) -> Tuple[nn.Module, int]:
    """Fully connected torso; returns the module and its output size. With `layer_norm`
    each layer's pre-activations are normalized over its units (Ba et al. 2016) before
    the activation."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    layers = []
    for size in hidden_sizes:
        layers += [orthogonal(nn.Linear(in_dim, size), math.sqrt(2)),
                   *([nn.LayerNorm(size)] if layer_norm else []), _ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


def cnn_arch_for(chw: Sequence[int], arch: str = "auto") -> str:
    """The CNN torso an image of shape [C, H, W] gets: `arch`, or with "auto" the
    Nature-DQN torso for images of 36x36 and more, the small one below."""
    if arch != "auto":
        return arch
    return "nature" if min(chw[1:]) >= _NATURE_MIN_SIDE else "small"


class ScaledConv2d(nn.Conv2d):
    """A convolution of `input_scale` x its input, with the scale applied to the weights:
    conv(x * s, W) + b = conv(x, W * s) + b. A CNN's first layer reads a batch of byte
    images this way, converted once to the compute type and never scaled itself: scaling
    320 frames of 4x84x84 costs more than the layer's forward pass, scaling 8 k weights
    nothing. The parameters and their meaning are a plain Conv2d's."""

    def __init__(self, *args, input_scale: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_scale = input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.input_scale == 1.0 else self.weight * self.input_scale
        return self._conv_forward(x, weight, self.bias)


class Residual(nn.Module):
    """IMPALA's residual block: x + conv(relu(conv(relu(x)))), 3x3 convolutions that keep
    the channels and the size."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = orthogonal(nn.Conv2d(channels, channels, 3, padding=1), math.sqrt(2))
        self.conv1 = orthogonal(nn.Conv2d(channels, channels, 3, padding=1), math.sqrt(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


def _impala_stack(conv: nn.Conv2d) -> nn.Sequential:
    """One of IMPALA's stacks: `conv` (3x3), a 3x3 max-pool of stride 2, two residual blocks."""
    return nn.Sequential(orthogonal(conv, math.sqrt(2)), nn.MaxPool2d(3, stride=2, padding=1),
                         Residual(conv.out_channels), Residual(conv.out_channels))


def cnn_torso(chw: Sequence[int], arch: str = "auto", input_scale: float = 1.0) -> Tuple[nn.Module, int]:
    """A convolutional torso for [C, H, W] images, which it reads multiplied by
    `input_scale` (1 / 255 for bytes; see ScaledConv2d):
    - "nature": Mnih et al. 2015 (Nature DQN): 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512;
    - "impala": Espeholt et al. 2018 (IMPALA's deep torso): three stacks of 16, 32 and 32
      channels, each a 3x3 convolution, a max-pool of stride 2 and two residual blocks,
      then dense 256; 15 layers, more to learn from per frame at more cost per frame;
    - "small": Young and Tian 2019 (MinAtar): 16 3x3/1, dense 128, for small grids."""
    arch = cnn_arch_for(chw, arch)
    if arch == "impala":
        convs = nn.Sequential(
            _impala_stack(ScaledConv2d(chw[0], 16, 3, padding=1, input_scale=input_scale)),
            _impala_stack(nn.Conv2d(16, 32, 3, padding=1)),
            _impala_stack(nn.Conv2d(32, 32, 3, padding=1)),
            nn.ReLU(), nn.Flatten(),
        )
        out, least = 256, "1x1"
    elif arch == "nature":
        convs = nn.Sequential(
            orthogonal(ScaledConv2d(chw[0], 32, 8, stride=4, input_scale=input_scale), math.sqrt(2)), nn.ReLU(),
            orthogonal(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)), nn.ReLU(),
            orthogonal(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)), nn.ReLU(),
            nn.Flatten(),
        )
        out, least = 512, f"{_NATURE_MIN_SIDE}x{_NATURE_MIN_SIDE}"
    elif arch == "small":
        convs = nn.Sequential(orthogonal(ScaledConv2d(chw[0], 16, 3, stride=1, input_scale=input_scale),
                                         math.sqrt(2)),
                              nn.ReLU(), nn.Flatten())
        out, least = 128, "3x3"
    else:
        raise ValueError(f"model.cnn_arch must be auto, nature, impala or small, got {arch!r}")
    # Size the dense layer from a dummy forward pass rather than by hand.
    try:
        with torch.no_grad():
            flat_dim = convs(torch.zeros(1, *chw)).shape[1]
    except RuntimeError as error:
        raise ValueError(
            f"observation shape {tuple(chw)} (channels, height, width) is too small for the "
            f"{arch} CNN torso, which needs images of at least {least}; set model.cnn_arch "
            "to auto (or small), or model.cnn to false for the MLP torso"
        ) from error
    return nn.Sequential(convs, orthogonal(nn.Linear(flat_dim, out), math.sqrt(2)), nn.ReLU()), out


def image_scale(space: gym.Space) -> float:
    """What a CNN multiplies an image leaf by: bytes to [0, 1], other types as they are."""
    return 1.0 / 255.0 if space.dtype == np.uint8 else 1.0


def is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def chw(shape: Sequence[int]) -> Tuple[Tuple[int, int, int], bool]:
    """([C, H, W], channels_last) of a rank-3 image shape. Images are [H, W, C] (rendered
    frames, CarRacing's 96x96x3, MinAtar's 10x10xC) unless the first axis is the shorter
    of the two ends, as in a frame stack's [4, 84, 84]."""
    channels_last = not shape[0] < shape[-1]
    return ((shape[2], shape[0], shape[1]) if channels_last else tuple(shape)), channels_last


def vector_dim(space: gym.Space) -> int:
    """The length of a leaf's encoding as a flat vector."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return int(np.prod(space.shape))


def encode(obs: torch.Tensor, space: gym.Space, image: bool) -> torch.Tensor:
    """A batch of one leaf's raw observations -> torso input: [N, C, H, W] for an image
    through a CNN, converted once to the compute type (bfloat16 under autocast) and left
    unscaled (the CNN's first layer scales it, see ScaledConv2d); else [N, D] floats
    (Discrete and MultiDiscrete one-hot, bytes scaled to [0, 1], everything else as
    float)."""
    if isinstance(space, gym.spaces.Discrete):
        return F.one_hot(obs.long() - int(space.start), int(space.n)).float()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return torch.cat([F.one_hot(obs[:, i].long() - int(start), int(n)).float()  # no host-to-device copy
                          for i, (start, n) in enumerate(zip(space.start, space.nvec))], dim=-1)
    if image:
        device = obs.device.type
        x = obs.to(torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32)
        return x.permute(0, 3, 1, 2) if chw(space.shape)[1] else x
    x = obs.float()
    if space.dtype == np.uint8:
        x = x * (1.0 / 255.0)
    return x.flatten(start_dim=1)


class MultiInputTorso(nn.Module):
    """The torso of Dict and Tuple observations, as SB3's MultiInputPolicy builds it: each
    image leaf through a CNN of its own, the other leaves encoded as flat vectors, all
    concatenated, then the MLP."""

    def __init__(self, observation_space: gym.Space, cnn: Optional[bool], cnn_arch: str,
                 hidden_sizes: Sequence[int], activation: str, layer_norm: bool = False):
        super().__init__()
        self.leaves = leaves(observation_space)
        self.images = [path for path, space in self.leaves if is_image(space) and cnn is not False]
        self.cnns = nn.ModuleDict()
        width = 0
        for path, space in self.leaves:
            if path in self.images:
                self.cnns[_module_name(path)], dim = cnn_torso(chw(space.shape)[0], cnn_arch, image_scale(space))
            else:
                dim = vector_dim(space)
            width += dim
        self.mlp, self.out_dim = mlp_torso(width, hidden_sizes, activation, layer_norm)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.cnns[_module_name(path)](encode(obs[path], space, True))
                 if path in self.images else encode(obs[path], space, False)
                 for path, space in self.leaves]
        return self.mlp(torch.cat(parts, dim=-1))


def torso_for(space: gym.Space, cnn: Optional[bool], cnn_arch: str, hidden_sizes: Sequence[int],
              activation: str, layer_norm: bool = False
              ) -> Tuple[nn.Module, Callable[[], nn.Module], int, bool]:
    """(a torso for observations of `space`, a function that builds another like it, its
    output size, whether it runs a CNN): the multi-input torso for a Dict or Tuple, a CNN
    for an image (`cnn` None: whenever the space is one), else the MLP."""
    if is_composite(space):
        make = functools.partial(MultiInputTorso, space, cnn, cnn_arch, hidden_sizes, activation, layer_norm)
        torso = make()
        return torso, make, torso.out_dim, bool(torso.images)
    image = is_image(space)
    if cnn and not image:
        raise ValueError("the CNN torso needs a rank-3 Box image observation space ([C, H, W] or "
                         f"[H, W, C]), got {space}")
    uses_cnn = image if cnn is None else bool(cnn)
    make_with_dim = (functools.partial(cnn_torso, chw(space.shape)[0], cnn_arch, image_scale(space)) if uses_cnn
                     else functools.partial(mlp_torso, vector_dim(space), hidden_sizes, activation, layer_norm))
    torso, dim = make_with_dim()
    return torso, lambda: make_with_dim()[0], dim, uses_cnn
