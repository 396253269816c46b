"""Learners: pop batches of fragments, compute the V-trace actor-critic loss, and apply
lock-free (Hogwild) updates to the shared model.

`compute_loss` is a pure function of a model and a batch; `run_learner` is the loop
around it, the same for learner threads and learner processes (`learners.mode`): a
`BatchSource` gets the next batch (fresh, or replayed), an `Updater` trains on it. What a
learner reports goes through shared memory (the counters, and a queue of STEP_DTYPE
records for the monitor), so it does not matter which process it runs in.
"""
from __future__ import annotations

import copy
import queue
import signal
import threading
import time
import weakref
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters, ReplayBuffer

from . import vtrace
from .actor import JOIN_TIMEOUT_S, end_with_parent
from .config import Config
from .model import WeightCopy
from .optim import SharedOptimizer, build_optimizer
from .spaces import Obs, tree_map

__all__ = ["Batch", "BatchSource", "DeviceCopy", "Learners", "Loss", "LossStats", "ProximalPolicy", "STEP_DTYPE",
           "Updater", "batch_from_fragments", "batch_targets", "compute_loss", "evaluate_batch", "join_learner",
           "mean_excess", "proximal_average", "replay_buffer", "run_learner", "start_learners", "statistics_lock",
           "step_minibatches", "step_queue", "vtrace_returns"]


class Batch(NamedTuple):
    """A batch of B fragments as [T, B, ...] tensors (bootstrap_obs is [B, ...]). The
    observations of a Dict or Tuple space are a dict of such tensors, one per leaf."""

    obs: Obs
    action: torch.Tensor
    reward: torch.Tensor
    logp: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    trunc_value: torch.Tensor
    version: torch.Tensor
    bootstrap_obs: Obs
    state: torch.Tensor | None = None  # [B, state_size]: a recurrent policy's state at obs[0]
    # [T, B]: log pi of the learner's policy before this batch's first gradient step (with
    # learners.target_kl, which bounds how far an update moves it from there).
    start_logp: torch.Tensor | None = None
    # [T, B]: log pi of the learners' proximal average (learners.proximal_decay), the centre of the clip.
    prox_logp: torch.Tensor | None = None


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


def batch_from_fragments(fragments: np.ndarray, device: torch.device | str = "cpu",
                         whole: bool | None = None) -> Batch:
    """Fragments [B] of the actor's dtype -> time-major tensors [T, B, ...] on `device`.

    On the CPU each field is copied out of the record array once (fields are strided).
    For an accelerator (or `whole`) the records go over whole, in one transfer
    (asynchronous when they lie in pinned memory, as a learner's batches do), and each
    field is cut out of them there: one host-to-device copy per batch, not one per field."""
    device = torch.device(device)
    if not (device.type != "cpu" if whole is None else whole):
        def column(*path: str) -> torch.Tensor:
            array = fragments
            for name in path:
                array = array[name]
            # A copy, always: numpy calls a field of one record contiguous whatever its
            # strides, which torch cannot take.
            return torch.from_numpy(np.array(array, order="C"))
    else:
        raw = torch.from_numpy(fragments.view(np.uint8).reshape(len(fragments), -1))
        column = _columns(raw.to(device, non_blocking=True), fragments.dtype)

    def obs(name: str) -> Obs:
        names = fragments.dtype[name].base.names
        return {leaf: column(name, leaf) for leaf in names} if names else column(name)

    def time_major(name: str) -> torch.Tensor:
        return column(name).transpose(0, 1)

    return Batch(
        obs=tree_map(lambda x: x.transpose(0, 1), obs("obs")),
        action=time_major("action"),
        reward=time_major("reward"),
        logp=time_major("logp"),
        terminated=time_major("terminated"),
        truncated=time_major("truncated"),
        trunc_value=time_major("trunc_value"),
        version=time_major("version"),
        bootstrap_obs=obs("last_obs"),
        state=column("state") if "state" in fragments.dtype.names else None,
    )


def _columns(raw: torch.Tensor, dtype: np.dtype):
    """For records as bytes [B, itemsize] (a tensor on any device): a function from a
    field's path to its values [B, ...], cut out of the bytes and reinterpreted there. A
    path may pass through a sub-array of records (a Dict observation's T steps)."""
    def column(*path: str) -> torch.Tensor:
        values, lead, sub = raw, (len(raw),), dtype
        for name in path:
            field, at = sub.fields[name][:2]
            values = values[..., at:at + field.itemsize]
            sub = field
            if field.shape and field.base.names:  # unfold the sub-array: [..., n, record]
                lead += field.shape
                values = values.reshape(*lead, field.base.itemsize)
                sub = field.base
        base = torch.from_numpy(np.empty(0, sub.base)).dtype
        # A copy on the device, always: a slice that is contiguous already (one record)
        # may start at an offset the field's type cannot be read from.
        values = values.clone(memory_format=torch.contiguous_format)
        return values.view(base).reshape(*lead, *sub.shape)
    return column


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
    # A time limit is not a terminal state: bootstrap it from its final observation.
    rewards = batch.reward + gamma * batch.trunc_value * batch.truncated.float()
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


# What one gradient step reports to the monitor: the losses, the values' explained variance,
# the gradient's norm before clipping, the policy lag (policy versions between the actor's
# policy and the learner's), the learning rate, and whether the batch came from the replay
# buffer rather than the queue.
STEP_DTYPE = np.dtype([("policy", "f4"), ("value", "f4"), ("entropy", "f4"), ("clip_fraction", "f4"),
                       ("explained_variance", "f4"), ("approx_kl", "f4"),
                       ("grad_norm", "f4"), ("lag_mean", "f4"), ("lag_max", "i8"), ("lr", "f8"),
                       ("replayed", "?")])
# A step's row on the device: these fields in this order, then whether its loss was finite.
_ROW_FIELDS = STEP_DTYPE.names[:STEP_DTYPE.names.index("lag_max") + 1]


def step_queue(capacity: int = 8192) -> ArrayQueue:
    """The learners' reports to the monitor. When the monitor falls behind, a full
    queue drops new reports rather than slow a learner: the charts are means."""
    return ArrayQueue(capacity, STEP_DTYPE)


def statistics_lock(shared: torch.nn.Module):
    """The lock that serialises updates of `shared`'s running statistics (observation
    normalizer, PopArt): one per shared model, so that every learner thread of the model
    takes the same one, however it was started. Learner processes get theirs from the
    trainer (a multiprocessing lock, run_learner's `lock`)."""
    with _LOCKS_GUARD:
        return _STATISTICS_LOCKS.setdefault(shared, threading.Lock())


_STATISTICS_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


class BatchSource:
    """Where a learner's next batch comes from: the fresh fragments of the queue, or,
    while fewer than a batch are there, replayed ones as far as the buffer's
    sample-to-insert limit allows (`replay` None: wait for the queue). Batches come out
    as tensors on `device`.

    On the CPU, without replay, a whole batch ready in the queue is read where it lies
    (`borrow`): each field is copied out of the slots once, into its tensor, with no copy
    of the records in between. Otherwise the fresh batch is filled across calls
    (fragments taken before a timeout are kept), as the replay buffer needs its records
    in one piece anyway. For a learner on an accelerator the batches lie in pinned
    memory, from which they go to the device in one transfer.

    Time spent waiting for fragments counts as `learner_queue_s`, time spent making
    tensors of them and adding them to the replay buffer as `learner_update_s`."""

    def __init__(self, cfg: Config, fragments: ArrayQueue, replay: ReplayBuffer | None,
                 counters: Counters, device: torch.device | str = "cpu"):
        self.fragments, self.replay, self.counters = fragments, replay, counters
        self.device = torch.device(device)
        pinned = self.device.type != "cpu"
        self.in_place = not pinned and replay is None
        B = cfg.learners.batch_size
        self.fresh = _records(B, fragments.dtype, pinned)
        self.replayed = _records(B, fragments.dtype, pinned)
        self.filled = 0  # fragments of the fresh batch so far
        self.build_s = 0.0  # of this call to next(): seconds spent making the batch
        self.rng = np.random.default_rng()  # this thread's draws: a handle's own are not for threads

    def next(self) -> tuple[Batch, bool] | None:
        """(batch, is_fresh), or None when nothing came within a short wait (look at
        `stop` again). Raises Closed once the queue is closed. A fresh batch goes into
        the replay buffer."""
        started = time.perf_counter()
        self.build_s = 0.0
        try:
            got = self._fresh()
        finally:
            self.counters.add("learner_queue_s", time.perf_counter() - started - self.build_s)
            self.counters.add("learner_update_s", self.build_s)
        if got is not None and got[1]:
            self.counters.add("queue_gets", len(self.fresh))
        return got

    def _fresh(self) -> tuple[Batch, bool] | None:
        B, fresh = len(self.fresh), self.fresh
        try:
            if self.in_place and self.filled == 0:
                batch = self._lent(B)
                if batch is not None:
                    return batch, True
            while self.filled < B:  # get_many returns 1..B; take what is there without waiting
                self.filled += len(self.fragments.get_many(B - self.filled, block=False,
                                                           out=fresh[self.filled:]))
        except queue.Empty:
            if self.replay is None or not _sample(self.replay, self.replayed, self.rng):
                try:  # nothing to replay either: wait for the actors
                    self.filled += len(self.fragments.get_many(B - self.filled, timeout=0.2,
                                                               out=fresh[self.filled:]))
                except queue.Empty:
                    pass
                return None
            self.counters.add("replayed", B)
            return self._tensors(self.replayed), False
        self.filled = 0
        return self._tensors(fresh, keep=self.replay is not None), True

    def _lent(self, B: int) -> Batch | None:
        """A whole batch read in the queue's slots, or None once the fragments lent (fewer
        than a batch: a borrow stops at the end of the queue's ring) are copied into the
        fresh batch. Raises queue.Empty when none are ready."""
        with self.fragments.borrow(B, block=False) as lent:
            if len(lent) < B:
                self.fresh[:len(lent)] = lent
                self.filled = len(lent)
                return None
            return self._tensors(lent)

    def _tensors(self, records: np.ndarray, keep: bool = False) -> Batch:
        """The batch of `records` on the device, after adding them to the replay buffer
        if `keep`; the time it takes counts towards `build_s`."""
        started = time.perf_counter()
        if keep:
            self.replay.add_many(records)
        batch = batch_from_fragments(records, self.device)
        self.build_s += time.perf_counter() - started
        return batch


def _records(n: int, dtype: np.dtype, pinned: bool) -> np.ndarray:
    if not pinned:
        return np.empty(n, dtype)
    memory = torch.empty(n * dtype.itemsize, dtype=torch.uint8, pin_memory=True)
    return memory.numpy().view(dtype)  # the array keeps the tensor, and so the memory, alive


class ProximalPolicy:
    """PPO-EWMA's proximal policy (Hilton et al. 2022, learners.proximal_decay): an
    exponential moving average of `model`'s weights, moved after each gradient step a
    learner hands to the shared optimizer. Centring the clip on it, not on the acting
    policy, bounds how far the policy moves over many updates, not only within one: the
    average trails the policy by about 1 / (1 - decay) steps, whatever the actors' lag.
    The steps' terms are weighted by proximal/behaviour, which corrects for the data's
    having been acted by another policy (compute_loss).

    `average`: the run's one average (`proximal_average`), which every learner moves
    after each of its steps, so that it trails the shared model by about the same number
    of steps however many learners train it (as the model's own Hogwild updates, two
    learners' moves at the same instant may lose one), and which checkpoints save.
    Without it, a fresh average of `model` as it is now."""

    def __init__(self, model: torch.nn.Module, decay: float, average: torch.nn.Module | None = None):
        self.model = proximal_average(model) if average is None else average
        self.decay = decay
        self.mine = list(self.model.parameters())
        self.theirs = list(model.parameters())
        self.buffers = list(zip(self.model.buffers(), model.buffers()))

    @torch.no_grad()
    def update(self) -> None:
        """`model` has taken a step: move the average (1 - decay) of the way towards it."""
        torch._foreach_lerp_(self.mine, self.theirs, 1.0 - self.decay)

    @torch.no_grad()
    def logp(self, batch: Batch) -> torch.Tensor:
        """log pi [T, B] of the batch's actions under the average, with `model`'s running
        statistics (observation normalization) as they are now: they are not averaged."""
        for mine, theirs in self.buffers:
            mine.copy_(theirs)
        return evaluate_batch(self.model, batch._replace(bootstrap_obs=None))[0]  # no bootstrap values


def proximal_average(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` as it is now, without gradients, for ProximalPolicy to average
    into."""
    return copy.deepcopy(model).requires_grad_(False)


class Updater:
    """Trains the shared model on batches: `learners.epochs` passes in
    `learners.minibatches` parts, each a gradient step computed on this learner's copy
    of the model (refreshed from the shared parameters first) and handed to the shared
    optimizer. A fresh batch also updates the running statistics, under the model's
    statistics lock (`lock`, or `statistics_lock(shared)`).

    With `publish` (a learner on an accelerator, whose `shared` is the `DeviceCopy`'s
    model) nothing in a gradient step waits for the device, except `learners.target_kl`'s
    check: a non-finite loss skips its step on the device (the optimizer's `ok`), the
    losses are read once per batch, and `publish()` copies the model to the actors' every
    `learners.publish_every` steps, which is when the policy version advances (by the
    steps published, skipped or not).

    `average`: the run's average of `shared` for `learners.proximal_decay` (see
    ProximalPolicy; None: this learner's own)."""

    def __init__(self, cfg: Config, shared: torch.nn.Module, optimizer: SharedOptimizer,
                 counters: Counters, stats: ArrayQueue, lock=None, stop=None, publish=None,
                 average: torch.nn.Module | None = None):
        self.cfg, self.optimizer, self.counters, self.stats = cfg, optimizer, counters, stats
        self.stop = stop  # once set, no further gradient step: the run is ending
        self.publish, self.unpublished = publish, 0  # steps since the last publish
        self.device = next(shared.parameters()).device  # where the model it trains lives
        self.local = copy.deepcopy(shared)
        self.copy_weights = WeightCopy(self.local, shared)
        self.local_params = [p for p in self.local.parameters() if p.requires_grad]
        self.shared_params = [p for p in shared.parameters() if p.requires_grad]
        self.obs_norm = getattr(shared, "obs_norm", None)
        self.popart = getattr(shared, "popart", None)
        self.lock = lock if lock is not None else statistics_lock(shared)
        decay = cfg.learners.proximal_decay
        self.proximal = None if decay is None else ProximalPolicy(shared, decay, average)
        steps = cfg.learners.epochs * cfg.learners.minibatches
        self.reports = np.zeros(steps, STEP_DTYPE)  # this batch's, handed over at its end

    def train(self, batch: Batch, is_fresh: bool) -> None:
        """`learners.epochs` passes over `batch` (tensors on the model's device, as
        `batch_from_fragments` makes them); `is_fresh`: from the queue, not replayed.

        With `learners.target_kl`, the passes end before the step of the first minibatch
        (after the first) at which the policy's approximate KL from the one the update
        began with exceeds 1.5 x target_kl, as Stable-Baselines3's PPO ends its epochs. The
        KL is estimated on the batch's actions, which the acting policy drew: exact in
        expectation where that is the policy the update began with (`actors.sync`, one
        learner); with more learners, their steps during the update count too. A pass cut
        short in the first epoch leaves its remaining minibatches' targets out of PopArt's
        statistics."""
        cfg, counters, local = self.cfg, self.counters, self.local
        started = time.perf_counter()
        if is_fresh and self.obs_norm is not None:
            with self.lock:
                self.obs_norm.update(batch.obs)
        rows = []  # per gradient step, on the device: the losses, the lag, whether finite
        stopped = False
        fixed = None  # the targets of every pass (learners.fixed_targets), else each pass's or minibatch's own
        several = cfg.learners.epochs * cfg.learners.minibatches > 1
        max_kl = 1.5 * cfg.learners.target_kl if several and cfg.learners.target_kl is not None else None
        if several and (cfg.learners.fixed_targets or max_kl is not None):
            self.copy_weights()  # the policy the update begins with, in one forward pass
            with torch.no_grad():
                logp, _, values, bootstrap_value = evaluate_batch(local, batch)
            if cfg.learners.fixed_targets:
                fixed = vtrace_returns(batch, logp - batch.logp, values, bootstrap_value, cfg)
            if max_kl is not None:
                batch = batch._replace(start_logp=logp)
        if self.proximal is not None:
            batch = batch._replace(prox_logp=self.proximal.logp(batch))
        for epoch, part, returns in self._steps(batch, fixed):
            if self.stop is not None and self.stop.is_set():
                stopped = True  # the trainer waits for this learner before its last checkpoint
                break
            self.copy_weights()
            version = counters["policy_version"]
            loss = compute_loss(local, part, cfg, returns)
            finite = torch.isfinite(loss.total)
            if self.publish is None and not finite:  # on the CPU, reading it costs nothing
                counters.add("nonfinite_losses")
                continue
            # On an accelerator, reading the KL waits for the device: target_kl's price there.
            if max_kl is not None and rows and float(approx_kl(loss.logp - part.start_logp)) > max_kl:
                counters.add("kl_stops")
                break
            for p in self.local_params:
                p.grad = None
            loss.total.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.local_params, cfg.learners.max_grad_norm)
            grads = [torch.zeros_like(sp) if p.grad is None else p.grad.to(sp.device)
                     for p, sp in zip(self.local_params, self.shared_params)]
            self.optimizer.lr = _learning_rate(cfg, counters["env_steps"])
            self.optimizer.step(grads, ok=None if self.publish is None else finite)
            if self.proximal is not None:
                self.proximal.update()
            if epoch == 0 and is_fresh and self.popart is not None:
                with self.lock:  # after the step, which was taken at the old statistics
                    self.popart.update(loss.value_targets, ok=None if self.publish is None else finite)
            self._advance()
            lag = (version - part.version).float()  # learner version minus the one that acted
            rows.append(torch.stack([*loss.stats, grad_norm, lag.mean(), lag.max(), finite.float()]))
        if is_fresh and not stopped:  # synchronous actors act the next batch once its policy is theirs
            if cfg.actors.sync:
                self.flush()
            counters.add("fresh_batches")
        if rows:
            # The batch's one wait for the device. Once it returns, the batch's transfer
            # from its pinned buffer is done too, and the buffer may take the next batch.
            self._report(torch.stack(rows).cpu().numpy(), is_fresh)
        counters.add("learner_update_s", time.perf_counter() - started)

    def _steps(self, batch: Batch, fixed: vtrace.VTraceReturns | None):
        """(epoch, minibatch, its targets or None) for every gradient step of the update,
        each pass's minibatches made as its turn comes (with the model as it is then)."""
        for epoch in range(self.cfg.learners.epochs):
            for part, returns in self._pass(batch, fixed):
                yield epoch, part, returns

    def _pass(self, batch: Batch, fixed: vtrace.VTraceReturns | None
              ) -> list[tuple[Batch, vtrace.VTraceReturns | None]]:
        """One pass's minibatches (`learners.minibatch_split`), each with its part of the
        `fixed` targets [T, B] if given, else with its own, or None where its loss computes
        them."""
        if self.cfg.learners.minibatch_split == "steps":
            if fixed is None:
                self.copy_weights()  # the targets of the policy as it is now
            return step_minibatches(self.local, batch, self.cfg, fixed)
        return _minibatches(batch, self.cfg.learners.minibatches, fixed)

    def _advance(self) -> None:
        """A gradient step is done: a new policy version, now on the CPU (where it is the
        actors' model), at the next publish on an accelerator."""
        if self.publish is None:
            self.counters.add("policy_version")
            return
        self.unpublished += 1
        if self.unpublished >= self.cfg.learners.publish_every:
            self.flush()

    def flush(self) -> None:
        """Publish the steps not yet published (a learner on an accelerator)."""
        if self.publish is not None and self.unpublished:
            self.publish()
            self.counters.add("policy_version", self.unpublished)
            self.unpublished = 0

    def _report(self, rows: np.ndarray, is_fresh: bool) -> None:
        finite = rows[:, -1] > 0
        if not finite.all():  # on an accelerator: found out now, the steps were skipped there
            self.counters.add("nonfinite_losses", int((~finite).sum()))
        rows = rows[finite]
        self.counters.add("updates", len(rows))
        reports = self.reports[:len(rows)]
        for i, name in enumerate(_ROW_FIELDS):
            reports[name] = rows[:, i]
        reports["lr"], reports["replayed"] = self.optimizer.lr, not is_fresh
        if len(reports):
            try:
                self.stats.put_many(reports, block=False)
            except (queue.Full, Closed):
                pass  # the monitor is behind, or the run is ending: reports are not data


def run_learner(cfg: Config, shared: torch.nn.Module, optimizer: SharedOptimizer,
                fragments: ArrayQueue, counters: Counters, stats: ArrayQueue,
                stop, replay: ReplayBuffer | None = None, lock=None,
                in_process: bool = False, publish=None, average: torch.nn.Module | None = None) -> None:
    """Update the shared model from batches until `stop` (a threading or multiprocessing
    Event) is set or the queue closes: the loop of a `BatchSource` feeding an `Updater`,
    in a thread of the trainer or, `in_process`, in a learner process of its own. Learners
    of one model share its statistics lock: `statistics_lock` for threads, `lock` (a
    multiprocessing lock) for processes. `publish`, `average`: see `Updater`."""
    if in_process:
        # As for actor processes: the trainer decides how to stop, and its end is theirs.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        end_with_parent()
        torch.set_num_threads(1)
        torch.seed()  # forked processes inherit one generator: draw different minibatches
    updater = Updater(cfg, shared, optimizer, counters, stats, lock, stop, publish, average)
    source = BatchSource(cfg, fragments, replay, counters, updater.device)
    try:
        while not stop.is_set():
            try:
                got = source.next()
            except Closed:
                return
            if got is not None:
                updater.train(*got)
    finally:
        updater.flush()


class DeviceCopy:
    """The learners' model on an accelerator (`learners.device: cuda`): a copy of the
    shared model there, with an optimizer whose statistics live there too (loaded from
    the shared optimizer's, so that a resumed run goes on where it was). Learner threads
    train the copy; `publish()` copies its parameters and running statistics into the
    shared CPU model, the one the actors read and checkpoints save, once every
    `learners.publish_every` gradient steps. The learner waits for the device there and
    once per batch, never inside a gradient step (as in TorchBeast's and Sample Factory's
    GPU learners) unless `learners.target_kl` reads each step's KL. `device` (default:
    `learners.device`) lets a test put the copy on the CPU, where the same logic runs.
    `average`: the run's proximal average (`learners.proximal_decay`), copied there too;
    a checkpoint reads the copy's back (Trainer.save)."""

    def __init__(self, cfg: Config, shared: torch.nn.Module, optimizer: SharedOptimizer,
                 device: torch.device | str | None = None, average: torch.nn.Module | None = None):
        device = device or cfg.learners.device
        self.model = copy.deepcopy(shared).to(device)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.optimizer.load_state_dict(optimizer.state_dict())
        self.publish = WeightCopy(shared, self.model)
        self.average = None if average is None else copy.deepcopy(average).to(device)


class Learners(NamedTuple):
    """Started learners: setting `stop` (and closing the queue) ends them."""

    stop: threading.Event | Any  # a multiprocessing Event for processes
    workers: list  # threads or processes
    # Processes: their statistics lock. Held here while they run, since a process from the
    # fork server opens it by name after start() has dropped its arguments.
    lock: Any = None


def start_learners(cfg: Config, shared: torch.nn.Module, optimizer: SharedOptimizer,
                   fragments: ArrayQueue, counters: Counters, stats: ArrayQueue,
                   replay: ReplayBuffer | None, context, device_copy: DeviceCopy | None = None,
                   average: torch.nn.Module | None = None) -> Learners:
    """Start `learners.num` learners of `learners.mode` on the shared model, or, given
    a `device_copy`, threads on that copy, which they publish to the shared model.
    Processes come from the multiprocessing `context` (unused by threads) and share one
    lock of it for the model's running statistics; the model, the optimizer statistics
    and the proximal `average` (see Updater) must be in shared memory."""
    args = (cfg, shared, optimizer, fragments, counters, stats)
    if device_copy is not None:
        args = (cfg, device_copy.model, device_copy.optimizer, fragments, counters, stats)
        average = device_copy.average
    if cfg.learners.mode == "thread":
        stop = threading.Event()
        publish = None if device_copy is None else device_copy.publish
        learners = Learners(stop, [threading.Thread(target=run_learner, name=f"a3c-learner-{i}", daemon=True,
                                                    args=(*args, stop, replay),
                                                    kwargs={"publish": publish, "average": average})
                                   for i in range(cfg.learners.num)])
    else:
        stop, lock = context.Event(), context.Lock()
        learners = Learners(stop, [context.Process(target=run_learner, name=f"a3c-learner-{i}", daemon=True,
                                                   args=(*args, stop, replay, lock, True),
                                                   kwargs={"average": average})
                                   for i in range(cfg.learners.num)], lock)
    for i, worker in enumerate(learners.workers):
        try:
            worker.start()
        except BaseException:  # a fork that failed, say: the caller never gets the ones started
            learners.stop.set()  # they see it within one wait for fragments (0.2 s) or gradient step
            for started in learners.workers[:i]:
                join_learner(started)
            raise
    return learners


def join_learner(worker, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Wait for a stopped learner to end: a thread ends within a gradient step; a process
    still alive after `timeout_s` is stuck, and is killed (a checkpoint without its last
    update is fine)."""
    if isinstance(worker, threading.Thread):
        worker.join()
        return
    worker.join(timeout_s)
    if worker.is_alive():
        worker.kill()
        worker.join()


def replay_buffer(cfg: Config, dtype: np.dtype) -> ReplayBuffer | None:
    """The learners' replay, None when `replay.ratio` is 0: the last `replay.window` fresh
    fragments, each drawn at most `replay.ratio` times per fragment added on average (the
    buffer's sample-to-insert limit), and none before a whole batch was added."""
    if cfg.replay.ratio == 0:
        return None
    return ReplayBuffer(cfg.replay.window, dtype, samples_per_insert=cfg.replay.ratio,
                        min_size_to_sample=cfg.learners.batch_size)


def _minibatches(batch: Batch, n: int, returns: vtrace.VTraceReturns | None = None
                 ) -> list[tuple[Batch, vtrace.VTraceReturns | None]]:
    """The batch's fragments in `n` random parts of (nearly) equal size, split by
    fragment, never inside one, each with its fragments' part of `returns` [T, B] (None
    without)."""
    if n == 1:
        return [(batch, returns)]
    parts = torch.randperm(batch.reward.shape[1], device=batch.reward.device).tensor_split(n)

    def part(name: str, field, idx):  # whole fragments: recurrent unrolls stay intact
        if field is None:
            return None
        if name in _PER_FRAGMENT:
            return tree_map(lambda t: t[idx], field)
        return tree_map(lambda t: t[:, idx], field)

    return [(Batch(*(part(name, field, idx) for name, field in zip(Batch._fields, batch))),
             None if returns is None else vtrace.VTraceReturns(*(x[:, idx] for x in returns)))
            for idx in parts]


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
    T, B = batch.reward.shape
    if returns is None:
        returns = batch_targets(model, batch, cfg)

    def flat(field: torch.Tensor) -> torch.Tensor:  # [T, B, ...] -> [T * B, ...], copied once a pass
        return field.reshape(T * B, *field.shape[2:])

    fields = [None if name in _PER_FRAGMENT or field is None else tree_map(flat, field)
              for name, field in zip(Batch._fields, batch)]
    targets = [flat(x) for x in returns]

    def part(idx: torch.Tensor) -> tuple[Batch, vtrace.VTraceReturns]:
        def take(x: torch.Tensor) -> torch.Tensor:  # the steps idx, as [1, N, ...]
            return x[idx].unsqueeze(0)
        return (Batch(*(None if field is None else tree_map(take, field) for field in fields)),
                vtrace.VTraceReturns(*map(take, targets)))

    parts = torch.randperm(T * B, device=batch.reward.device).tensor_split(cfg.learners.minibatches)
    return [part(idx) for idx in parts]


# The Batch fields that are [B, ...]; the others are [T, B, ...].
_PER_FRAGMENT = frozenset({"bootstrap_obs", "state"})


def _sample(replay: ReplayBuffer, out: np.ndarray, rng: np.random.Generator) -> bool:
    """Fill `out` from the replay buffer if its sample-to-insert limit allows it now."""
    try:
        replay.sample(len(out), out=out, rng=rng, timeout=0)
    except queue.Empty:
        return False
    return True


def _learning_rate(cfg: Config, env_steps: int) -> float:
    if cfg.optim.lr_schedule == "linear":
        return cfg.optim.lr * max(0.0, 1.0 - env_steps / cfg.total_timesteps)
    return cfg.optim.lr
