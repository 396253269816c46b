"""Policy heads: one class per kind of action space, each saying how the policy layer's
outputs (its *parameters*, [N, P]) become actions, log-probabilities and entropies.

    Discrete        CategoricalHead        logits [N, n]
    MultiDiscrete   MultiCategoricalHead   logits of each component, side by side [N, sum(nvec)]
    MultiBinary     BernoulliHead          a logit per component [N, n]
    Box (rank 1)    GaussianHead           means [N, A], then log-stds [N, A] when they depend
                                           on the state (else one learned log-std per dimension)

A head holds no layer of its own: the policy layer and a Gaussian's learned log-std are
the model's (`ActorCritic.policy_head`, `ActorCritic.log_std`), so that their names in a
checkpoint, and their order in the optimizer's statistics, do not depend on the head.
Actions are indices from 0 for the discrete heads (a3c.envs.env_action adds the space's
`start`); a Gaussian's samples are unbounded (env_action clips them to the bounds).
"""
from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch.distributions import Bernoulli, Categorical, Distribution, Independent, Normal

from ..envs.spaces import check_action_space

__all__ = ["BernoulliHead", "CategoricalHead", "GaussianHead", "Head", "MultiCategorical",
           "MultiCategoricalHead", "head_for"]


class Head:
    """The interface of every head. `n_params`: the policy layer's outputs per state;
    `action_shape` and `action_dtype`: one action, as a fragment stores it."""

    is_continuous = False
    n_params: int
    action_shape: tuple[int, ...]
    action_dtype: type

    def dist(self, params: torch.Tensor) -> Distribution:
        """The action distribution; its log_prob and entropy give one value per row [N]."""
        raise NotImplementedError

    def sample(self, params: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log-prob [N]) drawn from the policy, or its mode when `deterministic`."""
        raise NotImplementedError

    def score(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-prob [N], entropy [N]) of `actions`, with gradient."""
        raise NotImplementedError

    def masked(self, params: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`params` with the actions that `mask` (flat, 0 where invalid) rules out made
        impossible; only heads of discrete actions take masks (a3c.envs.masks)."""
        raise ValueError(f"{type(self).__name__} takes no action mask")


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


class MultiCategoricalHead(Head):
    """A categorical per component of a MultiDiscrete space (`nvec`), sampled and scored
    with Categorical's formulas on each component's logits, without building a
    Distribution: on an actor's path that costs more than a small network's forward pass."""

    action_dtype = np.int64

    def __init__(self, nvec: Sequence[int]):
        self.nvec = [int(n) for n in nvec]
        self.n_params = sum(self.nvec)
        self.action_shape = (len(self.nvec),)

    def _logits(self, params: torch.Tensor) -> Sequence[torch.Tensor]:
        return params.split(self.nvec, -1)

    def masked(self, params: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # -inf: an invalid action's probability is exactly 0, and so is its gradient.
        return params.masked_fill(mask == 0, float("-inf"))

    def _action(self, columns: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(columns, dim=-1)

    def _columns(self, actions: torch.Tensor) -> Sequence[torch.Tensor]:
        return actions.unbind(-1)

    def dist(self, params: torch.Tensor) -> Distribution:
        return MultiCategorical(params, self.nvec)

    def sample(self, params: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        columns, logp = [], 0.0
        for logits in self._logits(params):
            log_probs = torch.log_softmax(logits, dim=-1)
            scores = log_probs
            if not deterministic:  # the Gumbel-max trick: -log(Exp(1)) is Gumbel noise
                scores = log_probs - torch.empty_like(log_probs).exponential_().log()
            action = scores.argmax(dim=-1)
            columns.append(action)
            logp = logp + log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return self._action(columns), logp

    def score(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp = entropy = 0.0
        for logits, action in zip(self._logits(params), self._columns(actions)):
            log_probs = torch.log_softmax(logits, dim=-1)
            # Clamped: a -inf logit (a masked action) gives 0 * finite, not 0 * -inf.
            finite = log_probs.clamp(min=torch.finfo(log_probs.dtype).min)
            entropy = entropy - (log_probs.exp() * finite).sum(-1)
            logp = logp + log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return logp, entropy


class CategoricalHead(MultiCategoricalHead):
    """A categorical over a Discrete space's `n` actions: one component, actions [N]."""

    def __init__(self, n: int):
        super().__init__([n])
        self.action_shape = ()

    def _logits(self, params: torch.Tensor) -> Sequence[torch.Tensor]:
        return [params]

    def _action(self, columns: list[torch.Tensor]) -> torch.Tensor:
        return columns[0]

    def _columns(self, actions: torch.Tensor) -> Sequence[torch.Tensor]:
        return [actions]

    def dist(self, params: torch.Tensor) -> Distribution:
        return Categorical(logits=params, validate_args=False)


class BernoulliHead(Head):
    """A Bernoulli per component of a MultiBinary space, from one logit each."""

    action_dtype = np.int8

    def __init__(self, n: int):
        self.n_params, self.action_shape = int(n), (int(n),)

    def dist(self, params: torch.Tensor) -> Distribution:
        return Independent(Bernoulli(logits=params, validate_args=False), 1, validate_args=False)

    def sample(self, params: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if deterministic:
            action = (params > 0).to(torch.int8)
        else:
            action = (torch.rand_like(params) < torch.sigmoid(params)).to(torch.int8)
        return action, _bernoulli_log_prob(params, action)

    def score(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # sigmoid(-x), not 1 - sigmoid(x): exact for large logits too.
        entropy = -(torch.sigmoid(params) * F.logsigmoid(params)
                    + torch.sigmoid(-params) * F.logsigmoid(-params))
        return _bernoulli_log_prob(params, actions), entropy.sum(-1)


def _bernoulli_log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Sum over the components of log p(a_i), p = sigmoid(logits)."""
    return -F.binary_cross_entropy_with_logits(logits, actions.float(), reduction="none").sum(-1)


class GaussianHead(Head):
    """A diagonal Gaussian over a rank-1 Box space of `dim` dimensions. With `log_std` (the
    model's learned parameter [dim], shared by all states) the parameters are the means;
    without it they are the means, then a log-std per dimension, clamped to [-5, 2] so
    that log-probabilities stay finite.

    `log_std` is held by reference: copies of the model (deepcopy, pickling, `.to()`,
    `share_memory()`) keep the head and the model's parameter one tensor."""

    is_continuous = True
    action_dtype = np.float32

    def __init__(self, dim: int, log_std: torch.Tensor | None = None):
        self.log_std, self.dim = log_std, int(dim)
        self.n_params = self.dim if log_std is not None else 2 * self.dim
        self.action_shape = (self.dim,)

    def dist(self, params: torch.Tensor) -> Distribution:
        if self.log_std is None:
            mean, log_std = params.chunk(2, dim=-1)
            std = log_std.clamp(-5.0, 2.0).exp()
        else:
            mean, std = params, self.log_std.exp().expand_as(params)
        # Independent sums log_prob and entropy over the action dimensions.
        return Independent(Normal(mean, std, validate_args=False), 1, validate_args=False)

    def sample(self, params: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.dist(params)
        action = dist.mean if deterministic else dist.sample()
        return action, dist.log_prob(action)

    def score(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dist = self.dist(params)
        return dist.log_prob(actions.float()), dist.entropy()


def head_for(space: gym.Space, log_std: torch.Tensor | None = None) -> Head:
    """The head of an action space (refused in one line if it has none). `log_std`: a
    Box's learned log-std, shared by all states (None: a log-std per state)."""
    check_action_space(space)
    if isinstance(space, gym.spaces.Box):
        return GaussianHead(space.shape[0], log_std)
    if isinstance(space, gym.spaces.Discrete):
        return CategoricalHead(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategoricalHead(space.nvec)
    return BernoulliHead(space.shape[0])
