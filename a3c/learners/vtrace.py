"""V-trace off-policy actor-critic targets.

Implements the V-trace targets of IMPALA (Espeholt et al., 2018, "IMPALA:
Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures", arXiv:1802.01561), Section 4.1, eq. (1) and Remark 1:

    v_s = V(x_s) + sum_{t=s}^{s+n-1} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t V
    delta_t V = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t)),  c_i = min(c_bar, pi / mu)

computed with the backward recursion of Remark 1:

    v_s - V(x_s) = delta_s V + gamma c_s (v_{s+1} - V(x_{s+1})).

The paper's lambda variant (as in Retrace(lambda)) mixes in shorter returns:
c_i = lambda min(c_bar, pi / mu); on-policy, v_s is then the TD(lambda) return of
GAE (Schulman et al. 2016), which trades variance for bias as asynchronous PPO does.

The policy-gradient advantage (Section 4.2) is

    rho_s^pg (r_s + gamma v_{s+1} - V(x_s)),  rho_s^pg = min(rho_bar^pg, pi / mu).

As in the reference implementation (deepmind/scalable_agent), gamma is
given per step as ``discounts`` (typically gamma * (1 - terminated)), so a
zero discount cuts the bootstrap at episode boundaries, and c_bar = 1.

All tensors are time-major: [T, B] for per-step quantities, [B] for the
bootstrap value V(x_T). Targets are computed without gradient.
"""

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

__all__ = [
    "VTraceReturns",
    "VTraceFromLogitsReturns",
    "clipped_ratio",
    "from_importance_weights",
    "from_logits",
]


class VTraceReturns(NamedTuple):
    vs: torch.Tensor  # [T, B] V-trace value targets v_s
    pg_advantages: torch.Tensor  # [T, B] clipped-IS policy-gradient advantages
    advantages: torch.Tensor  # [T, B] r_s + gamma v_{s+1} - V(x_s), without the IS weight


class VTraceFromLogitsReturns(NamedTuple):
    vs: torch.Tensor
    pg_advantages: torch.Tensor
    advantages: torch.Tensor
    log_rhos: torch.Tensor  # [T, B] log pi(a|x) - log mu(a|x)
    behaviour_action_log_probs: torch.Tensor  # [T, B] log mu(a|x)
    target_action_log_probs: torch.Tensor  # [T, B] log pi(a|x)


def _check_shape(name: str, tensor: torch.Tensor, expected: tuple) -> None:
    """Raise a ValueError naming ``name`` if its shape differs from ``expected``."""
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(
            f"vtrace: `{name}` must have shape {tuple(expected)}, got {tuple(tensor.shape)}"
        )


def clipped_ratio(log_rhos: torch.Tensor, threshold: Optional[float]) -> torch.Tensor:
    """min(threshold, exp(log_rhos)); no clipping when threshold is None."""
    rhos = torch.exp(log_rhos)
    return rhos if threshold is None else torch.clamp(rhos, max=threshold)


@torch.no_grad()
def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    td_lambda: float = 1.0,
) -> VTraceReturns:
    """V-trace targets from log importance ratios log(pi(a_t|x_t) / mu(a_t|x_t)).

    Args:
        log_rhos: [T, B] log importance ratios of the taken actions.
        discounts: [T, B] per-step discount, gamma * (1 - terminated_t).
        rewards: [T, B] rewards r_t.
        values: [T, B] value estimates V(x_t) under the target policy.
        bootstrap_value: [B] value estimate V(x_T) after the last step.
        clip_rho_threshold: rho_bar of eq. (1); None disables clipping.
        clip_pg_rho_threshold: rho_bar^pg for the advantages; None disables clipping.
        td_lambda: the trace lambda, in [0, 1]; the traces are c_i = lambda min(1, rho_i).

    Returns:
        VTraceReturns(vs [T, B], pg_advantages [T, B], advantages [T, B]).
    """
    if log_rhos.dim() != 2:
        raise ValueError(
            f"vtrace: `log_rhos` must have shape [T, B], got {tuple(log_rhos.shape)}"
        )
    shape = tuple(log_rhos.shape)
    _check_shape("discounts", discounts, shape)
    _check_shape("rewards", rewards, shape)
    _check_shape("values", values, shape)
    _check_shape("bootstrap_value", bootstrap_value, shape[1:])

    rhos = clipped_ratio(log_rhos, clip_rho_threshold)
    cs = td_lambda * clipped_ratio(log_rhos, 1.0)  # c_bar = 1, times lambda

    # V(x_{t+1}) for every step, with V(x_T) = bootstrap_value.
    next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = rhos * (rewards + discounts * next_values - values)

    # Backward recursion of Remark 1 on the corrections v_t - V(x_t).
    corrections = torch.zeros_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        corrections[t] = acc
    vs = values + corrections

    # Policy-gradient advantages use v_{t+1}, again bootstrapped by V(x_T).
    next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    advantages = rewards + discounts * next_vs - values
    pg_rhos = clipped_ratio(log_rhos, clip_pg_rho_threshold)
    return VTraceReturns(vs=vs, pg_advantages=pg_rhos * advantages, advantages=advantages)


@torch.no_grad()
def from_logits(
    behaviour_policy_logits: torch.Tensor,
    target_policy_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    td_lambda: float = 1.0,
) -> VTraceFromLogitsReturns:
    """V-trace targets for categorical policies given their logits.

    Args:
        behaviour_policy_logits: [T, B, A] logits of the acting policy mu.
        target_policy_logits: [T, B, A] logits of the learner policy pi.
        actions: [T, B] int64 actions taken by mu.
        discounts, rewards, values, bootstrap_value, clip_*, td_lambda: as in
            :func:`from_importance_weights`.

    Returns:
        VTraceFromLogitsReturns with the targets, the log ratios and the
        action log-probabilities under both policies.
    """
    if target_policy_logits.dim() != 3:
        raise ValueError(
            "vtrace: `target_policy_logits` must have shape [T, B, A], "
            f"got {tuple(target_policy_logits.shape)}"
        )
    _check_shape("behaviour_policy_logits", behaviour_policy_logits, target_policy_logits.shape)
    _check_shape("actions", actions, target_policy_logits.shape[:2])

    def action_log_probs(logits: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    behaviour_log_probs = action_log_probs(behaviour_policy_logits)
    target_log_probs = action_log_probs(target_policy_logits)
    log_rhos = target_log_probs - behaviour_log_probs
    vs, pg_advantages, advantages = from_importance_weights(
        log_rhos, discounts, rewards, values, bootstrap_value,
        clip_rho_threshold, clip_pg_rho_threshold, td_lambda,
    )
    return VTraceFromLogitsReturns(
        vs=vs,
        pg_advantages=pg_advantages,
        advantages=advantages,
        log_rhos=log_rhos,
        behaviour_action_log_probs=behaviour_log_probs,
        target_action_log_probs=target_log_probs,
    )
