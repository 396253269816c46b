"""A sample either returns its whole batch or takes nothing: a call that raises Empty
counts no draw against max_times_sampled or the rate limiter, and retires no record
(native/README.md, "All or nothing"). Checked alone, then with threads and processes
racing for the last draws, where the property is that no draw is ever lost: once the
racers stop, draining the buffer one record at a time finds exactly the draws they did
not take.
"""
import multiprocessing as mp
import threading

import numpy as np
import pytest

import replay
from replay import PrioritizedReplayBuffer, ReplayBuffer

VALUE = np.dtype([("v", "i8")])
RECORDS, TIMES = 40, 2  # 80 draws in all


def values(n):
    return np.array([(i,) for i in range(n)], VALUE)


def make(kind, capacity, **limits):
    if kind == "prioritized":
        return PrioritizedReplayBuffer(capacity, VALUE, alpha=0.6, **limits)
    return ReplayBuffer(capacity, VALUE, **limits)


def draw(buf, n, **kwargs):
    if isinstance(buf, PrioritizedReplayBuffer):
        return buf.sample(n, **kwargs).records
    return buf.sample(n, **kwargs)


def drain_one_at_a_time(buf) -> np.ndarray:
    """How many more times each record can be drawn, by drawing single records until Empty."""
    left = np.zeros(RECORDS, np.int64)
    while True:
        try:
            left[draw(buf, 1, timeout=0)["v"]] += 1
        except replay.Empty:
            return left


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_batch_larger_than_the_draws_left_takes_nothing(kind):
    with make(kind, 4, max_times_sampled=1, seed=0) as buf:
        buf.add_many(values(4))
        with pytest.raises(replay.Empty, match="nothing was taken"):
            draw(buf, 6, timeout=0)
        assert buf.sampled == 0
        # Every record can still be drawn once: all four come back in one batch of 4.
        assert sorted(draw(buf, 4, timeout=0)["v"].tolist()) == [0, 1, 2, 3]
        assert buf.sampled == 4


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_a_batch_that_times_out_waiting_for_records_takes_nothing(kind):
    with make(kind, 8, max_times_sampled=2, seed=1) as buf:
        buf.add_many(values(3))  # 6 draws left
        with pytest.raises(replay.Empty):
            draw(buf, 7, timeout=0.05)
        assert buf.sampled == 0
        assert drain_one_at_a_time(buf)[:3].tolist() == [2, 2, 2]


def test_under_the_rate_limiter_a_batch_that_falls_short_gives_its_reservation_back():
    # The limiter allows the batch (10 per insert), but only 4 draws are left.
    with ReplayBuffer(4, VALUE, max_times_sampled=1, samples_per_insert=10.0, seed=2) as buf:
        buf.add_many(values(4))
        with pytest.raises(replay.Empty):
            buf.sample(6, timeout=0)
        assert buf.sampled == 0
        assert sorted(buf.sample(4, timeout=0)["v"].tolist()) == [0, 1, 2, 3]
        assert buf.sampled == 4


def test_a_prioritized_record_retires_from_the_tree_only_when_its_draws_are_returned():
    with PrioritizedReplayBuffer(4, VALUE, alpha=1.0, max_times_sampled=1, seed=3) as buf:
        buf.add_many(values(4))
        root, _ = buf.priority_sums()
        with pytest.raises(replay.Empty):
            buf.sample(5, timeout=0)
        assert buf.priority_sums() == (root, root)  # nothing left the tree
        buf.sample(4, timeout=0)
        assert buf.priority_sums() == (0.0, 0.0)  # all four used up and retired


def _race(buf, seed, rounds, returned):
    """Sample batches of 3, 6 or 9 records; count each record returned. RECORDS * TIMES
    is not a multiple of 3, so the last draws can never be taken by a whole batch: the
    racers always end with batches that fall short."""
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        try:
            batch = draw(buf, int(rng.choice([3, 6, 9])), rng=rng, timeout=0.002)
        except replay.Empty:
            continue
        np.add.at(returned, batch["v"], 1)


def _race_in_a_process(buf, seed, rounds, out):
    returned = np.zeros(RECORDS, np.int64)
    _race(buf, seed, rounds, returned)
    out.put(returned)


def check_no_draw_was_lost(buf, returned):
    assert returned.max() <= TIMES
    assert buf.sampled == returned.sum()
    assert (returned + drain_one_at_a_time(buf) == TIMES).all()


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_threads_racing_for_the_last_draws_lose_none(kind):
    with make(kind, RECORDS, max_times_sampled=TIMES) as buf:
        buf.add_many(values(RECORDS))
        counts = [np.zeros(RECORDS, np.int64) for _ in range(4)]
        threads = [threading.Thread(target=_race, args=(buf, i, 300, counts[i])) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        check_no_draw_was_lost(buf, sum(counts))


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_processes_racing_for_the_last_draws_lose_none(kind):
    ctx = mp.get_context("fork")
    with make(kind, RECORDS, max_times_sampled=TIMES) as buf:
        buf.add_many(values(RECORDS))
        out = ctx.Queue()
        workers = [ctx.Process(target=_race_in_a_process, args=(buf, i, 300, out)) for i in range(3)]
        for worker in workers:
            worker.start()
        returned = sum(out.get(timeout=60) for _ in workers)
        for worker in workers:
            worker.join(30)
            assert worker.exitcode == 0
        check_no_draw_was_lost(buf, returned)
