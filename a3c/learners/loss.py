"""The loss: IMPALA's V-trace actor-critic loss, or PPO's clipped objective on V-trace
advantages, as pure functions of a model, a batch and the config.

`compute_loss` is what a learner differentiates; `batch_targets` and `step_minibatches`
compute V-trace's targets ahead of the minibatches that use them.
"""
from __future__ import annotations

from typing import NamedTuple

import gymnasium as gym
import torch

from ..config import Config
from ..envs.spaces import tree_map
from . import vtrace
from .batch import Batch, step_parts

__all__ = ["Loss", "LossStats", "approx_kl", "batch_targets", "compute_loss", "evaluate_batch",
           "mean_excess", "step_minibatches", "vtrace_returns"]


class LossStats(NamedTuple):
    """0-dim tensors without gradient, on the batch's device: a learner reads them once
    per batch, not once per gradient step, so that a step never waits for the device."""
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    clip_fraction: torch.Tensor  # share of steps whose ratio pi/mu lies outside the clip range
    explained_variance: torch.Tensor  # 1 - Var(targets - values) / Var(targets): 1 is a perfect V
    approx_kl: torch.Tensor  # KL(mu || pi) estimated from the steps' log pi/mu (Schulman's k3)


class Loss(NamedTuple):
    total: torch.Tensor  # scalar, with gradient
    stats: LossStats
    value_targets: torch.Tensor  # [T, B] V-trace targets v_s, without gradient
    logp: torch.Tensor  # [T, B] log pi of the batch's actions, without gradient


def evaluate_batch(model: torch.nn.Module, batch: Batch, with_params: bool = False
                   ) -> tuple[torch.Tensor, ...]:
    """The current policy on a batch: log-probs, entropies and values [T, B] (with
    gradient), and the bootstrap values of last_obs [B] (without). A recurrent model
    unrolls each fragment from the state the actor acted from, resetting where an
    episode ended inside it, and reads last_obs from the state after the last step.

    `with_params` (a feedforward model): the policy parameters [T * B, P] of the same
    forward pass are returned fifth (for `mean_excess`), so that they cost no second pass.
    A batch without bootstrap_obs (a minibatch of steps, or a batch whose log-probs alone
    are wanted) has no bootstrap values (None)."""
    T, B = batch.reward.shape
    if batch.state is not None:
        done = batch.terminated | batch.truncated
        starts = torch.cat([torch.zeros_like(done[:1]), done[:-1]])  # obs[t] begins an episode
        logp, entropy, values, state = model.evaluate_recurrent(batch.obs, batch.action,
                                                                batch.state, starts)
        bootstrap_value = None
        if batch.bootstrap_obs is not None:
            with torch.no_grad():
                _, bootstrap_value, _ = model.step(batch.bootstrap_obs, state, done[-1])
        return logp, entropy, values, bootstrap_value
    obs = tree_map(lambda x: x.reshape(T * B, *x.shape[2:]), batch.obs)
    action = batch.action.reshape(T * B, *batch.action.shape[2:])
    keyword = {"with_params": True} if with_params else {}  # a user's model need not take it unasked
    logp, entropy, values, *params = model.evaluate(obs, action, **keyword)
    logp, entropy, values = (x.reshape(T, B) for x in (logp, entropy, values))
    bootstrap_value = None
    if batch.bootstrap_obs is not None:
        with torch.no_grad():
            _, bootstrap_value = model(batch.bootstrap_obs)
    return (logp, entropy, values, bootstrap_value, *params)


def compute_loss(model: torch.nn.Module, batch: Batch, cfg: Config,
                 returns: vtrace.VTraceReturns | None = None) -> Loss:
    """IMPALA's actor-critic loss with V-trace targets (Espeholt et al. 2018, eq. 1-2), or,
    with `learners.clip_coef`, PPO's clipped objective on V-trace advantages as in
    asynchronous PPO (Schulman et al. 2017, eq. 7; the ratio is pi over the behaviour
    policy mu, whose data may be a few updates old). A batch with `prox_logp` (a learner
    with `learners.proximal_decay` gives it one) centres the clip on that proximal policy
    instead, PPO-EWMA's objective (Hilton et al. 2022): see ProximalPolicy.

    The targets come from the same forward pass as the loss, or, given `returns` (a
    minibatch of steps, see `step_minibatches`, or any minibatch with
    `learners.fixed_targets`, see `batch_targets`), were computed beforehand."""
    bound = cfg.learners.bound_coef  # a feedforward Gaussian policy (checked when a run starts)
    logp, entropy, values, bootstrap_value, *params = evaluate_batch(model, batch, with_params=bool(bound))
    log_rhos = logp.detach() - batch.logp  # log pi/mu, [T, B]
    if returns is None:
        if bootstrap_value is None:
            raise ValueError("compute_loss: a minibatch of steps needs its V-trace returns, "
                             "as step_minibatches gives them")
        returns = vtrace_returns(batch, log_rhos, values.detach(), bootstrap_value, cfg)
    # With PopArt, value errors and advantages are judged against the value scale, the
    # spread of the value targets (see _value_scale).
    scale = _value_scale(model, cfg.learners.value_scale_floor)
    floor = 0.0 if scale is None else cfg.learners.advantage_std_floor * scale
    normalize = cfg.learners.normalize_advantages
    clip = cfg.learners.clip_coef
    if clip is None:
        advantages = _normalized(returns.pg_advantages, normalize, floor)
        policy_loss = -(logp * advantages).mean()
        clip_fraction = torch.zeros((), device=policy_loss.device)
    else:
        # PPO-EWMA (learners.proximal_decay): the clip centred on the proximal policy, each
        # step weighted by proximal/behaviour, capped as V-trace caps its policy gradient.
        advantages = _normalized(returns.advantages, normalize, floor)
        centre = batch.logp if batch.prox_logp is None else batch.prox_logp
        ratio = torch.exp(logp - centre)
        surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
        if batch.prox_logp is not None:
            surrogate = surrogate * vtrace.clipped_ratio(centre - batch.logp, cfg.vtrace.clip_pg_rho_threshold)
        policy_loss = -surrogate.mean()
        clip_fraction = ((ratio - 1).abs() > clip).float().mean()
    # With PopArt the value error is measured in units of the value scale, so that
    # returns of -500 weigh no more in the loss than returns of 1.
    value_loss = 0.5 * ((returns.vs - values) / (1.0 if scale is None else scale)).pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + cfg.learners.vf_coef * value_loss - cfg.learners.ent_coef * entropy_mean
    if bound:
        loss = loss + bound * mean_excess(params[0], model.action_space).mean()
    stats = LossStats(policy_loss.detach(), value_loss.detach(), entropy_mean.detach(), clip_fraction,
                      _explained_variance(returns.vs, values.detach()), approx_kl(log_rhos))
    return Loss(loss, stats, returns.vs, logp.detach())


def batch_targets(model: torch.nn.Module, batch: Batch, cfg: Config) -> vtrace.VTraceReturns:
    """V-trace's targets and advantages [T, B] for a batch of whole fragments, from `model`
    as it is now (without gradient)."""
    with torch.no_grad():
        logp, _, values, bootstrap_value = evaluate_batch(model, batch)
        return vtrace_returns(batch, logp - batch.logp, values, bootstrap_value, cfg)


def vtrace_returns(batch: Batch, log_rhos: torch.Tensor, values: torch.Tensor,
                   bootstrap_value: torch.Tensor, cfg: Config) -> vtrace.VTraceReturns:
    """V-trace's targets and advantages [T, B] for a batch of whole fragments, from the
    log-ratios log pi/mu and the values of the current policy [T, B] (without gradient)."""
    gamma = cfg.learners.gamma
    discounts = gamma * (~(batch.terminated | batch.truncated)).float()  # no bootstrap across an episode's end
    clip = cfg.learners.reward_clip  # for learning only: the actors report the game's returns
    rewards = batch.reward if clip is None else batch.reward.clamp(-clip, clip)
    # A time limit is not a terminal state: bootstrap it from its final observation.
    rewards = rewards + gamma * batch.trunc_value * batch.truncated.float()
    return vtrace.from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=cfg.vtrace.clip_rho_threshold,
        clip_pg_rho_threshold=cfg.vtrace.clip_pg_rho_threshold,
        td_lambda=cfg.vtrace.td_lambda,
    )


def mean_excess(policy_params: torch.Tensor, space: gym.spaces.Box) -> torch.Tensor:
    """How far a Gaussian policy's means lie beyond the bounds of `space` [N]: the
    squared distance outside [low, high] in half-widths of the range, summed over the
    action's dimensions (0 inside the bounds, and for a dimension with an infinite bound).
    `policy_params` [N, P] are the model's: the means, then a state-dependent std's log-stds.

    The actors clip the samples to the bounds, so every sample past a bound acts alike:
    once a mean is past one, the advantages of its samples say nothing about where it
    should go, nothing pulls it back, and it drifts on while the samples it clips stop
    exploring. On Hopper-v5 with two passes and replay, a third of the means' components
    were past a bound after 300 k steps."""
    low, high = (torch.as_tensor(bound, dtype=policy_params.dtype, device=policy_params.device)
                 for bound in (space.low, space.high))
    finite = torch.isfinite(low) & torch.isfinite(high)
    center = torch.where(finite, (low + high) / 2, 0.0)
    half = torch.where(finite, (high - low) / 2, 1.0)
    mean = policy_params[:, :low.numel()]
    excess = ((mean - center).abs() / half - 1).clamp(min=0) * finite
    return excess.pow(2).sum(-1)


def approx_kl(log_rhos: torch.Tensor) -> torch.Tensor:
    """KL(mu || pi) of the acting policy mu and the learner's pi, estimated from the
    log-ratios log pi/mu of actions mu sampled: the mean of (rho - 1) - log rho, which is
    unbiased and never negative (Schulman 2020, "Approximating KL divergence", k3). A
    ratio is taken at most e^20, so that one sample far off the acting policy leaves the
    chart finite (exp overflows float32 past e^88)."""
    log_rhos = log_rhos.clamp(max=20.0)
    return (log_rhos.exp() - 1 - log_rhos).mean()


def _explained_variance(targets: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """1 - Var(targets - values) / Var(targets): the share of the targets' spread that the
    values account for (1: exact; 0: no better than their mean; below 0: worse). The
    targets' variance is floored at 1e-8, so that a minibatch of equal targets reads
    1 when the values match them rather than not a number."""
    return 1 - (targets - values).var(correction=0) / targets.var(correction=0).clamp(min=1e-8)


def _value_scale(model: torch.nn.Module, floor: float) -> torch.Tensor | None:
    """The unit of value errors and advantages: PopArt's std of the value targets, but no
    less than `floor` times the magnitude of their mean (None without PopArt).

    Once a task is solved its targets can all be nearly the same: CartPole's are all
    about 1 / (1 - gamma) = 100, with a std that falls to PopArt's 0.01 floor. Measured
    in such units, value errors of 0.02 made the value loss 10^4 times larger, its
    gradient 200-2500 times the norm clip, so that the clip shrank the policy's gradient
    as much; Adam's second moments shrank with it, and the first failed episode, which
    spreads the targets again, gave the policy its full gradient at steps several times
    the learning rate: the solved policy collapsed."""
    popart = getattr(model, "popart", None)
    if popart is None:
        return None
    mean, std = popart.stats()
    return torch.maximum(std, floor * mean.abs())


def _normalized(advantages: torch.Tensor, normalize: bool,
                floor: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Advantages less their mean, divided by their std, but by no less than `floor`.

    Once the values are accurate, the advantages of a solved policy are small noise;
    scaled up to unit std they moved the policy as far per step as real advantages do,
    and it drifted off (on CartPole: the cart drifting out of bounds late in an episode).
    Below the floor they keep their size, and steps stay in proportion to what they say."""
    if not normalize:
        return advantages
    std = advantages.std()
    # A float floor stays on the host: making it a device tensor would wait for the device.
    std = torch.maximum(std, floor) if torch.is_tensor(floor) else std.clamp(min=floor)
    return (advantages - advantages.mean()) / (std + 1e-8)


def step_minibatches(model: torch.nn.Module, batch: Batch, cfg: Config,
                     returns: vtrace.VTraceReturns | None = None
                     ) -> list[tuple[Batch, vtrace.VTraceReturns]]:
    """A pass over `batch` in `learners.minibatches` random parts of single steps drawn
    from all its fragments, as PPO's minibatches are drawn from all over its rollout:
    each a Batch [1, N] without bootstrap observations, with its V-trace targets [1, N].

    V-trace runs along a fragment, which a part no longer holds, so the targets are
    computed first, over the whole batch, with `model` as it is at the start of the pass,
    unless given (`returns` [T, B], see `batch_targets`). PPO computes its advantages
    before its minibatches too, once per rollout. Each part's advantages are then
    normalized within it. A feedforward model only: a recurrent one unrolls whole
    fragments."""
    if batch.state is not None:
        raise ValueError("step_minibatches: a recurrent model's batch is split by fragments "
                         "(learners.minibatch_split: fragments)")
    if returns is None:
        returns = batch_targets(model, batch, cfg)
    return step_parts(batch, returns, cfg.learners.minibatches)
