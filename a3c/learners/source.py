"""Where a learner's next batch comes from: the queue's fresh fragments, or the replay
buffer's while the queue has too few."""
from __future__ import annotations

import queue
import time

import numpy as np
import torch

from replay import ArrayQueue, Counters, ReplayBuffer

from ..config import Config
from .batch import Batch, batch_from_fragments

__all__ = ["BatchSource", "replay_buffer"]


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


def _sample(replay: ReplayBuffer, out: np.ndarray, rng: np.random.Generator) -> bool:
    """Fill `out` from the replay buffer if its sample-to-insert limit allows it now."""
    try:
        replay.sample(len(out), out=out, rng=rng, timeout=0)
    except queue.Empty:
        return False
    return True


def replay_buffer(cfg: Config, dtype: np.dtype) -> ReplayBuffer | None:
    """The learners' replay, None when `replay.ratio` is 0: the last `replay.window` fresh
    fragments, each drawn at most `replay.ratio` times per fragment added on average (the
    buffer's sample-to-insert limit), and none before a whole batch was added."""
    if cfg.replay.ratio == 0:
        return None
    return ReplayBuffer(cfg.replay.window, dtype, samples_per_insert=cfg.replay.ratio,
                        min_size_to_sample=cfg.learners.batch_size)
