"""Actor-critic networks.

:func:`a3c.models.build_model` returns an :class:`ActorCritic` suited to a pair of
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

Optional: attributes ``obs_norm`` (an :class:`~a3c.models.normalize.ObservationNorm`) and
``popart`` (a :class:`~a3c.models.normalize.PopArt`), or None; learners update them when present.

Masked models (``mask_key`` not None) read an action mask from the observation's
``"action_mask"`` entry (a3c.envs.masks) and return policy params whose invalid logits
are -inf, so that acting and scoring see only valid actions.

Recurrent models (``is_recurrent`` true) also have ``state_size``, ``initial_state(n)``,
``act_recurrent(obs, state, starts, deterministic)`` (``act`` plus the next state) and
``evaluate_recurrent(obs [T, B], actions, state, starts)`` (``evaluate`` over an unroll):
a state is a float tensor ``[N, state_size]``, and ``starts`` marks the observations
that begin an episode, where the state is reset first.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence, Tuple

import gymnasium as gym
import torch
import torch.nn as nn
from torch.distributions import Distribution

from ..envs.masks import MASK_KEY, has_mask_entry, mask_size
from ..envs.spaces import Obs, check_action_space, is_composite, leaves, tree_map
from .heads import head_for
from .normalize import LeafNorms, ObservationNorm, PopArt
from .torsos import chw, cnn_arch_for, encode, orthogonal, torso_for

__all__ = ["PRECISIONS", "ActorCritic", "native_bfloat16"]

PRECISIONS = ("float32", "bfloat16", "auto")


@functools.cache
def native_bfloat16(device: str) -> bool:
    """Whether `device` ("cpu", "cuda") computes bfloat16 matrix products in hardware: on
    the CPU, AVX-512 BF16 or AMX (oneDNN's test), where autocast halves the time of a CNN's
    update; elsewhere bfloat16 is emulated and slower than float32."""
    if device == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return False


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
            torso below), ``"nature"``, ``"impala"`` (IMPALA's residual torso) or ``"small"``.
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
        action_mask: with a Dict observation space that has an ``"action_mask"`` entry
            (a3c.envs.masks, flat: one entry per logit), mask the logits with it; the
            torso reads the other entries. False: the entry is an ordinary input.
        precision: what the torso computes in: ``"float32"``, ``"bfloat16"`` (autocast:
            matrix products and convolutions in bfloat16, the rest in float32) or
            ``"auto"`` (bfloat16 for the Nature and IMPALA CNNs on a device that computes
            it natively, see ``native_bfloat16``; MinAtar's small CNN gains nothing from
            it). The heads, and everything after them, are float32.
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
        action_mask: bool = True,
        precision: str = "float32",
    ):
        super().__init__()
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.precision = precision
        check_action_space(action_space)
        leaves(observation_space)  # refuses spaces of no fixed size, in one line
        self.observation_space, self.action_space = observation_space, action_space
        self._composite = is_composite(observation_space)
        self.mask_key = _mask_key(observation_space, action_space) if action_mask else None
        inputs = observation_space
        if self.mask_key is not None:  # the torso reads the other entries
            inputs = gym.spaces.Dict({k: v for k, v in observation_space.spaces.items() if k != self.mask_key})
        # make_torso() builds a fresh torso: the value's own, if it has one.
        self.torso, make_torso, feature_dim, self.uses_cnn = torso_for(
            inputs, cnn, cnn_arch, hidden_sizes, activation, layer_norm)
        self.obs_norm = self._observation_norm() if normalize_obs else None
        images = ([space for path, space in leaves(inputs) if path in self.torso.images] if self._composite
                  else [inputs] if self.uses_cnn else [])
        self._large_cnn = any(cnn_arch_for(chw(space.shape)[0], cnn_arch) != "small" for space in images)

        # The head (heads.py) says what the policy layer's outputs mean. A Gaussian's
        # learned log-std is made now and registered last, after the value head, where
        # checkpoints and the optimizer's statistics have always had it.
        gaussian = isinstance(action_space, gym.spaces.Box)
        log_std = nn.Parameter(torch.full(action_space.shape, float(log_std_init))) \
            if gaussian and not state_dependent_std else None
        self.head = head_for(action_space, log_std)
        # The value head's own torso (shared_torso false): `features` returns both torsos'
        # outputs side by side, and `_heads` splits them, unless a core mixes them first.
        self.value_torso = None if shared_torso else make_torso()
        self._split = feature_dim if not shared_torso and not lstm else None
        if self.value_torso is not None:
            feature_dim *= 2
        # An LSTM core between the torso and the heads (lstm > 0: its hidden size).
        self.core = nn.LSTMCell(feature_dim, lstm) if lstm else None
        feature_dim = lstm or self._split or feature_dim
        self.policy_head = orthogonal(nn.Linear(feature_dim, self.head.n_params), 0.01)
        self.value_head = orthogonal(
            PopArt(feature_dim) if normalize_value else nn.Linear(feature_dim, 1), 1.0)
        if log_std is not None:
            self.log_std = log_std
        elif gaussian:
            with torch.no_grad():  # the log-std half of the head's output starts there
                self.policy_head.bias[self.head.dim:] = float(log_std_init)

    def _observation_norm(self) -> LeafNorms | ObservationNorm | None:
        """The running normalization of the observations that are vectors (a Box's, or a
        Dict's Box leaves not read by a CNN): images and one-hot inputs are scaled already."""
        space = self.observation_space
        if self._composite:
            vectors = {path: tuple(leaf.shape) for path, leaf in leaves(space)
                       if isinstance(leaf, gym.spaces.Box) and path not in self.torso.images}
            return LeafNorms(vectors) if vectors else None
        return ObservationNorm(space.shape) if isinstance(space, gym.spaces.Box) and not self.uses_cnn else None

    @property
    def popart(self) -> Optional[PopArt]:
        """The value layer when it normalises value targets, else None."""
        return self.value_head if isinstance(self.value_head, PopArt) else None

    @property
    def is_continuous(self) -> bool:
        return self.head.is_continuous

    @property
    def action_shape(self) -> Tuple[int, ...]:
        return self.head.action_shape

    @property
    def action_dtype(self) -> type:
        return self.head.action_dtype

    def _features_input(self, obs: Obs) -> Obs:
        """Raw observations of the space's dtype -> torso inputs."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs.float() if torch.is_tensor(obs) else obs)
        if self._composite:
            return obs
        return encode(obs, self.observation_space, self.uses_cnn)

    def torso_dtype(self, device: torch.device | str) -> torch.dtype:
        """What the torso computes in on `device` (`precision` resolved there)."""
        device = torch.device(device).type
        if self.precision == "bfloat16" or (self.precision == "auto" and self._large_cnn and native_bfloat16(device)):
            return torch.bfloat16
        return torch.float32

    def features(self, obs: Obs) -> torch.Tensor:
        """The torso's output [N, F] (float32) for a batch of raw observations (with a value
        torso, [N, 2F]: the policy's features, then the value's)."""
        device = self.policy_head.weight.device.type
        dtype = self.torso_dtype(device)
        with torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32):
            x = self._features_input(obs)
            if self.value_torso is None:
                features = self.torso(x)
            else:
                features = torch.cat([self.torso(x), self.value_torso(x)], dim=-1)
        return features.float()

    def _heads(self, x: torch.Tensor, obs: Obs) -> Tuple[torch.Tensor, torch.Tensor]:
        """(policy params, value) from features [..., F], the params masked by `obs`'s
        action mask (of the same leading shape) when the model reads one."""
        if self._split is not None:
            params, value = self.policy_head(x[..., :self._split]), self.value_head(x[..., self._split:])
        else:
            params, value = self.policy_head(x), self.value_head(x)
        if self.mask_key is not None:
            params = self.head.masked(params, obs[self.mask_key])
        return params, value.squeeze(-1)

    def forward(self, obs: Obs) -> Tuple[torch.Tensor, torch.Tensor]:
        """(policy params [N, P], value [N]). A recurrent model reads each observation
        from the initial (zero) state here; `step` and `unroll` carry a state."""
        x = self.features(obs)
        if self.core is not None:
            x = self._core(x, self.initial_state(len(x)))[0]
        return self._heads(x, obs)

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
        return (*self._heads(x, obs), state)

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
        params, values = self._heads(torch.stack(outputs), obs)
        return params, values, state

    # ---- acting and scoring --------------------------------------------------------------

    def dist(self, policy_params: torch.Tensor) -> Distribution:
        return self.head.dist(policy_params)

    @torch.no_grad()
    def act(self, obs: Obs, deterministic: bool = False
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(action, log-prob, value) for a batch of observations, without gradient."""
        policy_params, value = self(obs)
        return (*self.head.sample(policy_params, deterministic), value)

    @torch.no_grad()
    def act_recurrent(self, obs: Obs, state: torch.Tensor, starts: torch.Tensor,
                      deterministic: bool = False
                      ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`act` for a recurrent model: (action, log-prob, value, next state); see `step`."""
        policy_params, value, state = self.step(obs, state, starts)
        return (*self.head.sample(policy_params, deterministic), value, state)

    def evaluate(self, obs: Obs, actions: torch.Tensor, with_params: bool = False
                 ) -> Tuple[torch.Tensor, ...]:
        """(log-prob, entropy, value) of `actions`, with gradient; `with_params`: and the
        policy parameters [N, P] of the same forward pass, fourth."""
        policy_params, value = self(obs)
        return (*self.head.score(policy_params, actions), value) + ((policy_params,) if with_params else ())

    def evaluate_recurrent(self, obs: Obs, actions: torch.Tensor, state: torch.Tensor,
                           starts: torch.Tensor
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`evaluate` over a [T, B] unroll (see `unroll`): (log-prob [T, B], entropy [T, B],
        value [T, B], state after the last step)."""
        T, B = starts.shape
        params, values, state = self.unroll(obs, state, starts)
        logp, entropy = self.head.score(params.reshape(T * B, -1), actions.reshape(T * B, *actions.shape[2:]))
        return logp.reshape(T, B), entropy.reshape(T, B), values, state


def _mask_key(observation_space: gym.Space, action_space: gym.Space) -> str | None:
    """"action_mask" when the observations carry a mask (a3c.envs.masks) that fits the
    actions' logits, None when they carry none; a mask that cannot fit is a ValueError."""
    if not has_mask_entry(observation_space):
        return None
    mask, size = observation_space.spaces[MASK_KEY], mask_size(action_space)
    if not isinstance(mask, (gym.spaces.MultiBinary, gym.spaces.Box)) or tuple(mask.shape) != (size,):
        raise ValueError(f"the observation's 'action_mask' entry is {mask}, where {action_space} needs a "
                         f"flat mask of {size} entries; make it one (a3c.envs.masks.ActionMasked does)")
    return MASK_KEY
