"""Properties of ArrayQueue: capacity, order, blocking, batches, close, pickling, dtypes,
input checks, statistics, and the cost of waiting.

Threads and processes started here are always joined; every test checks that it leaves
no shared memory behind.
"""
import multiprocessing as mp
import os
import pickle
import queue
import statistics
import threading
import time
import tracemalloc

import numpy as np
import pytest

import replay
from replay import MAX_CAPACITY, MAX_RECORD_BYTES, ArrayQueue, Closed

from waiting import wait_until

TAGGED = np.dtype([("producer", "i4"), ("seq", "i4")])
JOIN_S = 30.0  # bound on every join: a thread or process still running after it is a hang


class Worker(threading.Thread):
    """A thread that runs fn() and keeps its result or exception."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)  # daemon only so that a hang fails instead of blocking exit
        self.fn, self.args = fn, args
        self.result = self.error = None
        self.start()

    def run(self):
        try:
            self.result = self.fn(*self.args)
        except BaseException as error:
            self.error = error

    def finish(self, timeout=JOIN_S):
        self.join(timeout)
        assert not self.is_alive(), f"{self.fn.__name__} did not finish within {timeout} s"
        return self


def asleep(q, kind, before=0):
    """True once a caller has gone to sleep on `q` waiting for room ("full_waits") or
    for a record ("empty_waits") more often than `before`."""
    return lambda: q.stats()[kind] > before


# ---- basics -------------------------------------------------------------------------


def test_smoke_put_then_get_returns_the_item():
    q = ArrayQueue(4, "i8")
    q.put(7)
    assert q.get() == 7
    q.close()


def test_capacity_and_maxsize_are_the_capacity_given():
    q = ArrayQueue(7, "f4")
    assert q.capacity == q.maxsize == 7
    assert q.dtype == np.dtype("f4")
    q.close()


@pytest.mark.parametrize("capacity", [0, -1, -(2**40)])
def test_zero_or_negative_capacity_is_rejected(capacity):
    with pytest.raises(ValueError, match="capacity"):
        ArrayQueue(capacity, "i8")


def test_capacity_above_max_capacity_is_rejected():
    with pytest.raises(ValueError, match="capacity"):
        ArrayQueue(MAX_CAPACITY + 1, "i8")


@pytest.mark.parametrize("capacity", [2.0, "4", True, None])
def test_capacity_that_is_not_an_int_is_rejected(capacity):
    with pytest.raises(TypeError, match="capacity"):
        ArrayQueue(capacity, "i8")


def test_len_empty_and_full_follow_the_contents():
    q = ArrayQueue(3, "i8")
    assert (len(q), q.qsize(), q.empty(), q.full()) == (0, 0, True, False)
    q.put(1)
    assert (len(q), q.qsize(), q.empty(), q.full()) == (1, 1, False, False)
    q.put_many(np.array([2, 3]))
    assert (len(q), q.qsize(), q.empty(), q.full()) == (3, 3, False, True)
    q.get()
    assert (len(q), q.empty(), q.full()) == (2, False, False)
    q.get_many(5)
    assert (len(q), q.empty(), q.full()) == (0, True, False)
    q.close()


@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_wraparound_over_many_laps_keeps_fifo_order(capacity):
    q = ArrayQueue(capacity, "i8")
    rng = np.random.default_rng(capacity)
    next_in = next_out = 0
    laps = 3000
    while next_in < laps * capacity:
        # Fill to a random level with put or put_many, then drain a random amount.
        room = capacity - len(q)
        k = int(rng.integers(0, room + 1))
        if k == 1 and rng.random() < 0.5:
            q.put(next_in)
        elif k:
            assert q.put_many(np.arange(next_in, next_in + k), block=False) == k
        next_in += k
        take = int(rng.integers(0, len(q) + 1))
        for _ in range(take):
            if rng.random() < 0.5:
                assert q.get_nowait() == next_out
                next_out += 1
            else:
                got = q.get_many(1, block=False)
                assert got.tolist() == [next_out]
                next_out += 1
    rest = q.get_many(capacity, block=False).tolist() if len(q) else []
    assert rest == list(range(next_out, next_in))
    assert q.empty()
    q.close()


# ---- order under concurrency --------------------------------------------------------


def test_spsc_threads_deliver_every_item_in_strict_order():
    n = 20000
    q = ArrayQueue(3, "i8")

    def produce():
        i = 0
        while i < n:
            if i % 7 == 0:
                k = min(5, n - i)
                assert q.put_many(np.arange(i, i + k)) == k
                i += k
            else:
                q.put(i)
                i += 1

    def consume():
        got = []
        while len(got) < n:
            if len(got) % 3 == 0:
                got.append(int(q.get()))
            else:
                got.extend(q.get_many(4).tolist())
        return got

    consumer, producer = Worker(consume), Worker(produce)
    producer.finish()
    consumer.finish()
    assert producer.error is None and consumer.error is None, (producer.error, consumer.error)
    assert consumer.result == list(range(n))
    q.close()


def _produce_tagged(q, producer, n):
    """Push (producer, 0..n-1), alternating single puts and batches."""
    batch = np.zeros(8, TAGGED)
    batch["producer"] = producer
    seq = 0
    while seq < n:
        if seq % 3 == 0:
            q.put((producer, seq))
            seq += 1
        else:
            k = min(len(batch), n - seq)
            batch["seq"][:k] = np.arange(seq, seq + k)
            assert q.put_many(batch[:k]) == k
            seq += k


def _consume_until_closed(q, borrow=False):
    got = []
    try:
        while True:
            if borrow:
                with q.borrow(16) as records:
                    got.append(records.copy())
            else:
                got.append(q.get_many(16).copy())
    except Closed:
        pass
    return np.concatenate(got) if got else np.empty(0, TAGGED)


def _consume_to_pipe(q, conn):
    conn.send(_consume_until_closed(q))
    conn.close()


def check_every_value_once_in_producer_order(per_consumer, producers, n):
    for got in per_consumer:
        for p in range(producers):
            seqs = got["seq"][got["producer"] == p]
            assert (np.diff(seqs) > 0).all(), f"a consumer saw producer {p}'s items out of order"
    everything = np.concatenate(per_consumer)
    assert len(everything) == producers * n
    for p in range(producers):
        assert sorted(everything["seq"][everything["producer"] == p].tolist()) == list(range(n))


@pytest.mark.parametrize("borrow", [False, True], ids=["get_many", "borrow"])
def test_mpmc_threads_deliver_every_value_exactly_once_in_producer_order(borrow):
    producers, consumers, n = 4, 2, 5000
    q = ArrayQueue(8, TAGGED)
    readers = [Worker(_consume_until_closed, q, borrow) for _ in range(consumers)]
    writers = [Worker(_produce_tagged, q, p, n) for p in range(producers)]
    for w in writers:
        w.finish()
        assert w.error is None, w.error
    q.close()
    for r in readers:
        r.finish()
        assert r.error is None, r.error
    check_every_value_once_in_producer_order([r.result for r in readers], producers, n)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_mpmc_processes_deliver_every_value_exactly_once_in_producer_order(method):
    ctx = mp.get_context(method)
    producers, consumers, n = 4, 2, 3000
    q = ArrayQueue(16, TAGGED)
    pipes = [ctx.Pipe(duplex=False) for _ in range(consumers)]
    readers = [ctx.Process(target=_consume_to_pipe, args=(q, send)) for _, send in pipes]
    writers = [ctx.Process(target=_produce_tagged, args=(q, p, n)) for p in range(producers)]
    try:
        for proc in readers + writers:
            proc.start()
        for _, send in pipes:
            send.close()  # the readers hold their own ends
        for w in writers:
            w.join(JOIN_S)
            assert w.exitcode == 0, f"producer exit code {w.exitcode}"
        q.close()
        results = []
        for recv, _ in pipes:
            assert recv.poll(JOIN_S), "a consumer did not report"
            results.append(recv.recv())
        for r in readers:
            r.join(JOIN_S)
            assert r.exitcode == 0, f"consumer exit code {r.exitcode}"
    finally:
        for proc in readers + writers:
            if proc.is_alive():
                proc.kill()
            proc.join()
    check_every_value_once_in_producer_order(results, producers, n)


# ---- borrowing records in place -----------------------------------------------------


def test_borrow_lends_records_in_place_read_only_and_frees_their_slots_at_the_end():
    q = ArrayQueue(6, TAGGED)
    q.put_many(np.array([(0, i) for i in range(4)], TAGGED))
    with q.borrow(8) as records:
        assert records["seq"].tolist() == [0, 1, 2, 3]
        assert not records.flags.writeable
        assert q.qsize() == 0  # taken, as by a get
        # Their slots stay out of the producers' reach: only the two free ones fill.
        assert q.put_many(np.array([(1, i) for i in range(6)], TAGGED), block=False) == 2
    assert q.put_many(np.array([(2, i) for i in range(4)], TAGGED), block=False) == 4
    assert q.get_many(8)["producer"].tolist() == [1, 1, 2, 2, 2, 2]
    q.close()


def test_borrow_stops_at_the_end_of_the_ring_and_the_next_borrow_goes_on():
    q = ArrayQueue(5, TAGGED)
    q.put_many(np.array([(0, i) for i in range(3)], TAGGED))
    q.get_many(3)
    q.put_many(np.array([(0, i) for i in range(3, 7)], TAGGED))  # positions 3..6: slots 3, 4, 0, 1
    with q.borrow(8) as first:
        assert first["seq"].tolist() == [3, 4]
    with q.borrow(8) as second:
        assert second["seq"].tolist() == [5, 6]
    q.close()


def test_a_get_or_borrow_inside_a_borrow_is_refused_and_takes_nothing():
    q = ArrayQueue(4, TAGGED)
    q.put_many(np.array([(0, 0), (0, 1)], TAGGED))
    with q.borrow(1) as records:
        for take in (lambda: q.get_many(1), lambda: q.get(), lambda: q.borrow(1).__enter__()):
            with pytest.raises(RuntimeError, match="borrowed from this queue"):
                take()
        assert records["seq"].tolist() == [0]
    assert q.get()["seq"] == 1  # the refused calls took nothing
    q.close()


def test_a_borrow_ended_by_an_exception_frees_its_slots():
    q = ArrayQueue(2, TAGGED)
    q.put_many(np.array([(0, 0), (0, 1)], TAGGED))
    with pytest.raises(KeyError):
        with q.borrow(2):
            raise KeyError("in the block")
    assert q.put_many(np.array([(1, 0), (1, 1)], TAGGED), block=False) == 2
    q.close()


def test_borrow_on_empty_waits_like_get_many():
    q = ArrayQueue(4, TAGGED)
    with pytest.raises(queue.Empty):
        with q.borrow(1, block=False):
            pass
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        with q.borrow(1, timeout=0.05):
            pass
    assert time.monotonic() - started >= 0.05

    def borrow_one():
        with q.borrow(4) as records:
            return records.copy()

    reader = Worker(borrow_one)
    wait_until(asleep(q, "empty_waits"), JOIN_S, "the borrower to sleep")
    q.put((3, 4))
    assert reader.finish().error is None and reader.result.tolist() == [(3, 4)]

    def borrow_until_closed():
        with q.borrow(1):
            pass

    closer = Worker(borrow_until_closed)
    wait_until(asleep(q, "empty_waits", 1), JOIN_S, "the borrower to sleep")
    q.close()
    assert isinstance(closer.finish().error, Closed)


def test_a_borrow_ended_on_another_thread_is_refused_and_releases_nothing():
    """A generator's `with q.borrow()` finished by another thread: refused, and that
    thread's own loan stays intact."""
    q = ArrayQueue(4, TAGGED)
    q.put_many(np.array([(0, 0), (0, 1)], TAGGED))

    def lend_one():
        with q.borrow(1) as records:
            yield records

    gen = Worker(lambda: (lambda g: (next(g), g))(lend_one())).finish().result[1]
    with q.borrow(1) as mine:
        with pytest.raises(RuntimeError, match="end on the thread that began it"):
            gen.close()
        assert q.put_many(np.array([(1, 0)] * 4, TAGGED), block=False) == 2  # both loans hold
        assert mine.tolist() == [(0, 1)]
    q.close()


def test_a_lent_view_kept_after_its_queue_is_gone_does_not_crash():
    """Misuse, but not a crash: the memory stays mapped while a view of it lives."""
    import gc

    q = ArrayQueue(2, TAGGED)
    q.put((5, 6))
    with q.borrow(1) as records:
        kept = records
    q.close()
    del q
    gc.collect()
    assert kept.tolist() == [(5, 6)]


def test_a_borrow_is_used_once():
    q = ArrayQueue(2, TAGGED)
    q.put((0, 0))
    loan = q.borrow(1)
    with loan:
        pass
    with pytest.raises(RuntimeError, match="used once"):
        loan.__enter__()
    q.close()


def test_borrow_checks_its_arguments():
    q = ArrayQueue(4, TAGGED)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_items"):
            q.borrow(bad).__enter__()
    with pytest.raises(ValueError, match="timeout"):
        q.borrow(1, timeout=0).__enter__()
    q.close()


# ---- blocking and timeouts ----------------------------------------------------------


def test_put_on_full_with_block_false_raises_full():
    q = ArrayQueue(2, "i8")
    q.put(1)
    q.put(2)
    with pytest.raises(queue.Full):
        q.put(3, block=False)
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    assert len(q) == 2
    q.close()


def test_get_on_empty_with_block_false_raises_empty():
    q = ArrayQueue(2, "i8")
    with pytest.raises(queue.Empty):
        q.get(block=False)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get_many(3, block=False)
    q.close()


def test_put_on_full_with_timeout_raises_full_after_the_timeout():
    q = ArrayQueue(1, "i8")
    q.put(1)
    started = time.monotonic()
    with pytest.raises(queue.Full):
        q.put(2, timeout=0.2)
    elapsed = time.monotonic() - started
    assert 0.2 <= elapsed < 1.5
    started = time.monotonic()
    with pytest.raises(queue.Full):
        q.put_many(np.array([2, 3]), timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 1.5
    assert q.get_nowait() == 1
    q.close()


def test_get_on_empty_with_timeout_raises_empty_after_the_timeout():
    q = ArrayQueue(1, "i8")
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 1.5
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get_many(4, timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 1.5
    q.close()


def test_a_timeout_takes_the_fast_path_while_there_is_room_or_an_item(monkeypatch):
    # With a timeout, a call that can move at once makes one C call, as without one: it
    # works out no deadline and never enters the waiting loop.
    def must_not_run(*args):
        raise AssertionError("waited or worked out a deadline while it could move at once")

    q = ArrayQueue(4, "i8")
    monkeypatch.setattr(replay.queue, "deadline_of", must_not_run)
    monkeypatch.setattr(ArrayQueue, "_move", must_not_run)
    q.put(1, timeout=30)
    assert q.put_many(np.array([2, 3]), timeout=30) == 2
    assert q.get(timeout=30) == 1
    assert q.get_many(4, timeout=30).tolist() == [2, 3]
    monkeypatch.undo()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)  # and an empty queue still waits, then raises
    q.close()


def test_timeout_is_ignored_when_block_is_false_as_in_queue_queue():
    q = ArrayQueue(1, "i8")
    q.put(1, block=False, timeout=-1)
    with pytest.raises(queue.Full):
        q.put(2, block=False, timeout=float("nan"))
    assert q.get(block=False, timeout=0) == 1
    q.close()


def test_blocked_get_is_woken_by_a_put_from_another_thread():
    q = ArrayQueue(2, "i8")
    consumer = Worker(q.get)
    wait_until(asleep(q, "empty_waits"), what="the consumer to sleep")
    q.put(42)
    consumer.finish()
    assert consumer.error is None and consumer.result == 42
    q.close()


def test_blocked_get_is_woken_by_close_and_raises_closed():
    q = ArrayQueue(2, "i8")
    consumer = Worker(q.get)
    wait_until(asleep(q, "empty_waits"), what="the consumer to sleep")
    q.close()
    consumer.finish(timeout=5)
    assert isinstance(consumer.error, Closed)


def test_blocked_get_many_is_woken_by_close_and_raises_closed():
    q = ArrayQueue(2, "i8")
    consumer = Worker(q.get_many, 2)
    wait_until(asleep(q, "empty_waits"), what="the consumer to sleep")
    q.close()
    consumer.finish(timeout=5)
    assert isinstance(consumer.error, Closed)


def test_blocked_put_on_full_is_woken_by_a_get():
    q = ArrayQueue(2, "i8")
    q.put_many(np.array([1, 2]))
    producer = Worker(q.put, 3)
    wait_until(asleep(q, "full_waits"), what="the producer to sleep")
    assert q.get() == 1
    producer.finish()
    assert producer.error is None
    assert q.get_many(2, block=False).tolist() == [2, 3]
    q.close()


def test_blocked_put_on_full_is_woken_by_close_and_raises_closed():
    q = ArrayQueue(1, "i8")
    q.put(1)
    producer = Worker(q.put, 2)
    wait_until(asleep(q, "full_waits"), what="the producer to sleep")
    q.close()
    producer.finish(timeout=5)
    assert isinstance(producer.error, Closed)
    assert q.get() == 1  # what was in the queue is still there to drain


def test_blocked_put_many_is_woken_by_close_and_reports_what_it_put():
    q = ArrayQueue(2, "i8")
    producer = Worker(q.put_many, np.arange(5))
    wait_until(asleep(q, "full_waits"), what="the producer to sleep")
    q.close()
    producer.finish(timeout=5)
    assert producer.error is None and producer.result == 2
    assert q.get_many(5).tolist() == [0, 1]


# ---- batches ------------------------------------------------------------------------


def test_put_many_of_an_empty_array_returns_zero_without_waiting():
    q = ArrayQueue(1, "i8")
    assert q.put_many(np.empty(0, "i8")) == 0
    q.put(1)
    started = time.monotonic()
    assert q.put_many(np.empty(0, "i8")) == 0  # full, yet no wait: nothing to put
    assert time.monotonic() - started < 0.5
    assert len(q) == 1
    q.close()


def test_put_many_of_exactly_capacity_fills_the_queue():
    q = ArrayQueue(5, "i8")
    assert q.put_many(np.arange(5), block=False) == 5
    assert q.full()
    assert q.get_many(5).tolist() == list(range(5))
    q.close()


def test_put_many_over_capacity_without_blocking_puts_capacity_and_leaves_the_rest():
    q = ArrayQueue(4, "i8")
    items = np.arange(10)
    assert q.put_many(items, block=False) == 4
    assert q.get_many(10, block=False).tolist() == [0, 1, 2, 3]
    assert q.put_many(items[4:], block=False) == 4
    assert q.get_many(10, block=False).tolist() == [4, 5, 6, 7]
    q.close()


def test_put_many_over_capacity_with_blocking_puts_everything_while_a_consumer_drains():
    n = 1000
    q = ArrayQueue(4, "i8")

    def consume():
        got = []
        while len(got) < n:
            got.extend(q.get_many(3).tolist())
        return got

    consumer = Worker(consume)
    assert q.put_many(np.arange(n)) == n
    consumer.finish()
    assert consumer.error is None and consumer.result == list(range(n))
    q.close()


def test_put_many_with_a_timeout_returns_how_many_it_put_before_the_timeout():
    q = ArrayQueue(2, "i8")
    started = time.monotonic()
    assert q.put_many(np.arange(5), timeout=0.2) == 2
    assert 0.2 <= time.monotonic() - started < 1.5
    assert q.get_many(5).tolist() == [0, 1]
    q.close()


def test_items_are_copied_in_and_out():
    q = ArrayQueue(4, "i8")
    items = np.array([1, 2, 3])
    q.put_many(items)
    items[:] = 0
    out = np.zeros(4, "i8")
    got = q.get_many(4, out=out)
    assert got.tolist() == [1, 2, 3]
    q.put_many(np.array([9]))
    assert got.tolist() == [1, 2, 3]  # what get_many returned is not the queue's memory
    q.close()


def test_numpy_integers_are_accepted_as_counts():
    q = ArrayQueue(np.int64(4), "i8")
    assert q.capacity == 4 and type(q.capacity) is int
    q.put_many(np.arange(3))
    assert q.get_many(np.int32(2)).tolist() == [0, 1]
    q.close()


def test_put_many_accepts_a_non_contiguous_array():
    q = ArrayQueue(8, "i8")
    assert q.put_many(np.arange(10)[::2]) == 5
    assert q.get_many(8).tolist() == [0, 2, 4, 6, 8]
    q.close()


def test_get_many_with_out_returns_a_view_of_out_and_allocates_nothing():
    n = 4096
    q = ArrayQueue(n, "f8")
    q.put_many(np.arange(n, dtype="f8"))
    out = np.full(n + 10, -1.0)
    q.get_many(1, out=out)  # warm up: first-call caches do not count
    tracemalloc.start()
    try:
        got = q.get_many(n, out=out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.base is out and np.shares_memory(got, out)
    assert got.tolist() == list(range(1, n))
    assert peak < n * 8 // 8, f"get_many with out= allocated {peak} bytes"
    q.close()


def test_get_many_larger_than_the_contents_returns_what_is_there():
    q = ArrayQueue(16, "i8")
    q.put_many(np.arange(3))
    assert q.get_many(10).tolist() == [0, 1, 2]  # blocking: the first item was there
    q.put_many(np.arange(3, 5))
    assert q.get_many(10, block=False).tolist() == [3, 4]
    q.close()


# ---- close --------------------------------------------------------------------------


def test_close_refuses_puts_and_lets_gets_drain_the_rest_then_raise_closed():
    q = ArrayQueue(4, "i8")
    q.put_many(np.arange(3))
    q.close()
    assert q.closed
    with pytest.raises(Closed):
        q.put(9)
    with pytest.raises(Closed):
        q.put_nowait(9)
    with pytest.raises(Closed):
        q.put_many(np.array([9, 9]))
    with pytest.raises(Closed):
        q.put_many(np.array([9]), block=False)
    assert q.get() == 0
    assert q.get_many(1).tolist() == [1]
    assert q.get_nowait() == 2
    for drained in (q.get, q.get_nowait, lambda: q.get(timeout=5), lambda: q.get_many(4),
                    lambda: q.get_many(4, block=False)):
        started = time.monotonic()
        with pytest.raises(Closed):
            drained()
        assert time.monotonic() - started < 1.0  # at once, not after the timeout
    q.close()  # closing again is harmless


def test_closed_is_not_an_empty_or_full_exception():
    assert not issubclass(Closed, (queue.Empty, queue.Full))
    assert replay.Empty is queue.Empty and replay.Full is queue.Full


def test_context_manager_closes_the_queue_and_removes_its_shared_memory():
    with ArrayQueue(4, "i8") as q:
        q.put(1)
        name = q._segment.name
        assert os.path.exists(f"/dev/shm/{name}")
    assert q.closed
    assert not os.path.exists(f"/dev/shm/{name}")
    assert q.get() == 1
    with pytest.raises(Closed):
        q.get()


# ---- pickling and dtypes ------------------------------------------------------------


def test_a_queue_pickled_and_unpickled_in_the_same_process_is_the_same_queue():
    q = ArrayQueue(4, TAGGED)
    twin = pickle.loads(pickle.dumps(q))
    assert (twin.capacity, twin.dtype) == (q.capacity, q.dtype)
    q.put((1, 2))
    assert twin.get().tolist() == (1, 2)
    twin.put_many(np.array([(3, 4), (5, 6)], TAGGED))
    assert len(q) == 2
    assert q.get_many(2).tolist() == [(3, 4), (5, 6)]
    q.close()
    assert twin.closed
    with pytest.raises(Closed):
        pickle.loads(pickle.dumps(q))  # the name is gone: nothing to attach to


def test_subarray_dtype_items_come_back_with_their_shape():
    q = ArrayQueue(4, ("f4", (3, 2)))
    item = np.arange(6, dtype="f4").reshape(3, 2)
    q.put(item)
    q.put(item.T.copy().T)  # not C-contiguous
    q.put([[1, 2], [3, 4], [5, 6]])
    got = q.get()
    assert got.shape == (3, 2) and got.dtype == np.dtype("f4")
    assert np.array_equal(got, item)
    assert np.array_equal(q.get(), item)
    assert np.array_equal(q.get(), [[1, 2], [3, 4], [5, 6]])
    batch = np.arange(18, dtype="f4").reshape(3, 3, 2)
    assert q.put_many(batch) == 3
    many = q.get_many(4)
    assert many.shape == (3, 3, 2) and np.array_equal(many, batch)
    out = np.zeros((4, 3, 2), "f4")
    q.put_many(batch[:2])
    assert np.array_equal(q.get_many(4, out=out), batch[:2])
    q.close()


@pytest.mark.parametrize("dtype, value", [("i8", -(2**62)), ("f8", 2.5), ("?", True), ("u1", 255),
                                          ("S5", b"hello"), ("c16", 1 - 2j)])
def test_plain_scalar_dtypes_round_trip(dtype, value):
    q = ArrayQueue(2, dtype)
    q.put(value)
    got = q.get()
    assert got == value and got.dtype == np.dtype(dtype)
    q.put_many(np.array([value, value], dtype))
    assert q.get_many(2).tolist() == [value, value]
    q.close()


def test_structured_records_round_trip_from_tuples_and_rows():
    dtype = np.dtype([("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"), ("done", "?")])
    q = ArrayQueue(4, dtype)
    q.put((np.arange(4), 3, 0.5, True))
    rows = np.zeros(3, dtype)
    rows["action"] = [7, 8, 9]
    q.put(rows[1])  # a row of a record array
    got = q.get()
    assert got["obs"].tolist() == [0, 1, 2, 3] and got["action"] == 3 and got["done"]
    assert q.get()["action"] == 8
    q.close()


def test_a_record_of_exactly_max_record_bytes_is_accepted():
    q = ArrayQueue(1, ("u1", MAX_RECORD_BYTES))
    item = np.full(MAX_RECORD_BYTES, 7, "u1")
    q.put(item)
    assert np.array_equal(q.get(), item)
    q.close()


# ---- bad input ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype, error, match", [
    (object, TypeError, "Python objects"),
    ([("a", "i8"), ("b", "O")], TypeError, "Python objects"),
    (("u1", MAX_RECORD_BYTES + 1), ValueError, "more than the limit"),
    (np.dtype([]), ValueError, "size 0"),
])
def test_bad_dtype_is_rejected_before_any_shared_memory_is_made(dtype, error, match):
    with pytest.raises(error, match=match):
        ArrayQueue(4, dtype)


NAN = float("nan")
SCALAR_BAD_INPUTS = {
    "put of another dtype": (lambda q: q.put(np.int32(5)), TypeError),
    "put of another shape": (lambda q: q.put(np.zeros(3, "i8")), TypeError),
    "put of a string": (lambda q: q.put("five"), TypeError),
    "put of an object array": (lambda q: q.put(np.array(5, dtype=object)), TypeError),
    "put of an int too large": (lambda q: q.put(2**70), (TypeError, OverflowError)),
    "put with timeout 0": (lambda q: q.put(5, timeout=0), ValueError),
    "put with a negative timeout": (lambda q: q.put(5, timeout=-1), ValueError),
    "put with a NaN timeout": (lambda q: q.put(5, timeout=NAN), ValueError),
    "get with timeout 0": (lambda q: q.get(timeout=0), ValueError),
    "get with a negative timeout": (lambda q: q.get(timeout=-0.5), ValueError),
    "get with a NaN timeout": (lambda q: q.get(timeout=NAN), ValueError),
    "put_many of a list": (lambda q: q.put_many([5, 6]), TypeError),
    "put_many of another dtype": (lambda q: q.put_many(np.array([5, 6], "i4")), TypeError),
    "put_many of another shape": (lambda q: q.put_many(np.zeros((2, 2), "i8")), TypeError),
    "put_many of a 0-d array": (lambda q: q.put_many(np.array(5, "i8")), TypeError),
    "put_many of an object array": (lambda q: q.put_many(np.array([5, 6], object)), TypeError),
    "put_many with timeout 0": (lambda q: q.put_many(np.array([5]), timeout=0), ValueError),
    "put_many with a NaN timeout": (lambda q: q.put_many(np.array([5]), timeout=NAN), ValueError),
    "get_many of 0 items": (lambda q: q.get_many(0), ValueError),
    "get_many of -1 items": (lambda q: q.get_many(-1), ValueError),
    "get_many of a float count": (lambda q: q.get_many(1.0), ValueError),
    "get_many of True items": (lambda q: q.get_many(True), ValueError),
    "get_many with a negative timeout": (lambda q: q.get_many(1, timeout=-1), ValueError),
    "get_many with a NaN timeout": (lambda q: q.get_many(1, timeout=NAN), ValueError),
    "get_many into a list": (lambda q: q.get_many(2, out=[0, 0]), TypeError),
    "get_many into another dtype": (lambda q: q.get_many(2, out=np.zeros(2, "i4")), TypeError),
    "get_many into a 2-d out": (lambda q: q.get_many(2, out=np.zeros((2, 1), "i8")), TypeError),
    "get_many into a short out": (lambda q: q.get_many(3, out=np.zeros(2, "i8")), ValueError),
    "get_many into a strided out": (lambda q: q.get_many(2, out=np.zeros(4, "i8")[::2]), ValueError),
    "get_many into a read-only out": (
        lambda q: q.get_many(2, out=np.lib.stride_tricks.as_strided(np.zeros(2, "i8"), writeable=False)),
        ValueError),
}
SUBARRAY_BAD_INPUTS = {
    "put of the transposed shape": (lambda q: q.put(np.zeros((2, 3), "f4")), TypeError),
    "put of another base dtype": (lambda q: q.put(np.zeros((3, 2), "f8")), TypeError),
    "put of a nested list of another shape": (lambda q: q.put([[1, 2], [3, 4]]), ValueError),
    "put of a scalar": (lambda q: q.put(1.0), ValueError),
    "put_many of another base dtype": (lambda q: q.put_many(np.zeros((2, 3, 2), "f8")), TypeError),
    "put_many of flattened items": (lambda q: q.put_many(np.zeros((2, 6), "f4")), TypeError),
    "put_many of one item without the batch axis": (lambda q: q.put_many(np.zeros((3, 2), "f4")), TypeError),
    "get_many into items of another shape": (lambda q: q.get_many(2, out=np.zeros((2, 2, 3), "f4")), TypeError),
}


def _check_bad_input_leaves_the_queue_as_it_was(q, first, second, call, error):
    with pytest.raises(error) as info:
        call(q)
    assert str(info.value), "the error says nothing"
    assert len(q) == 2, "a bad call changed the queue's length"
    got = q.get_many(4, block=False)
    assert np.array_equal(got[0], first) and np.array_equal(got[1], second)
    q.close()


@pytest.mark.parametrize("case", sorted(SCALAR_BAD_INPUTS))
def test_bad_input_gives_a_clear_error_and_leaves_the_queue_unchanged(case):
    call, error = SCALAR_BAD_INPUTS[case]
    q = ArrayQueue(4, "i8")
    q.put_many(np.array([10, 11]))
    _check_bad_input_leaves_the_queue_as_it_was(q, 10, 11, call, error)


@pytest.mark.parametrize("case", sorted(SUBARRAY_BAD_INPUTS))
def test_bad_input_for_a_subarray_dtype_gives_a_clear_error_and_leaves_the_queue_unchanged(case):
    call, error = SUBARRAY_BAD_INPUTS[case]
    q = ArrayQueue(4, ("f4", (3, 2)))
    first, second = np.zeros((3, 2), "f4"), np.ones((3, 2), "f4")
    q.put(first)
    q.put(second)
    _check_bad_input_leaves_the_queue_as_it_was(q, first, second, call, error)


def test_more_producer_threads_than_the_limit_get_a_clear_error_and_finished_ones_free_their_entry():
    limit = replay.queue.MAX_PRODUCERS
    q = ArrayQueue(limit + 8, "i8")
    release = threading.Event()

    def put_then_wait(i):
        q.put(i)
        release.wait(JOIN_S)

    producers = [Worker(put_then_wait, i) for i in range(limit)]
    try:
        wait_until(lambda: len(q) == limit, what="every producer thread to put")
        with pytest.raises(RuntimeError, match=f"more than {limit} threads"):
            q.put(-1)
        assert len(q) == limit
    finally:
        release.set()
        for p in producers:
            p.finish()
    assert all(p.error is None for p in producers)
    q.put(-1)  # the entries of threads that ended are taken over
    assert sorted(q.get_many(limit + 1).tolist()) == [-1] + list(range(limit))
    q.close()


def test_more_consumer_threads_than_the_limit_get_a_clear_error_and_finished_ones_free_their_entry():
    limit = replay.queue.MAX_CONSUMERS
    q = ArrayQueue(limit + 8, "i8")
    q.put_many(np.arange(limit + 2))
    release = threading.Event()
    got = []

    def get_then_wait():
        got.append(int(q.get()))
        release.wait(JOIN_S)

    consumers = [Worker(get_then_wait) for _ in range(limit)]
    try:
        wait_until(lambda: len(got) == limit, what="every consumer thread to get")
        with pytest.raises(RuntimeError, match=f"more than {limit} threads are getting"):
            q.get()
        assert len(q) == 2
    finally:
        release.set()
        for c in consumers:
            c.finish()
    assert all(c.error is None for c in consumers)
    got += q.get_many(2).tolist()  # the entries of threads that ended are taken over
    assert sorted(got) == list(range(limit + 2))
    q.close()


# ---- statistics and the cost of waiting ---------------------------------------------


def test_stats_count_waits_on_full_and_on_empty_and_nothing_else():
    q = ArrayQueue(1, "i8")
    assert q.stats() == {"full_waits": 0, "empty_waits": 0, "skipped": 0, "lost": 0}
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put(1)
    with pytest.raises(queue.Full):
        q.put_nowait(2)
    assert q.stats() == {"full_waits": 0, "empty_waits": 0, "skipped": 0, "lost": 0}, \
        "a call that did not wait counted"
    with pytest.raises(queue.Full):
        q.put(2, timeout=0.1)
    assert q.stats()["full_waits"] >= 1 and q.stats()["empty_waits"] == 0
    q.get()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.1)
    stats = q.stats()
    assert stats["empty_waits"] >= 1 and stats["skipped"] == 0
    q.close()


def test_an_idle_consumer_blocked_in_get_uses_little_cpu():
    q = ArrayQueue(4, "i8")

    def idle():
        cpu, wall = time.thread_time(), time.monotonic()
        try:
            q.get(timeout=1.0)
        except queue.Empty:
            pass
        return time.thread_time() - cpu, time.monotonic() - wall

    consumer = Worker(idle).finish()
    assert consumer.error is None
    cpu, wall = consumer.result
    assert wall >= 1.0
    assert cpu < 0.05 * wall, f"a consumer blocked for {wall:.2f} s used {cpu:.3f} s of CPU"
    q.close()


def test_a_sleeping_consumer_wakes_within_milliseconds_of_a_put():
    # A loose bound on the median, not a benchmark: a lost wake-up would show up as a
    # whole wait slice (50 ms), a polling consumer as a busy core in the test above.
    rounds = 30
    q = ArrayQueue(4, "i8")
    received = threading.Event()
    arrivals = []

    def consume():
        for _ in range(rounds):
            q.get()
            arrivals.append(time.perf_counter())
            received.set()

    consumer = Worker(consume)
    latencies = []
    for i in range(rounds):
        wait_until(asleep(q, "empty_waits", q.stats()["empty_waits"]), what="the consumer to sleep")
        received.clear()
        sent = time.perf_counter()
        q.put(i)
        assert received.wait(JOIN_S)
        latencies.append(arrivals[-1] - sent)
    consumer.finish()
    assert consumer.error is None
    median = statistics.median(latencies)
    assert median < 0.005, f"median wake-up {median * 1e3:.2f} ms (max {max(latencies) * 1e3:.2f} ms)"
    q.close()


def test_repr_shows_fill_and_closed_state():
    q = ArrayQueue(3, "i8")
    q.put(1)
    assert "1/3" in repr(q)
    q.close()
    assert "closed" in repr(q)



def test_an_infinite_timeout_waits_like_no_timeout():
    q = ArrayQueue(2, "i8")
    putter = Worker(lambda: (time.sleep(0.05), q.put(7)))
    assert q.get(timeout=float("inf")) == 7
    putter.finish()
    assert q.put_many(np.arange(2), timeout=float("inf")) == 2


@pytest.mark.parametrize("dtype, value", [("i8", 5.7), ("u1", 1.5), ("f8", 1 + 2j), ("?", 0.5)])
def test_a_lossy_conversion_is_refused_and_nothing_is_written(dtype, value):
    q = ArrayQueue(2, dtype)
    with pytest.raises(TypeError, match="without losing information"):
        q.put(value)
    assert len(q) == 0


def _create_queue_and_exit(names):
    names.put(replay.ArrayQueue(2, "i8")._segment.name)  # alive when the child exits


def test_a_queue_created_in_a_fork_child_is_removed_when_the_child_exits():
    ctx = mp.get_context("fork")
    names = ctx.Queue()
    child = ctx.Process(target=_create_queue_and_exit, args=(names,))
    child.start()
    name = names.get(timeout=JOIN_S)
    child.join(JOIN_S)
    assert child.exitcode == 0
    assert name not in os.listdir("/dev/shm")
