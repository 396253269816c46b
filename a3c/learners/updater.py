"""The update loop: a learner's passes over a batch, each gradient step handed to the
shared optimizer, with PPO-EWMA's proximal average, target_kl's early stop, PopArt and
the observation statistics, and the reports the monitor charts."""
from __future__ import annotations

import copy
import queue
import threading
import time
import weakref

import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from ..config import Config
from ..models.weights import WeightCopy
from . import vtrace
from .batch import Batch, fragment_minibatches
from .loss import approx_kl, compute_loss, evaluate_batch, step_minibatches, vtrace_returns
from .optim import SharedOptimizer

__all__ = ["STEP_DTYPE", "ProximalPolicy", "Updater", "learning_rate", "proximal_average", "statistics_lock",
           "step_queue"]


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
        started = time.perf_counter()
        if is_fresh and self.obs_norm is not None:
            with self.lock:
                self.obs_norm.update(batch.obs)
        batch, fixed, max_kl = self._begin(batch)
        rows = []  # per gradient step, on the device: the losses, the lag, whether finite
        stopped = False
        for epoch, part, returns in self._steps(batch, fixed):
            if self.stop is not None and self.stop.is_set():
                stopped = True  # the trainer waits for this learner before its last checkpoint
                break
            row = self._step(part, returns, max_kl if rows else None, epoch == 0 and is_fresh)
            if row is False:  # past target_kl
                break
            if row is not None:
                rows.append(row)
        if is_fresh and not stopped:  # synchronous actors act the next batch once its policy is theirs
            if self.cfg.actors.sync:
                self.flush()
            self.counters.add("fresh_batches")
        if rows:
            # The batch's one wait for the device. Once it returns, the batch's transfer
            # from its pinned buffer is done too, and the buffer may take the next batch.
            self._report(torch.stack(rows).cpu().numpy(), is_fresh)
        self.counters.add("learner_update_s", time.perf_counter() - started)

    def _begin(self, batch: Batch) -> tuple[Batch, vtrace.VTraceReturns | None, float | None]:
        """(the batch with what the update's steps compare against, the targets of every
        pass or None, the KL bound or None). With several steps, `learners.fixed_targets`
        and `learners.target_kl` need the policy the update begins with, in one forward
        pass; `learners.proximal_decay` the proximal average's log-probs."""
        cfg = self.cfg
        fixed = None  # the targets of every pass (learners.fixed_targets), else each pass's or minibatch's own
        several = cfg.learners.epochs * cfg.learners.minibatches > 1
        max_kl = 1.5 * cfg.learners.target_kl if several and cfg.learners.target_kl is not None else None
        if several and (cfg.learners.fixed_targets or max_kl is not None):
            self.copy_weights()
            with torch.no_grad():
                logp, _, values, bootstrap_value = evaluate_batch(self.local, batch)
            if cfg.learners.fixed_targets:
                fixed = vtrace_returns(batch, logp - batch.logp, values, bootstrap_value, cfg)
            if max_kl is not None:
                batch = batch._replace(start_logp=logp)
        if self.proximal is not None:
            batch = batch._replace(prox_logp=self.proximal.logp(batch))
        return batch, fixed, max_kl

    def _step(self, part: Batch, returns: vtrace.VTraceReturns | None, max_kl: float | None,
              moves_popart: bool) -> torch.Tensor | None | bool:
        """One gradient step on the minibatch `part`, taken by the shared optimizer: its
        report row (on the device), None if its loss is not finite (on the CPU, where
        reading it costs nothing), or False if the policy is past `max_kl` (no step)."""
        cfg, counters = self.cfg, self.counters
        self.copy_weights()
        version = counters["policy_version"]
        loss = compute_loss(self.local, part, cfg, returns)
        finite = torch.isfinite(loss.total)
        if self.publish is None and not finite:
            counters.add("nonfinite_losses")
            return None
        # On an accelerator, reading the KL waits for the device: target_kl's price there.
        if max_kl is not None and float(approx_kl(loss.logp - part.start_logp)) > max_kl:
            counters.add("kl_stops")
            return False
        for p in self.local_params:
            p.grad = None
        loss.total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.local_params, cfg.learners.max_grad_norm)
        grads = [torch.zeros_like(sp) if p.grad is None else p.grad.to(sp.device)
                 for p, sp in zip(self.local_params, self.shared_params)]
        ok = None if self.publish is None else finite
        self.optimizer.lr = learning_rate(cfg, counters["env_steps"])
        self.optimizer.step(grads, ok=ok)
        if self.proximal is not None:
            self.proximal.update()
        if moves_popart and self.popart is not None:
            with self.lock:  # after the step, which was taken at the old statistics
                self.popart.update(loss.value_targets, ok=ok)
        self._advance()
        lag = (version - part.version).float()  # learner version minus the one that acted
        return torch.stack([*loss.stats, grad_norm, lag.mean(), lag.max(), finite.float()])

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
        return fragment_minibatches(batch, self.cfg.learners.minibatches, fixed)

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


def learning_rate(cfg: Config, env_steps: int) -> float:
    if cfg.optim.lr_schedule == "linear":
        return cfg.optim.lr * max(0.0, 1.0 - env_steps / cfg.total_timesteps)
    return cfg.optim.lr
