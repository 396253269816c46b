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

Recurrent models (``is_recurrent`` true) also have ``state_size``, ``initial_state(n)``,
``act_recurrent(obs, state, starts, deterministic)`` (``act`` plus the next state) and
``evaluate_recurrent(obs [T, B], actions, state, starts)`` (``evaluate`` over an unroll):
a state is a float tensor ``[N, state_size]``, and ``starts`` marks the observations
that begin an episode, where the state is reset first.
"""

import functools
import math
from typing import Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Bernoulli, Categorical, Distribution, Independent, Normal

from .normalize import LeafNorms, ObservationNorm, PopArt, _module_name
from .spaces import Obs, check_action_space, is_composite, leaves, tree_map

__all__ = ["ActorCritic", "MultiCategorical", "WeightCopy", "build_model", "cnn_arch_for"]

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
# Images at least this high and wide get the Nature-DQN torso; smaller ones (MinAtar's
# 10x10 grids) the small one: Nature's 8x8 stride-4 first layer needs 36x36.
_NATURE_MIN_SIDE = 36


def _orthogonal(layer: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights and zero bias, the usual actor-critic initialisation."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp_torso(in_dim: int, hidden_sizes: Sequence[int], activation: str,
               layer_norm: bool = False) -> Tuple[nn.Module, int]:
    """Fully connected torso; returns the module and its output size. With `layer_norm`
    each layer's pre-activations are normalized over its units (Ba et al. 2016) before
    the activation."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    layers = []
    for size in hidden_sizes:
        layers += [_orthogonal(nn.Linear(in_dim, size), math.sqrt(2)),
                   *([nn.LayerNorm(size)] if layer_norm else []), _ACTIVATIONS[activation]()]
        in_dim = size
    return nn.Sequential(*layers), in_dim


def cnn_arch_for(chw: Sequence[int], arch: str = "auto") -> str:
    """The CNN torso an image of shape [C, H, W] gets: `arch`, or with "auto" the
    Nature-DQN torso for images of 36x36 and more, the small one below."""
    if arch != "auto":
        return arch
    return "nature" if min(chw[1:]) >= _NATURE_MIN_SIDE else "small"


def _cnn_torso(chw: Sequence[int], arch: str = "auto") -> Tuple[nn.Module, int]:
    """A convolutional torso for [C, H, W] images:
    - "nature": Mnih et al. 2015 (Nature DQN): 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512;
    - "small": Young and Tian 2019 (MinAtar): 16 3x3/1, dense 128, for small grids."""
    arch = cnn_arch_for(chw, arch)
    if arch == "nature":
        convs = nn.Sequential(
            _orthogonal(nn.Conv2d(chw[0], 32, 8, stride=4), math.sqrt(2)), nn.ReLU(),
            _orthogonal(nn.Conv2d(32, 64, 4, stride=2), math.sqrt(2)), nn.ReLU(),
            _orthogonal(nn.Conv2d(64, 64, 3, stride=1), math.sqrt(2)), nn.ReLU(),
            nn.Flatten(),
        )
        out, least = 512, f"{_NATURE_MIN_SIDE}x{_NATURE_MIN_SIDE}"
    elif arch == "small":
        convs = nn.Sequential(_orthogonal(nn.Conv2d(chw[0], 16, 3, stride=1), math.sqrt(2)),
                              nn.ReLU(), nn.Flatten())
        out, least = 128, "3x3"
    else:
        raise ValueError(f"model.cnn_arch must be auto, nature or small, got {arch!r}")
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
    return nn.Sequential(convs, _orthogonal(nn.Linear(flat_dim, out), math.sqrt(2)), nn.ReLU()), out


def _is_image(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def _chw(shape: Sequence[int]) -> Tuple[Tuple[int, int, int], bool]:
    """([C, H, W], channels_last) of a rank-3 image shape. Images are [H, W, C] (rendered
    frames, CarRacing's 96x96x3, MinAtar's 10x10xC) unless the first axis is the shorter
    of the two ends, as in a frame stack's [4, 84, 84]."""
    channels_last = not shape[0] < shape[-1]
    return ((shape[2], shape[0], shape[1]) if channels_last else tuple(shape)), channels_last


def _vector_dim(space: gym.Space) -> int:
    """The length of a leaf's encoding as a flat vector."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return int(np.prod(space.shape))


def _encode(obs: torch.Tensor, space: gym.Space, image: bool) -> torch.Tensor:
    """A batch of one leaf's raw observations -> float torso input: [N, C, H, W] for an
    image through a CNN, else [N, D] (Discrete and MultiDiscrete one-hot, bytes scaled to
    [0, 1], everything else as float)."""
    if isinstance(space, gym.spaces.Discrete):
        return F.one_hot(obs.long() - int(space.start), int(space.n)).float()
    if isinstance(space, gym.spaces.MultiDiscrete):
        return torch.cat([F.one_hot(obs[:, i].long() - int(start), int(n)).float()  # no host-to-device copy
                          for i, (start, n) in enumerate(zip(space.start, space.nvec))], dim=-1)
    x = obs.float()
    if space.dtype == np.uint8:
        x = x * (1.0 / 255.0)
    if image:
        return x.permute(0, 3, 1, 2) if _chw(space.shape)[1] else x
    return x.flatten(start_dim=1)


class MultiInputTorso(nn.Module):
    """The torso of Dict and Tuple observations, as SB3's MultiInputPolicy builds it: each
    image leaf through a CNN of its own, the other leaves encoded as flat vectors, all
    concatenated, then the MLP."""

    def __init__(self, observation_space: gym.Space, cnn: Optional[bool], cnn_arch: str,
                 hidden_sizes: Sequence[int], activation: str, layer_norm: bool = False):
        super().__init__()
        self.leaves = leaves(observation_space)
        self.images = [path for path, space in self.leaves if _is_image(space) and cnn is not False]
        self.cnns = nn.ModuleDict()
        width = 0
        for path, space in self.leaves:
            if path in self.images:
                self.cnns[_module_name(path)], dim = _cnn_torso(_chw(space.shape)[0], cnn_arch)
            else:
                dim = _vector_dim(space)
            width += dim
        self.mlp, self.out_dim = _mlp_torso(width, hidden_sizes, activation, layer_norm)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.cnns[_module_name(path)](_encode(obs[path], space, True))
                 if path in self.images else _encode(obs[path], space, False)
                 for path, space in self.leaves]
        return self.mlp(torch.cat(parts, dim=-1))


class MultiCategorical(Distribution):
    """Independent categoricals, one per MultiDiscrete component: log_prob and entropy
    are the sums over the components."""

    arg_constraints: dict = {}

    def __init__(self, logits: torch.Tensor, nvec: Sequence[int]):
        self.parts = [Categorical(logits=chunk, validate_args=False)
                      for chunk in logits.split(list(nvec), dim=-1)]
        super().__init__(logits.shape[:-1], torch.Size([len(self.parts)]), validate_args=False)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        return torch.stack([part.sample(sample_shape) for part in self.parts], dim=-1)

    @property
    def mode(self) -> torch.Tensor:
        return torch.stack([part.probs.argmax(-1) for part in self.parts], dim=-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return sum(part.log_prob(value[..., i]) for i, part in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        return sum(part.entropy() for part in self.parts)


class ActorCritic(nn.Module):
    """Actor-critic for any common pair of spaces, its heads on one torso or on two.

    Args:
        observation_space: ``Box`` (flattened for the MLP torso; an image of rank 3,
            ``[C, H, W]`` or ``[H, W, C]``, for the CNN torso), ``Discrete`` and
            ``MultiDiscrete`` (one-hot encoded), ``MultiBinary``, or a ``Dict`` or
            ``Tuple`` of these (each image through a CNN, the rest concatenated, then the
            MLP: :class:`MultiInputTorso`).
        action_space: ``Discrete`` (categorical), ``MultiDiscrete`` (a categorical per
            component), ``MultiBinary`` (a Bernoulli per component) or a rank-1 ``Box``
            (diagonal Gaussian; samples are unclipped, the caller clips them to the
            action bounds before stepping the environment). Discrete actions are indices
            from 0; ``a3c.envs.env_action`` adds the space's ``start``.
        hidden_sizes: widths of the MLP torso layers.
        activation: ``"tanh"`` or ``"relu"`` for the MLP torso.
        cnn: CNN torso for image observations; ``None`` picks it for rank-3 ``Box``
            observations, False flattens images into the MLP.
        cnn_arch: ``"auto"`` (Nature-DQN for images of 36x36 and more, the small MinAtar
            torso below), ``"nature"`` or ``"small"``.
        normalize_obs: normalise vector observations (``Box`` leaves that do not go
            through a CNN) by running statistics: images and one-hot inputs are scaled.
        normalize_value: PopArt-normalised value head.
        state_dependent_std: Gaussian policies only: the policy head outputs a log-std per
            action dimension next to the mean, instead of one learnable ``log_std`` per
            dimension shared by all states (PPO's usual choice).
        lstm: hidden size of an LSTM core between the torso and the heads (0: none), as
            in A3C-LSTM; see ``step``, ``unroll``, ``act_recurrent`` and
            ``evaluate_recurrent``.
        shared_torso: the policy and value heads read one torso (A3C's choice); False
            gives the value head a torso of its own of the same shape, so that value
            errors do not move the policy's features (PPO's choice for continuous
            control). With an LSTM core both torsos feed the core, which the heads share.
        log_std_init: the initial log-std of a Gaussian policy (0: std 1).
        layer_norm: layer normalization before each activation of the MLP torsos.
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
        cnn_arch: str = "auto",
        lstm: int = 0,
        shared_torso: bool = True,
        log_std_init: float = 0.0,
        layer_norm: bool = False,
    ):
        super().__init__()
        check_action_space(action_space)
        leaves(observation_space)  # refuses spaces of no fixed size, in one line
        self.observation_space, self.action_space = observation_space, action_space
        self._composite = is_composite(observation_space)
        # make_torso() builds a fresh torso: the policy's, and the value's own if it has one.
        if self._composite:
            make_torso = functools.partial(MultiInputTorso, observation_space, cnn, cnn_arch, hidden_sizes,
                                           activation, layer_norm)
            self.torso = make_torso()
            feature_dim, self.uses_cnn = self.torso.out_dim, bool(self.torso.images)
            vectors = {path: tuple(space.shape) for path, space in leaves(observation_space)
                       if isinstance(space, gym.spaces.Box) and path not in self.torso.images}
            self.obs_norm = LeafNorms(vectors) if normalize_obs and vectors else None
        else:
            image = _is_image(observation_space)
            if cnn and not image:
                raise ValueError(
                    "the CNN torso needs a rank-3 Box image observation space ([C, H, W] or "
                    f"[H, W, C]), got {observation_space}")
            self.uses_cnn = image if cnn is None else bool(cnn)
            make_with_dim = functools.partial(_cnn_torso, _chw(observation_space.shape)[0], cnn_arch) \
                if self.uses_cnn else functools.partial(_mlp_torso, _vector_dim(observation_space),
                                                        hidden_sizes, activation, layer_norm)
            self.torso, feature_dim = make_with_dim()
            make_torso = lambda: make_with_dim()[0]  # noqa: E731
            box = isinstance(observation_space, gym.spaces.Box)
            self.obs_norm = ObservationNorm(observation_space.shape) \
                if normalize_obs and box and not self.uses_cnn else None

        if isinstance(action_space, gym.spaces.Box):
            self._action_kind, n_params = "gaussian", action_space.shape[0]
        elif isinstance(action_space, gym.spaces.Discrete):
            self._action_kind, n_params = "categorical", int(action_space.n)
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            self._action_kind, n_params = "multicategorical", int(action_space.nvec.sum())
            self._nvec = [int(n) for n in action_space.nvec]
        else:
            self._action_kind, n_params = "bernoulli", int(action_space.shape[0])
        # The value head's own torso (shared_torso false): `features` returns both torsos'
        # outputs side by side, and `_heads` splits them, unless a core mixes them first.
        self.value_torso = None if shared_torso else make_torso()
        self._split = feature_dim if not shared_torso and not lstm else None
        if self.value_torso is not None:
            feature_dim *= 2
        # An LSTM core between the torso and the heads (lstm > 0: its hidden size).
        self.core = nn.LSTMCell(feature_dim, lstm) if lstm else None
        feature_dim = lstm or self._split or feature_dim
        self._state_std = state_dependent_std and self.is_continuous
        self.policy_head = _orthogonal(
            nn.Linear(feature_dim, 2 * n_params if self._state_std else n_params), 0.01)
        self.value_head = _orthogonal(
            PopArt(feature_dim) if normalize_value else nn.Linear(feature_dim, 1), 1.0)
        if self.is_continuous and not self._state_std:
            self.log_std = nn.Parameter(torch.full((n_params,), float(log_std_init)))
        elif self._state_std:
            with torch.no_grad():  # the log-std half of the head's output starts there
                self.policy_head.bias[n_params:] = float(log_std_init)

    @property
    def popart(self) -> Optional[PopArt]:
        """The value layer when it normalises value targets, else None."""
        return self.value_head if isinstance(self.value_head, PopArt) else None

    @property
    def is_continuous(self) -> bool:
        return self._action_kind == "gaussian"

    @property
    def action_shape(self) -> Tuple[int, ...]:
        return () if self._action_kind == "categorical" else tuple(self.action_space.shape)

    @property
    def action_dtype(self) -> type:
        return {"gaussian": np.float32, "bernoulli": np.int8}.get(self._action_kind, np.int64)

    def _features_input(self, obs: Obs) -> Obs:
        """Raw observations of the space's dtype -> torso inputs."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs.float() if torch.is_tensor(obs) else obs)
        if self._composite:
            return obs
        return _encode(obs, self.observation_space, self.uses_cnn)

    def features(self, obs: Obs) -> torch.Tensor:
        """The torso's output [N, F] for a batch of raw observations (with a value torso,
        [N, 2F]: the policy's features, then the value's)."""
        x = self._features_input(obs)
        if self.value_torso is None:
            return self.torso(x)
        return torch.cat([self.torso(x), self.value_torso(x)], dim=-1)

    def _heads(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._split is not None:
            return self.policy_head(x[..., :self._split]), self.value_head(x[..., self._split:]).squeeze(-1)
        return self.policy_head(x), self.value_head(x).squeeze(-1)

    def forward(self, obs: Obs) -> Tuple[torch.Tensor, torch.Tensor]:
        """(policy params [N, P], value [N]). A recurrent model reads each observation
        from the initial (zero) state here; `step` and `unroll` carry a state."""
        x = self.features(obs)
        if self.core is not None:
            x = self._core(x, self.initial_state(len(x)))[0]
        return self._heads(x)

    # ---- the recurrent core ------------------------------------------------------------

    @property
    def is_recurrent(self) -> bool:
        return self.core is not None

    @property
    def state_size(self) -> int:
        """Floats in one environment's core state: h and c of the LSTM (0 without one)."""
        return 2 * self.core.hidden_size if self.core is not None else 0

    def initial_state(self, n: int) -> torch.Tensor:
        """The state [n, state_size] at the start of an episode: zeros."""
        return torch.zeros(n, self.state_size, device=self.policy_head.weight.device)

    def _core(self, x: torch.Tensor, state: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h, c = self.core(x, state.chunk(2, dim=-1))
        return h, torch.cat([h, c], dim=-1)

    def step(self, obs: Obs, state: torch.Tensor, starts: torch.Tensor
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of a recurrent model: (policy params, value, next state) for a batch of
        observations, each read from `state` [N, state_size], or from the initial state
        where `starts` [N] (bool) says the observation begins an episode."""
        state = state * (~starts).unsqueeze(-1).to(state.dtype)
        x, state = self._core(self.features(obs), state)
        return (*self._heads(x), state)

    def unroll(self, obs: Obs, state: torch.Tensor, starts: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`step` over T steps: obs [T, B, ...], state [B, state_size] before step 0,
        starts [T, B] -> (params [T, B, P], values [T, B], state after the last step).
        The torso runs once over all T * B observations; only the core steps in time."""
        T, B = starts.shape
        x = self.features(tree_map(lambda t: t.reshape(T * B, *t.shape[2:]), obs)).reshape(T, B, -1)
        keep = (~starts).unsqueeze(-1).to(x.dtype)
        outputs = []
        for t in range(T):
            h, state = self._core(x[t], state * keep[t])
            outputs.append(h)
        params, values = self._heads(torch.stack(outputs))
        return params, values, state

    # ---- acting and scoring --------------------------------------------------------------

    def dist(self, policy_params: torch.Tensor) -> Distribution:
        kind = self._action_kind
        if kind == "categorical":
            return Categorical(logits=policy_params, validate_args=False)
        if kind == "multicategorical":
            return MultiCategorical(policy_params, self._nvec)
        if kind == "bernoulli":
            return Independent(Bernoulli(logits=policy_params, validate_args=False), 1,
                               validate_args=False)
        if self._state_std:  # clamped: a std of e^-5 to e^2 keeps log-probs finite
            mean, log_std = policy_params.chunk(2, dim=-1)
            std = log_std.clamp(-5.0, 2.0).exp()
        else:
            mean, std = policy_params, self.log_std.exp().expand_as(policy_params)
        # Independent sums log_prob and entropy over the action dimensions.
        return Independent(Normal(mean, std, validate_args=False), 1, validate_args=False)

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-prob, value) for a batch of observations, without gradient."""
        policy_params, value = self(obs)
        return (*self._sample(policy_params, deterministic), value)

    @torch.no_grad()
    def act_recurrent(self, obs: Obs, state: torch.Tensor, starts: torch.Tensor,
                      deterministic: bool = False
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`act` for a recurrent model: (action, log-prob, value, next state); see `step`."""
        policy_params, value, state = self.step(obs, state, starts)
        return (*self._sample(policy_params, deterministic), value, state)

    def evaluate(self, obs: Obs, actions: torch.Tensor, with_params: bool = False
                 ) -> Tuple[torch.Tensor, ...]:
        """(log-prob, entropy, value) of `actions`, with gradient; `with_params`: and the
        policy parameters [N, P] of the same forward pass, fourth."""
        policy_params, value = self(obs)
        return (*self._score(policy_params, actions), value) + ((policy_params,) if with_params else ())

    def evaluate_recurrent(self, obs: Obs, actions: torch.Tensor, state: torch.Tensor,
                           starts: torch.Tensor
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`evaluate` over a [T, B] unroll (see `unroll`): (log-prob [T, B], entropy [T, B],
        value [T, B], state after the last step)."""
        T, B = starts.shape
        params, values, state = self.unroll(obs, state, starts)
        logp, entropy = self._score(params.reshape(T * B, -1), actions.reshape(T * B, *actions.shape[2:]))
        return logp.reshape(T, B), entropy.reshape(T, B), values, state

    def _sample(self, policy_params: torch.Tensor, deterministic: bool
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(action, log-prob) drawn from (or the mode of) the policy."""
        kind = self._action_kind
        if kind == "categorical" or kind == "multicategorical":
            # The Gumbel-max trick samples each categorical without building a
            # Distribution, which costs more than the forward pass for a small network on
            # an actor's path.
            chunks = [policy_params] if kind == "categorical" else policy_params.split(self._nvec, -1)
            actions, logp = [], 0.0
            for logits in chunks:
                log_probs = torch.log_softmax(logits, dim=-1)
                scores = log_probs
                if not deterministic:  # -log(Exp(1)) is Gumbel noise
                    scores = log_probs - torch.empty_like(log_probs).exponential_().log()
                action = scores.argmax(dim=-1)
                actions.append(action)
                logp = logp + log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
            return (actions[0] if kind == "categorical" else torch.stack(actions, dim=-1)), logp
        if kind == "bernoulli":
            if deterministic:
                action = (policy_params > 0).to(torch.int8)
            else:
                action = (torch.rand_like(policy_params) < torch.sigmoid(policy_params)).to(torch.int8)
            return action, _bernoulli_log_prob(policy_params, action)
        dist = self.dist(policy_params)
        action = dist.mean if deterministic else dist.sample()
        return action, dist.log_prob(action)

    def _score(self, policy_params: torch.Tensor, actions: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(log-prob, entropy) of `actions` under the policy, with gradient."""
        kind = self._action_kind
        if kind == "categorical" or kind == "multicategorical":  # Categorical's formulas
            chunks = [policy_params] if kind == "categorical" else policy_params.split(self._nvec, -1)
            columns = [actions] if kind == "categorical" else actions.unbind(-1)
            logp = entropy = 0.0
            for logits, action in zip(chunks, columns):
                log_probs = torch.log_softmax(logits, dim=-1)
                # Clamped: a -inf logit (a masked action) gives 0 * finite, not 0 * -inf.
                finite = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
                entropy = entropy - (log_probs.exp() * finite).sum(-1)
                logp = logp + log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            return logp, entropy
        if kind == "bernoulli":
            # sigmoid(-x), not 1 - sigmoid(x): exact for large logits too.
            entropy = -(torch.sigmoid(policy_params) * F.logsigmoid(policy_params)
                        + torch.sigmoid(-policy_params) * F.logsigmoid(-policy_params))
            return _bernoulli_log_prob(policy_params, actions), entropy.sum(-1)
        dist = self.dist(policy_params)
        return dist.log_prob(actions.float()), dist.entropy()


def _bernoulli_log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Sum over the components of log p(a_i), p = sigmoid(logits)."""
    return -F.binary_cross_entropy_with_logits(logits, actions.float(), reduction="none").sum(-1)


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
    cnn_arch: str = "auto",
    lstm: int = 0,
    shared_torso: bool = True,
    log_std_init: float = 0.0,
    layer_norm: bool = False,
) -> ActorCritic:
    """Build the default actor-critic for the given spaces (see :class:`ActorCritic`)."""
    return ActorCritic(observation_space, action_space, hidden_sizes, activation, cnn,
                       normalize_obs, normalize_value, state_dependent_std, cnn_arch, lstm,
                       shared_torso, log_std_init, layer_norm)
