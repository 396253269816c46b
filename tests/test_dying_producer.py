"""Producers killed with SIGKILL while consumers drain: the queue must not wedge.

A producer that dies between claiming a slot and publishing it leaves the slot claimed
forever; consumers skip such a slot once every producer that may own it is gone
(`stats()["skipped"]`). Each round spawns producer processes that push tagged records
(producer id, sequence number) as fast as they can into a small queue, kills some of
them at random moments and lets one survivor push a known number of records, while
consumer threads in this process drain the queue for the whole run.

Records are large (half a MiB) so that a producer spends a good part of its time
copying into slots it has claimed, which is where a kill leaves a slot to skip.
"""
import multiprocessing as mp
import os
import random
import signal
import threading
import time

import numpy as np

import replay
from replay import ArrayQueue, Counters

from waiting import wait_until

PAYLOAD = 512 * 1024
DTYPE = np.dtype([("producer", "i4"), ("seq", "i8"), ("payload", "u1", (PAYLOAD,)), ("check", "i8")])
CAPACITY = 24
SURVIVOR_RECORDS = 300
VICTIMS_PER_ROUND = 3
# At least MIN_ROUNDS rounds; then more, up to MAX_ROUNDS, only until a kill has landed
# between a claim and its publication, and no new round after BUDGET_S seconds.
MIN_ROUNDS, MAX_ROUNDS = 6, 20
BUDGET_S = 28.0
ROUND_TIMEOUT_S = 30.0  # a round whose survivor cannot finish in this time has wedged
PUT_MAX = 8  # records per put_many: a kill cuts one claim short, of at most this many slots


def _producer(q, producer_id, count, counters, seed):
    """Push records (producer_id, 0), (producer_id, 1), ... with put and put_many; stop
    after `count` records, or never (until killed) when count is None."""
    rng = random.Random(seed)
    batch = np.zeros(PUT_MAX, DTYPE)
    batch["producer"] = producer_id
    seq = 0
    name = f"pushed{producer_id}"
    while count is None or seq < count:
        k = 1 if rng.random() < 0.3 else rng.randint(2, len(batch))  # at most PUT_MAX
        if count is not None:
            k = min(k, count - seq)
        batch["seq"][:k] = batch["check"][:k] = np.arange(seq, seq + k)
        if k == 1:
            q.put(batch[0])
        else:
            assert q.put_many(batch[:k]) == k
        seq += k
        counters.add(name, k)


class Drain:
    """Consumer threads that take records until the queue is closed, keeping for each
    record its producer and sequence number in arrival order, per consumer."""

    def __init__(self, q, consumers=2):
        self.q = q
        self.got = [[] for _ in range(consumers)]
        self.torn = [0] * consumers
        self.errors = []
        self.arrived = threading.Condition()
        self.markers = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(consumers)]
        for t in self.threads:
            t.start()

    def _run(self, i):
        out = np.empty(8, DTYPE)
        try:
            while True:
                try:
                    got = self.q.get_many(len(out), out=out)
                except replay.Closed:
                    return
                producer = got["producer"].copy()
                seq = got["seq"].copy()
                self.torn[i] += int(np.count_nonzero(seq != got["check"]))
                self.got[i].append(np.stack([producer, seq], axis=1))
                if (producer < 0).any():
                    with self.arrived:
                        self.markers += int(np.count_nonzero(producer < 0))
                        self.arrived.notify_all()
        except BaseException as error:  # reported by the test
            self.errors.append(error)

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def per_consumer(self):
        """For each consumer, a dict producer id -> sequence numbers in arrival order."""
        result = []
        for chunks in self.got:
            pairs = np.concatenate(chunks) if chunks else np.empty((0, 2), np.int64)
            result.append({int(p): pairs[pairs[:, 0] == p, 1] for p in np.unique(pairs[:, 0])})
        return result


def test_killed_producers_never_wedge_consumers_and_survivors_arrive_exactly_once():
    ctx = mp.get_context("spawn")
    rng = random.Random(1234)
    rounds = []  # (survivor ids, victim ids)
    next_id = 0
    n_ids = MAX_ROUNDS * (VICTIMS_PER_ROUND + 1)
    counters = Counters([f"pushed{i}" for i in range(n_ids)])
    q = ArrayQueue(CAPACITY, DTYPE)
    drain = Drain(q)
    started = time.monotonic()
    try:
        for r in range(MAX_ROUNDS):
            if r >= MIN_ROUNDS and (q.stats()["skipped"] > 0 or time.monotonic() - started > BUDGET_S):
                break
            survivor = next_id
            victims = list(range(next_id + 1, next_id + 1 + VICTIMS_PER_ROUND))
            next_id += 1 + VICTIMS_PER_ROUND
            procs = {survivor: ctx.Process(target=_producer, args=(q, survivor, SURVIVOR_RECORDS, counters, r))}
            for v in victims:
                procs[v] = ctx.Process(target=_producer, args=(q, v, None, counters, 1000 + v))
            for p in procs.values():
                p.start()
            try:
                # Kill each victim at a random moment once it has started pushing.
                for v in victims:
                    wait_until(lambda: counters[f"pushed{v}"] > 0 or not procs[v].is_alive(),
                               ROUND_TIMEOUT_S, f"producer {v} to start")
                    time.sleep(rng.uniform(0.0, 0.08))
                    os.kill(procs[v].pid, signal.SIGKILL)
                procs[survivor].join(ROUND_TIMEOUT_S)
                assert procs[survivor].exitcode == 0, (
                    f"round {r}: the surviving producer did not finish (exit code "
                    f"{procs[survivor].exitcode}): the consumers wedged; stats {q.stats()}")
                for v in victims:
                    procs[v].join(ROUND_TIMEOUT_S)
                    assert procs[v].exitcode == -signal.SIGKILL
            finally:
                for p in procs.values():
                    if p.is_alive():
                        p.kill()
                    p.join()
            rounds.append(([survivor], victims))

        # The queue still works after the skips: markers put now come out behind them.
        markers = np.zeros(CAPACITY, DTYPE)
        markers["producer"] = -1
        markers["seq"] = markers["check"] = np.arange(CAPACITY)
        assert q.put_many(markers, timeout=ROUND_TIMEOUT_S) == CAPACITY
        with drain.arrived:
            assert drain.arrived.wait_for(lambda: drain.markers == CAPACITY, ROUND_TIMEOUT_S), \
                f"markers did not arrive; stats {q.stats()}"
        stats = q.stats()
    finally:
        q.close()
        consumers_finished = drain.join(ROUND_TIMEOUT_S)
    assert consumers_finished, "consumers did not finish after close"
    assert not drain.errors, drain.errors
    assert sum(drain.torn) == 0, "a record arrived torn"

    per_consumer = drain.per_consumer()
    survivors = [s for ss, _ in rounds for s in ss]
    victims = [v for _, vs in rounds for v in vs]
    for received in per_consumer:
        for producer, seqs in received.items():
            assert (np.diff(seqs) > 0).all(), f"producer {producer}'s records out of order"
    merged = {p: np.sort(np.concatenate([c[p] for c in per_consumer if p in c] or [np.empty(0, int)]))
              for p in survivors + victims + [-1]}
    for s in survivors:
        assert merged[s].tolist() == list(range(SURVIVOR_RECORDS)), f"survivor {s}"
    for v in victims:
        # A victim dies during at most one claim: what it published before comes out, and
        # the slots of that claim it had not published are skipped. Those are its last
        # records, so what arrives is a prefix of its records, each once, with no gaps...
        assert merged[v].tolist() == list(range(len(merged[v]))), f"victim {v}"
        # ... that holds every record of a put that returned, and at most one claim more.
        pushed = counters[f"pushed{v}"]
        assert pushed <= len(merged[v]) <= pushed + PUT_MAX, (v, pushed, len(merged[v]))
    assert merged[-1].tolist() == list(range(CAPACITY))
    # Only the kills leave slots to skip, at most one claim each; no consumer died.
    assert stats["skipped"] <= PUT_MAX * len(victims), stats
    assert stats["lost"] == 0, stats
    print(f"{len(rounds)} rounds, {len(victims)} kills, stats {stats}, "
          f"{time.monotonic() - started:.1f} s")
    assert stats["skipped"] > 0, "no kill landed between a claim and its publication"
