"""Learners: pop batches of fragments, compute the V-trace actor-critic loss, and apply
lock-free (Hogwild) updates to the shared model.

`compute_loss` is a pure function of a model and a batch; `run_learner` is the thread
loop around it.
"""
from __future__ import annotations

import copy
import queue
import threading
import time
from collections import deque
from typing import NamedTuple

import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters, ReplayBuffer

from . import vtrace
from .config import Config
from .model import WeightCopy
from .optim import SharedOptimizer

__all__ = ["Batch", "Loss", "LossStats", "LearnerStep", "batch_from_fragments", "compute_loss",
           "replay_buffer", "run_learner"]


class Batch(NamedTuple):
    """A batch of B fragments as [T, B, ...] tensors (bootstrap_obs is [B, ...])."""

    obs: torch.Tensor
    action: torch.Tensor
    reward: torch.Tensor
    logp: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    trunc_value: torch.Tensor
    version: torch.Tensor
    bootstrap_obs: torch.Tensor


class LossStats(NamedTuple):
    policy: float
    value: float
    entropy: float
    clip_fraction: float  # share of steps whose ratio pi/mu lies outside the clip range


class Loss(NamedTuple):
    total: torch.Tensor  # scalar, with gradient
    stats: LossStats
    value_targets: torch.Tensor  # [T, B] V-trace targets v_s, without gradient


def batch_from_fragments(fragments: np.ndarray, device: torch.device | str = "cpu") -> Batch:
    """Fragments [B] of the actor's dtype -> time-major tensors [T, B, ...]."""
    def time_major(name: str) -> torch.Tensor:
        # Copy out of the record array (fields are strided), then swap B and T.
        array = np.ascontiguousarray(fragments[name])
        return torch.from_numpy(array).transpose(0, 1).to(device)

    return Batch(
        obs=time_major("obs"),
        action=time_major("action"),
        reward=time_major("reward"),
        logp=time_major("logp"),
        terminated=time_major("terminated"),
        truncated=time_major("truncated"),
        trunc_value=time_major("trunc_value"),
        version=time_major("version"),
        bootstrap_obs=torch.from_numpy(np.ascontiguousarray(fragments["last_obs"])).to(device),
    )


def compute_loss(model: torch.nn.Module, batch: Batch, cfg: Config) -> Loss:
    """IMPALA's actor-critic loss with V-trace targets (Espeholt et al. 2018, eq. 1-2), or,
    with `learners.clip_coef`, PPO's clipped objective on V-trace advantages as in
    asynchronous PPO (Schulman et al. 2017, eq. 7; the ratio is pi over the behaviour
    policy mu, whose data may be a few updates old)."""
    T, B = batch.reward.shape
    obs = batch.obs.reshape(T * B, *batch.obs.shape[2:])
    action = batch.action.reshape(T * B, *batch.action.shape[2:])
    logp, entropy, values = (x.reshape(T, B) for x in model.evaluate(obs, action))  # [T, B]
    with torch.no_grad():
        _, bootstrap_value = model(batch.bootstrap_obs)  # [B]

    gamma = cfg.learners.gamma
    done = batch.terminated | batch.truncated
    discounts = gamma * (~done).float()  # no bootstrap across an episode's end
    # A time limit is not a terminal state: bootstrap it from its final observation.
    rewards = batch.reward + gamma * batch.trunc_value * batch.truncated.float()
    log_rhos = logp.detach() - batch.logp  # log pi/mu, [T, B]
    returns = vtrace.from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=cfg.vtrace.clip_rho_threshold,
        clip_pg_rho_threshold=cfg.vtrace.clip_pg_rho_threshold,
        td_lambda=cfg.vtrace.td_lambda,
    )
    clip = cfg.learners.clip_coef
    if clip is None:
        advantages = _normalized(returns.pg_advantages, cfg.learners.normalize_advantages)
        policy_loss = -(logp * advantages).mean()
        clip_fraction = 0.0
    else:
        advantages = _normalized(returns.advantages, cfg.learners.normalize_advantages)
        ratio = torch.exp(logp - batch.logp)
        policy_loss = -torch.min(ratio * advantages,
                                 ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
        clip_fraction = ((ratio - 1).abs() > clip).float().mean().item()
    # With PopArt the value error is measured in units of the targets' std, so that
    # returns of -500 weigh no more in the loss than returns of 1.
    popart = getattr(model, "popart", None)
    scale = popart.stats()[1] if popart is not None else 1.0
    value_loss = 0.5 * ((returns.vs - values) / scale).pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + cfg.learners.vf_coef * value_loss - cfg.learners.ent_coef * entropy_mean
    stats = LossStats(policy_loss.item(), value_loss.item(), entropy_mean.item(), clip_fraction)
    return Loss(loss, stats, returns.vs)


def _normalized(advantages: torch.Tensor, normalize: bool) -> torch.Tensor:
    if not normalize:
        return advantages
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


class LearnerStep(NamedTuple):
    """What one gradient step reports to the monitor."""

    loss: LossStats
    lag_mean: float  # policy versions between the actor's policy and the learner's
    lag_max: int
    lr: float
    replayed: bool  # the batch came from the replay buffer, not the queue


def run_learner(cfg: Config, shared: torch.nn.Module, optimizer: SharedOptimizer,
                fragments: ArrayQueue, counters: Counters, stats: deque,
                stop: threading.Event, replay: ReplayBuffer | None = None,
                lock: threading.Lock | None = None) -> None:
    """Update the shared model from batches until `stop` is set or the queue closes.

    Each learner computes gradients on its own copy of the model, refreshed from the
    shared parameters before every step, and hands them to the shared optimizer. A
    fresh batch (from the queue) gets `learners.epochs` steps, updates the running
    statistics and goes into `replay`; while no fresh batch is ready, the learner trains
    on replayed ones as far as the buffer's sample-to-insert limit allows, instead of
    waiting. `lock` serialises the statistics updates of several learner threads."""
    device = torch.device(cfg.learners.device)
    local = copy.deepcopy(shared).to(device)
    copy_weights = WeightCopy(local, shared)
    local_params = [p for p in local.parameters() if p.requires_grad]
    shared_params = [p for p in shared.parameters() if p.requires_grad]
    obs_norm, popart = getattr(shared, "obs_norm", None), getattr(shared, "popart", None)
    lock = lock or threading.Lock()
    B = cfg.learners.batch_size
    fresh = np.empty(B, fragments.dtype)
    replayed = np.empty(B, fragments.dtype)
    rng = np.random.default_rng()  # this thread's draws: a buffer handle's own are not for threads
    n = 0  # fragments of the fresh batch being filled; kept across timeouts
    while not stop.is_set():
        waited_from = time.perf_counter()
        try:
            while n < B:  # get_many returns 1..B; take what is there without waiting
                n += len(fragments.get_many(B - n, block=False, out=fresh[n:]))
        except queue.Empty:
            if replay is None or not _sample(replay, replayed, rng):
                try:  # nothing to replay either: wait for the actors
                    n += len(fragments.get_many(B - n, timeout=0.2, out=fresh[n:]))
                except queue.Empty:
                    pass  # look at `stop` again
                except Closed:
                    return
                counters.add("learner_queue_s", time.perf_counter() - waited_from)
                continue
        except Closed:
            return
        is_fresh = n == B
        records = fresh if is_fresh else replayed
        if is_fresh:
            n = 0
            counters.add("queue_gets", B)
            if replay is not None:
                replay.add_many(fresh)
        else:
            counters.add("replayed", B)
        started = time.perf_counter()
        counters.add("learner_queue_s", started - waited_from)
        batch = batch_from_fragments(records, device)
        if is_fresh and obs_norm is not None:
            with lock:
                obs_norm.update(batch.obs)
        for epoch in range(cfg.learners.epochs):
            for part in _minibatches(batch, cfg.learners.minibatches):
                copy_weights()
                version = counters["policy_version"]
                loss, loss_stats, targets = compute_loss(local, part, cfg)
                if not torch.isfinite(loss):
                    counters.add("nonfinite_losses")
                    continue
                for p in local_params:
                    p.grad = None
                loss.backward()
                torch.nn.utils.clip_grad_norm_(local_params, cfg.learners.max_grad_norm)
                grads = [torch.zeros_like(sp) if p.grad is None else p.grad.to(sp.device)
                         for p, sp in zip(local_params, shared_params)]
                optimizer.lr = _learning_rate(cfg, counters["env_steps"])
                optimizer.step(grads)
                if epoch == 0 and is_fresh and popart is not None:
                    with lock:  # after the step, which was taken at the old statistics
                        popart.update(targets)
                counters.add("updates")
                counters.add("policy_version")
                lag = version - part.version  # learner version minus the version that acted
                stats.append(LearnerStep(loss_stats, float(lag.float().mean()), int(lag.max()),
                                         optimizer.lr, not is_fresh))
        counters.add("learner_update_s", time.perf_counter() - started)


def replay_buffer(cfg: Config, dtype: np.dtype) -> ReplayBuffer | None:
    """The learners' replay, None when `replay.ratio` is 0: the last `replay.window` fresh
    fragments, each drawn at most `replay.ratio` times per fragment added on average (the
    buffer's sample-to-insert limit), and none before a whole batch was added."""
    if cfg.replay.ratio == 0:
        return None
    return ReplayBuffer(cfg.replay.window, dtype, samples_per_insert=cfg.replay.ratio,
                        min_size_to_sample=cfg.learners.batch_size)


def _minibatches(batch: Batch, n: int) -> list[Batch]:
    """The batch's fragments in `n` random parts of (nearly) equal size."""
    if n == 1:
        return [batch]
    parts = torch.randperm(batch.reward.shape[1]).tensor_split(n)
    # Every field is [T, B, ...] but bootstrap_obs, which is [B, ...].
    return [Batch(*(x[:, idx] for x in batch[:-1]), batch.bootstrap_obs[idx]) for idx in parts]


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
