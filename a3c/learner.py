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

from replay import ArrayQueue, Closed, Counters

from . import vtrace
from .config import Config
from .model import copy_weights
from .optim import SharedOptimizer

__all__ = ["Batch", "LossStats", "batch_from_fragments", "compute_loss", "run_learner"]


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


def compute_loss(model: torch.nn.Module, batch: Batch, cfg: Config) -> tuple[torch.Tensor, LossStats]:
    """IMPALA's actor-critic loss with V-trace targets (Espeholt et al. 2018, eq. 1-2)."""
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
    returns = vtrace.from_importance_weights(
        log_rhos=logp.detach() - batch.logp,
        discounts=discounts,
        rewards=rewards,
        values=values.detach(),
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=cfg.vtrace.clip_rho_threshold,
        clip_pg_rho_threshold=cfg.vtrace.clip_pg_rho_threshold,
    )
    policy_loss = -(logp * returns.pg_advantages).mean()
    value_loss = 0.5 * (returns.vs - values).pow(2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss + cfg.learners.vf_coef * value_loss - cfg.learners.ent_coef * entropy_mean
    return loss, LossStats(policy_loss.item(), value_loss.item(), entropy_mean.item())


def run_learner(cfg: Config, shared: torch.nn.Module, optimizer: SharedOptimizer,
                fragments: ArrayQueue, counters: Counters, stats: deque,
                stop: threading.Event) -> None:
    """Update the shared model from batches until `stop` is set or the queue closes.

    Each learner computes gradients on its own copy of the model, refreshed from the
    shared parameters before every batch, and hands them to the shared optimizer."""
    device = torch.device(cfg.learners.device)
    local = copy.deepcopy(shared).to(device)
    local_params = [p for p in local.parameters() if p.requires_grad]
    shared_params = [p for p in shared.parameters() if p.requires_grad]
    B = cfg.learners.batch_size
    out = np.empty(B, fragments.dtype)
    n = 0  # fragments of the batch being filled; kept across timeouts
    while not stop.is_set():
        waited_from = time.perf_counter()
        try:
            while n < B:  # get_many returns 1..B; fill the whole batch
                n += len(fragments.get_many(B - n, timeout=0.2, out=out[n:]))
        except queue.Empty:
            continue  # look at `stop` again; a partial batch is dropped only at shutdown
        except Closed:
            return
        n = 0
        started = time.perf_counter()
        counters.add("learner_queue_s", started - waited_from)
        counters.add("queue_gets", B)
        copy_weights(local, shared)
        version = counters["policy_version"]
        batch = batch_from_fragments(out, device)
        loss, loss_stats = compute_loss(local, batch, cfg)
        if not torch.isfinite(loss):
            counters.add("nonfinite_losses")
            continue
        local.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(local.parameters(), cfg.learners.max_grad_norm)
        grads = [torch.zeros_like(sp) if p.grad is None else p.grad.to(sp.device)
                 for p, sp in zip(local_params, shared_params)]
        optimizer.lr = _learning_rate(cfg, counters["env_steps"])
        optimizer.step(grads)
        counters.add("updates")
        counters.add("policy_version")
        counters.add("learner_update_s", time.perf_counter() - started)
        lag = version - batch.version  # learner version minus the version that acted
        stats.append((loss_stats, float(lag.float().mean()), int(lag.max()), optimizer.lr))


def _learning_rate(cfg: Config, env_steps: int) -> float:
    if cfg.optim.lr_schedule == "linear":
        return cfg.optim.lr * max(0.0, 1.0 - env_steps / cfg.total_timesteps)
    return cfg.optim.lr
