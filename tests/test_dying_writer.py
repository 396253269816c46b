"""Writers killed with SIGKILL while a sampler draws: the replay buffer must not wedge.

A writer that dies between taking a slot and publishing it leaves the slot marked as
being written by a process that no longer exists. Samplers skip that slot (its stamp is
not a published position) and the next writer to reach it takes it back
(`stats()["reclaimed"]`). Each round spawns writer processes that add large records as
fast as they can into a small buffer, kills some of them at random moments and lets one
survivor add a known number of records, while a sampler thread in this process draws
for the whole run and checks every record it gets.

Records are large (half a MiB) so that a writer spends most of its time copying into a
slot it has taken, which is where a kill leaves a slot to reclaim.
"""
import multiprocessing as mp
import os
import random
import signal
import threading
import time

import numpy as np

import replay
from replay import Counters, ReplayBuffer

from waiting import wait_until

PAYLOAD = 512 * 1024
DTYPE = np.dtype([("writer", "i4"), ("seq", "i8"), ("payload", "u1", (PAYLOAD,)), ("check", "i8")])
CAPACITY = 8
SURVIVOR_RECORDS = 100
VICTIMS_PER_ROUND = 3
# At least MIN_ROUNDS rounds; then more, up to MAX_ROUNDS, only until a killed writer's
# slot has been taken back, and no new round after BUDGET_S seconds.
MIN_ROUNDS, MAX_ROUNDS = 2, 10
BUDGET_S = 12.0
ROUND_TIMEOUT_S = 30.0


def records(writer, first, n):
    batch = np.zeros(n, DTYPE)
    batch["writer"] = writer
    batch["payload"] = writer % 251
    batch["seq"] = batch["check"] = np.arange(first, first + n)
    return batch


def intact(got):
    """The first and last words agree, and the payload is its writer's byte (checked
    every 4 KiB, which is enough to see a copy mixed from two records)."""
    return (got["seq"] == got["check"]).all() and \
        (got["payload"][:, ::4096] == (got["writer"] % 251).astype(np.uint8)[:, None]).all()


def _writer(buf, writer, count, counters, seed):
    """Add records (writer, 0), (writer, 1), ... with add and add_many; stop after
    `count` records, or never (until killed) when count is None."""
    rng = random.Random(seed)
    seq = 0
    batches = {k: records(writer, 0, k) for k in range(1, 5)}  # built once: adds dominate
    while count is None or seq < count:
        k = 1 if rng.random() < 0.4 else rng.randint(2, 4)
        if count is not None:
            k = min(k, count - seq)
        batch = batches[k]
        batch["seq"] = batch["check"] = np.arange(seq, seq + k)
        if k == 1:
            buf.add(batch[0])
        else:
            buf.add_many(batch)
        seq += k
        counters.add(f"added{writer}", k)


class Sampler(threading.Thread):
    """Draws batches for the whole run, counting draws, torn records and Empty."""

    def __init__(self, buf):
        super().__init__(daemon=True)
        self.buf, self.stop = buf, threading.Event()
        self.draws = self.torn = self.empty = 0
        self.errors = []
        self.start()

    def run(self):
        out = np.empty(4, DTYPE)
        try:
            while not self.stop.is_set():
                try:
                    got = self.buf.sample(4, out=out)
                except replay.Empty:
                    self.empty += 1
                    continue
                self.draws += len(got)
                self.torn += int(not intact(got))
                time.sleep(0.0005)  # leave the two cores mostly to the writers
        except BaseException as error:  # reported by the test
            self.errors.append(error)


def test_killed_writers_never_wedge_samplers_and_their_slots_are_taken_back():
    ctx = mp.get_context("spawn")
    rng = random.Random(99)
    n_ids = MAX_ROUNDS * (VICTIMS_PER_ROUND + 1)
    counters = Counters([f"added{i}" for i in range(n_ids)])
    buf = ReplayBuffer(CAPACITY, DTYPE)
    sampler = Sampler(buf)
    started = time.monotonic()
    rounds = 0
    try:
        buf.add_many(records(-1, 0, CAPACITY))
        next_id = 0
        for r in range(MAX_ROUNDS):
            if r >= MIN_ROUNDS and (buf.stats()["reclaimed"] > 0 or time.monotonic() - started > BUDGET_S):
                break
            survivor, victims = next_id, list(range(next_id + 1, next_id + 1 + VICTIMS_PER_ROUND))
            next_id += 1 + VICTIMS_PER_ROUND
            procs = {survivor: ctx.Process(target=_writer, args=(buf, survivor, None, counters, r))}
            for v in victims:
                procs[v] = ctx.Process(target=_writer, args=(buf, v, None, counters, 1000 + v))
            for p in procs.values():
                p.start()
            try:
                for v in victims:  # kill each victim at a random moment once it adds
                    wait_until(lambda: counters[f"added{v}"] > 0 or not procs[v].is_alive(),
                               ROUND_TIMEOUT_S, f"writer {v} to start")
                    time.sleep(rng.uniform(0.0, 0.05))
                    os.kill(procs[v].pid, signal.SIGKILL)
                for v in victims:
                    procs[v].join(ROUND_TIMEOUT_S)
                    assert procs[v].exitcode == -signal.SIGKILL
                # The survivor keeps adding after the kills, lapping the victims' slots.
                goal = counters[f"added{survivor}"] + SURVIVOR_RECORDS
                wait_until(lambda: counters[f"added{survivor}"] >= goal, ROUND_TIMEOUT_S,
                           f"writer {survivor} to add {SURVIVOR_RECORDS} records after the kills: "
                           f"writers wedged; stats {buf.stats()}")
            finally:
                for p in procs.values():
                    if p.is_alive():
                        p.kill()
                    p.join()
            rounds += 1
            draws = sampler.draws
            wait_until(lambda: sampler.draws > draws, ROUND_TIMEOUT_S, "the sampler to draw again")

        # Every slot is overwritten by fresh markers: none is left stuck, and the
        # sampler then only ever sees markers.
        buf.add_many(records(-2, 0, CAPACITY))
        seen = buf.sample(2000, rng=0)
        stats = buf.stats()
    finally:
        sampler.stop.set()
        sampler.join(ROUND_TIMEOUT_S)
        buf.close()
        counters.close()
    assert not sampler.is_alive(), "the sampler did not finish"
    assert not sampler.errors, sampler.errors
    assert sampler.torn == 0, "a record was drawn torn"
    assert sampler.draws > 0
    assert intact(seen) and (seen["writer"] == -2).all()
    assert set(seen["seq"].tolist()) == set(range(CAPACITY)), "a slot stayed stuck"
    print(f"{rounds} rounds, {rounds * VICTIMS_PER_ROUND} kills, {sampler.draws} draws, "
          f"stats {stats}, {time.monotonic() - started:.1f} s")
    assert stats["reclaimed"] > 0, "no kill landed between taking a slot and publishing it"
