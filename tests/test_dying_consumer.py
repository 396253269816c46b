"""Consumers killed with SIGKILL while a producer pushes: the queue must not wedge.

A consumer that dies between claiming records and releasing their slots leaves those
slots holding records that nobody will take; a producer that laps around to them
releases them once every consumer that may own them is gone, and counts the records as
lost (`stats()["lost"]`); a consumer that dies holding borrowed records is the same case.
Each round spawns consumer processes that take batches of
numbered records as fast as they can from a small queue and kills them at random
moments, while a producer thread in this process pushes records 0, 1, 2, ... A consumer
thread here stands aside while the victims run (so that they find the queue full and
spend their time copying), then takes over, so that the producer must lap around past
the slots the victims held.

Records are large (half a MiB) so that a consumer spends a good part of its time copying
out of slots it has claimed, which is where a kill leaves slots to release.
"""
import multiprocessing as mp
import os
import queue
import random
import signal
import threading
import time

import numpy as np
import pytest

import replay
from replay import ArrayQueue, Counters

from waiting import wait_until

PAYLOAD = 512 * 1024
DTYPE = np.dtype([("seq", "i8"), ("payload", "u1", (PAYLOAD,)), ("check", "i8")])
CAPACITY = 16
BATCH = 8
VICTIMS_PER_ROUND = 2
MAX_RECORDS = 1 << 20  # the producer stops here (far more than a run moves)
# At least MIN_ROUNDS rounds; then more, up to MAX_ROUNDS, only until a kill has landed
# between a claim and its release, and no new round after BUDGET_S seconds.
MIN_ROUNDS, MAX_ROUNDS = 3, 16
BUDGET_S = 12.0
ROUND_TIMEOUT_S = 30.0  # a producer that cannot get a lap further in this time has wedged


def _victim(q, victim_id, counters, seen, borrow):
    """Take batches until killed, by get_many or by borrowing them in place; count each
    record taken in `seen` (shared memory), a borrowed one once its slot is released."""
    seen = np.frombuffer(seen, dtype=np.uint8)
    out = np.empty(BATCH, DTYPE)
    name = f"took{victim_id}"
    while True:
        try:
            if borrow:
                with q.borrow(BATCH) as records:
                    seq, torn = records["seq"].copy(), np.count_nonzero(records["seq"] != records["check"])
                    records["payload"].sum()  # time spent reading in place, where kills land
            else:
                got = q.get_many(BATCH, out=out)
                seq, torn = got["seq"], np.count_nonzero(got["seq"] != got["check"])
        except replay.Closed:
            return
        counters.add("torn", int(torn))
        seen[seq] += 1
        counters.add(name, len(seq))


class Producer(threading.Thread):
    """Pushes records 0, 1, 2, ... in batches of random size until told to stop; `pushed`
    is how many went in. A put that times out is a wedge, reported in `error`."""

    def __init__(self, q):
        super().__init__(daemon=True)
        self.q = q
        self.pushed = 0
        self.error = None
        self.stop = threading.Event()
        self.start()

    def run(self):
        rng = random.Random(7)
        batch = np.zeros(BATCH, DTYPE)
        try:
            while not self.stop.is_set() and self.pushed + BATCH <= MAX_RECORDS:
                k = rng.randint(1, BATCH)
                batch["seq"][:k] = batch["check"][:k] = np.arange(self.pushed, self.pushed + k)
                if k == 1:
                    self.q.put(batch[0], timeout=ROUND_TIMEOUT_S)
                else:
                    assert self.q.put_many(batch[:k], timeout=ROUND_TIMEOUT_S) == k, "put_many timed out"
                self.pushed += k
        except BaseException as error:  # reported by the test
            self.error = error


class Survivor(threading.Thread):
    """Takes records while `running` is set, until the queue is closed and drained,
    counting each in `seen`."""

    def __init__(self, q):
        super().__init__(daemon=True)
        self.q = q
        self.seen = np.zeros(MAX_RECORDS, np.uint8)
        self.torn = 0
        self.error = None
        self.running = threading.Event()
        self.running.set()
        self.start()

    def run(self):
        out = np.empty(BATCH, DTYPE)
        try:
            while True:
                self.running.wait()
                try:
                    got = self.q.get_many(BATCH, out=out, timeout=0.01)
                except queue.Empty:
                    continue
                except replay.Closed:
                    return
                seq = got["seq"]
                self.torn += int(np.count_nonzero(seq != got["check"]))
                self.seen[seq] += 1
        except BaseException as error:  # reported by the test
            self.error = error


@pytest.mark.parametrize("borrow", [False, True], ids=["get_many", "borrow"])
def test_killed_consumers_never_wedge_producers_and_no_record_arrives_twice(borrow):
    ctx = mp.get_context("spawn")
    rng = random.Random(4321)
    n_ids = MAX_ROUNDS * VICTIMS_PER_ROUND
    counters = Counters(["torn"] + [f"took{i}" for i in range(n_ids)])
    victim_seen = ctx.RawArray("B", MAX_RECORDS)
    q = ArrayQueue(CAPACITY, DTYPE)
    producer = Producer(q)
    survivor = Survivor(q)
    started = time.monotonic()
    kills = rounds = 0
    try:
        for r in range(MAX_ROUNDS):
            if r >= MIN_ROUNDS and (q.stats()["lost"] > 0 or time.monotonic() - started > BUDGET_S):
                break
            ids = range(r * VICTIMS_PER_ROUND, (r + 1) * VICTIMS_PER_ROUND)
            procs = {i: ctx.Process(target=_victim, args=(q, i, counters, victim_seen, borrow)) for i in ids}
            survivor.running.clear()
            for p in procs.values():
                p.start()
            try:
                # Kill each victim at a random moment once it has started taking records.
                for i, p in procs.items():
                    wait_until(lambda: counters[f"took{i}"] > 0 or not p.is_alive(),
                               ROUND_TIMEOUT_S, f"consumer {i} to start")
                    time.sleep(rng.uniform(0.0, 0.05))
                    os.kill(p.pid, signal.SIGKILL)
                    kills += 1
                for p in procs.values():
                    p.join(ROUND_TIMEOUT_S)
                    assert p.exitcode == -signal.SIGKILL
            finally:
                for p in procs.values():
                    if p.is_alive():
                        p.kill()
                    p.join()
                survivor.running.set()
            # The producer must get a whole lap past the slots the victims held.
            target = producer.pushed + 2 * CAPACITY + BATCH
            wait_until(lambda: producer.pushed >= target or producer.error is not None,
                       ROUND_TIMEOUT_S, f"the producer to get a lap further in round {r}; "
                       f"stats {q.stats()}")
            assert producer.error is None, f"round {r}: the producer wedged: {producer.error!r}"
            rounds += 1
    finally:
        survivor.running.set()
        producer.stop.set()
        producer.join(ROUND_TIMEOUT_S)
        stats = q.stats()
        q.close()
        survivor.join(ROUND_TIMEOUT_S)
    assert not producer.is_alive() and producer.error is None, producer.error
    assert not survivor.is_alive(), "the surviving consumer did not finish after close"
    assert survivor.error is None, survivor.error
    assert survivor.torn == 0 and counters["torn"] == 0, "a record arrived torn"

    pushed = producer.pushed
    seen = survivor.seen[:pushed].astype(np.int64) + np.frombuffer(victim_seen, np.uint8)[:pushed]
    assert seen.max() <= 1, f"records {np.flatnonzero(seen > 1)[:10].tolist()} arrived twice"
    assert not survivor.seen[pushed:].any() and not np.frombuffer(victim_seen, np.uint8)[pushed:].any()
    unseen = int(np.count_nonzero(seen == 0))
    counters.close()
    print(f"{rounds} rounds, {kills} kills, {pushed} records, {unseen} gone with the victims, "
          f"stats {stats}, {time.monotonic() - started:.1f} s")
    # A victim takes one batch at a time, so it dies with at most one batch: the records
    # it had claimed and not released (counted as lost), plus those it had copied or
    # returned but not yet counted in `seen`. Every other record arrives exactly once.
    assert stats["lost"] <= unseen <= kills * BATCH, (stats, unseen, kills)
    assert stats["skipped"] == 0
    assert stats["lost"] > 0, "no kill landed between a claim and the release of its slots"
