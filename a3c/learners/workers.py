"""Learner workers: threads of the trainer or processes of their own (`learners.mode`),
each the loop of a `BatchSource` feeding an `Updater`, and the learners' model on an
accelerator (`DeviceCopy`)."""
from __future__ import annotations

import copy
import threading
from typing import Any, NamedTuple

import torch

from replay import ArrayQueue, Closed, Counters, ReplayBuffer

from ..config import Config
from ..models.weights import WeightCopy
from ..procs import as_worker_process, join_worker
from .optim import SharedOptimizer, build_optimizer
from .source import BatchSource
from .updater import Updater

__all__ = ["DeviceCopy", "Learners", "run_learner", "start_learners"]


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
        as_worker_process()
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
                join_worker(started)
            raise
    return learners
