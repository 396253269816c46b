"""Actor-critic networks.

:func:`build_model` returns an :class:`ActorCritic` suited to a pair of
gymnasium spaces. Any ``nn.Module`` with the same interface can be used in
its place; the trainer relies only on:

``forward(obs) -> (policy_params [N, P], value [N])``
    ``obs`` is a batch ``[N, *observation_space.shape]`` holding the
    observation space's dtype (e.g. float32, or uint8 for images); the
    module converts it itself. ``policy_params`` parameterise the action
    distribution (logits for discrete actions; for continuous ones the means, followed
    by the log-stds when they depend on the state).
``dist(policy_params) -> torch.distributions.Distribution``
    Its ``log_prob`` and ``entropy`` return one value per batch row [N].
``act(obs, deterministic=False) -> (action, log_prob [N], value [N])``
    Without gradient; ``deterministic`` selects the mode instead of sampling.
``evaluate(obs, actions) -> (log_prob [N], entropy [N], value [N])``
    With gradient, for the learner's loss.
Properties ``is_continuous``, ``action_shape`` and ``action_dtype``
    Describe one action, so that the caller can allocate buffers.

Optional: attributes ``obs_norm`` (an :class:`~a3c.normalize.ObservationNorm`) and
``popart`` (a :class:`~a3c.normalize.PopArt`), or None; learners update them when present.
"""

import math
from typing import Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical, Distribution, Independent, Normal

from .normalize import ObservationNorm, PopArt

__all__ = ["ActorCritic", "WeightCopy", "build_model"]

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def _orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights and zero bias, the usual actor-critic initialisation."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp_torso(in_dim: int, hidden_sizes: Sequence[int], activation: str) -> Tuple[nn.Module, int]:
    """Fully connected torso; returns the module and its output size."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    layers = []
    for size in hidden_sizes:
        layers += [_orthogonal(nn.Linear(in_dim, size), math.sqrt(2)), _ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


def _cnn_torso(obs_shape: Sequence[int]) -> Tuple[nn.Module, int]:
    """Nature-DQN convolutional torso (Mnih et al., 2015) for [C, H, W] images."""
    convs = nn.Sequential(
        _orthogonal(nn.Conv2d(obs_shape[0], 32, 8, stride=4), math.sqrt(2)), nn.ReLU(),
        _orthogonal(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)), nn.ReLU(),
        _orthogonal(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)), nn.ReLU(),
        nn.Flatten(),
    )
    # Size the dense layer from a dummy forward pass rather than by hand.
    try:
        with torch.no_grad():
            flat_dim = convs(torch.zeros(1, *obs_shape)).shape[1]
    except RuntimeError as error:
        raise ValueError(
            f"observation shape {tuple(obs_shape)} (channels, height, width) is too small for "
            "the CNN torso, which needs images of at least 36x36; set model.cnn to false for "
            "the MLP torso"
        ) from error
    return nn.Sequential(convs, _orthogonal(nn.Linear(flat_dim, 512), math.sqrt(2)), nn.ReLU()), 512


class ActorCritic(nn.Module):
    """Shared-torso actor-critic with a categorical or diagonal Gaussian policy.

    Args:
        observation_space: ``Box`` (flattened for the MLP torso; ``[C, H, W]``
            for the CNN torso) or ``Discrete`` (one-hot encoded).
        action_space: ``Discrete`` (categorical policy over logits) or a
            rank-1 ``Box`` (diagonal Gaussian; samples are unclipped, the caller
            clips them to the action bounds before stepping the environment).
        hidden_sizes: widths of the MLP torso layers.
        activation: ``"tanh"`` or ``"relu"`` for the MLP torso.
        cnn: use the CNN torso; ``None`` picks it for rank-3 ``Box`` observations.
        normalize_obs: normalise observations by running statistics (MLP torso on
            ``Box`` observations only: images and one-hot inputs are already scaled).
        normalize_value: PopArt-normalised value head.
        state_dependent_std: Gaussian policies only: the policy head outputs a
            log-std per action dimension next to the mean, instead of one learnable
            ``log_std`` per dimension shared by all states (PPO's usual choice).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        cnn: Optional[bool] = None,
        normalize_obs: bool = False,
        normalize_value: bool = False,
        state_dependent_std: bool = False,
    ):
        super().__init__()
        if isinstance(observation_space, gym.spaces.Discrete):
            self._obs_kind, in_dim = "onehot", int(observation_space.n)
        elif isinstance(observation_space, gym.spaces.Box):
            self._obs_kind, in_dim = "box", int(np.prod(observation_space.shape))
        else:
            raise ValueError(
                f"unsupported observation space {observation_space}; expected Box or Discrete"
            )
        image = self._obs_kind == "box" and len(observation_space.shape) == 3
        if cnn is None:
            cnn = image
        if cnn and not image:
            raise ValueError(
                "the CNN torso needs a rank-3 Box image observation space ([C, H, W] or "
                f"[H, W, C]), got {observation_space}"
            )
        # Images come as [C, H, W] (Atari's frame stack) or [H, W, C] (rendered frames,
        # e.g. CarRacing's 96x96x3): few channels in the last axis means the latter.
        shape = tuple(observation_space.shape)
        self._channels_last = image and shape[-1] <= 4 < shape[0]
        if isinstance(action_space, gym.spaces.Discrete) and action_space.start == 0:
            self._action_shape, n_params = (), int(action_space.n)
        elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            self._action_shape, n_params = tuple(action_space.shape), action_space.shape[0]
        else:
            raise ValueError(
                f"unsupported action space {action_space}; "
                "expected Discrete (starting at 0) or a rank-1 Box"
            )

        self.observation_space, self.action_space = observation_space, action_space
        self._obs_start = int(getattr(observation_space, "start", 0))
        # Image observations stored as bytes are rescaled to [0, 1].
        self._obs_scale = 1.0 / 255.0 if observation_space.dtype == np.uint8 else 1.0
        self.uses_cnn = bool(cnn)
        if self.uses_cnn:
            chw = (shape[2], shape[0], shape[1]) if self._channels_last else shape
            self.torso, feature_dim = _cnn_torso(chw)
        else:
            self.torso, feature_dim = _mlp_torso(in_dim, hidden_sizes, activation)
        self._state_std = state_dependent_std and isinstance(action_space, gym.spaces.Box)
        self.policy_head = _orthogonal(
            nn.Linear(feature_dim, 2 * n_params if self._state_std else n_params), 0.01)
        self.value_head = _orthogonal(
            PopArt(feature_dim) if normalize_value else nn.Linear(feature_dim, 1), 1.0)
        self.obs_norm = ObservationNorm(observation_space.shape) \
            if normalize_obs and self._obs_kind == "box" and not self.uses_cnn else None
        if self.is_continuous and not self._state_std:
            self.log_std = nn.Parameter(torch.zeros(n_params))

    @property
    def popart(self) -> Optional[PopArt]:
        """The value layer when it normalises value targets, else None."""
        return self.value_head if isinstance(self.value_head, PopArt) else None

    @property
    def is_continuous(self) -> bool:
        return self._action_shape != ()

    @property
    def action_shape(self) -> Tuple[int, ...]:
        return self._action_shape

    @property
    def action_dtype(self) -> type:
        return np.float32 if self.is_continuous else np.int64

    def _features_input(self, obs: torch.Tensor) -> torch.Tensor:
        """Turn raw observations of the space's dtype into float torso inputs."""
        if self._obs_kind == "onehot":
            return F.one_hot(obs.long() - self._obs_start, self.observation_space.n).float()
        obs = obs.float()
        if self._obs_scale != 1.0:
            obs = obs * self._obs_scale
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        if not self.uses_cnn:
            return obs.flatten(start_dim=1)
        return obs.permute(0, 3, 1, 2) if self._channels_last else obs

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        features = self.torso(self._features_input(obs))
        return self.policy_head(features), self.value_head(features).squeeze(-1)

    def dist(self, policy_params: torch.Tensor) -> Distribution:
        if not self.is_continuous:
            return Categorical(logits=policy_params, validate_args=False)
        if self._state_std:  # clamped: a std of e^-5 to e^2 keeps log-probs finite
            mean, log_std = policy_params.chunk(2, dim=-1)
            std = log_std.clamp(-5.0, 2.0).exp()
        else:
            mean, std = policy_params, self.log_std.exp().expand_as(policy_params)
        # Independent sums log_prob and entropy over the action dimensions.
        return Independent(Normal(mean, std, validate_args=False), 1, validate_args=False)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, deterministic: bool = False
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        policy_params, value = self(obs)
        if not self.is_continuous:
            # The Gumbel-max trick samples the categorical without building a Distribution,
            # which costs more than the forward pass for a small network on an actor's path.
            log_probs = torch.log_softmax(policy_params, dim=-1)
            scores = log_probs
            if not deterministic:  # -log(Exp(1)) is Gumbel noise
                scores = log_probs - torch.empty_like(log_probs).exponential_().log()
            action = scores.argmax(dim=-1)
            return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), value
        dist = self.dist(policy_params)
        action = dist.mean if deterministic else dist.sample()
        return action, dist.log_prob(action), value

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        policy_params, value = self(obs)
        if not self.is_continuous:  # the Categorical's formulas, without building one
            log_probs = torch.log_softmax(policy_params, dim=-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy, value
        dist = self.dist(policy_params)
        return dist.log_prob(actions.float()), dist.entropy(), value


class WeightCopy:
    """Copies the parameters and buffers of `src` into `dst` (same architecture) in place
    when called: much cheaper than a state_dict round trip. The tensors are listed once,
    as the copy runs once per fragment in actors and once per gradient step in learners."""

    def __init__(self, dst: nn.Module, src: nn.Module):
        self.dst = [*dst.parameters(), *dst.buffers()]
        self.src = [*src.parameters(), *src.buffers()]
        if [t.shape for t in self.dst] != [t.shape for t in self.src]:
            raise ValueError("WeightCopy: the two models have different architectures")

    @torch.no_grad()
    def __call__(self) -> None:
        for mine, theirs in zip(self.dst, self.src):
            mine.copy_(theirs)


def build_model(
    observation_space: gym.Space,
    action_space: gym.Space,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    cnn: Optional[bool] = None,
    normalize_obs: bool = False,
    normalize_value: bool = False,
    state_dependent_std: bool = False,
) -> ActorCritic:
    """Build the default actor-critic for the given spaces (see :class:`ActorCritic`)."""
    return ActorCritic(observation_space, action_space, hidden_sizes, activation, cnn,
                       normalize_obs, normalize_value, state_dependent_std)
