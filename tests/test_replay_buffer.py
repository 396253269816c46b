"""Properties of ReplayBuffer: positions and counts, overwrite order, uniform and `recent`
draws, seeds, untorn records under concurrent overwrite (threads and processes),
pickling, reuse limits, save/load, and clear errors that leave the buffer unchanged.

Every test checks (conftest) that it leaves no shared memory behind.
"""
import multiprocessing as mp
import os
import pickle
import threading
import time
import tracemalloc

import numpy as np
import pytest

import replay
from replay import ReplayBuffer

from conftest import VALUE, chi_square_limit, values

TRANSITION = np.dtype([("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"), ("done", "?")])
JOIN_S = 30.0


# ---- positions, counts, order -------------------------------------------------------


def test_smoke_add_then_sample_returns_the_record():
    with ReplayBuffer(4, TRANSITION) as buf:
        buf.add((np.arange(4), 3, 0.5, True))
        record = buf.sample(1)[0]
        assert record["action"] == 3 and record["reward"] == 0.5 and record["done"]
        assert record["obs"].tolist() == [0, 1, 2, 3]


def test_positions_are_absolute_and_increase_across_add_and_add_many():
    with ReplayBuffer(3, VALUE) as buf:
        assert [buf.add((i,)) for i in range(4)] == [0, 1, 2, 3]
        assert buf.add_many(values(4, 9)) == 4
        assert buf.add(9) == 9
        assert buf.add_many(values(0, 0)) == 10  # an empty batch: the next position


def test_len_and_added_are_exact():
    with ReplayBuffer(5, VALUE) as buf:
        assert len(buf) == 0 and buf.added == 0 and buf.sampled == 0
        buf.add_many(values(0, 3))
        assert len(buf) == 3 and buf.added == 3
        buf.add_many(values(3, 12))
        assert len(buf) == 5 and buf.added == 12
        buf.sample(7)
        assert buf.sampled == 7


def test_len_and_added_are_exact_after_concurrent_writer_threads():
    with ReplayBuffer(64, VALUE) as buf:
        def batch(k, i):
            return 1 + (i + k) % 5 if i % 2 else 1

        def write(k):
            for i in range(200):
                buf.add_many(values(0, batch(k, i)))
        threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_S)
        expected = sum(batch(k, i) for k in range(4) for i in range(200))
        assert buf.added == expected == buf.stats()["claimed"]
        assert len(buf) == 64


def test_overwrite_order_keeps_the_newest_capacity_records():
    with ReplayBuffer(4, VALUE) as buf:
        for i in range(10):
            buf.add((i,))
        records, positions = buf.sample(400, rng=0, return_indices=True)
        assert set(records["v"].tolist()) == {6, 7, 8, 9}
        assert (records["v"] == positions.astype(np.int64)).all()


def test_add_many_longer_than_capacity_keeps_its_last_records():
    with ReplayBuffer(4, VALUE) as buf:
        assert buf.add_many(values(0, 11)) == 0
        assert buf.added == 11 and len(buf) == 4
        assert set(buf.sample(200, rng=1)["v"].tolist()) == {7, 8, 9, 10}


def test_subarray_dtype_records_come_back_with_their_shape():
    with ReplayBuffer(2, np.dtype(("u1", (3, 5)))) as buf:
        buf.add(np.full((3, 5), 7, np.uint8))
        out = buf.sample(2)
        assert out.shape == (2, 3, 5) and (out == 7).all()


# ---- how records are drawn --------------------------------------------------------


def test_uniform_sampling_is_uniform():
    capacity, draws = 50, 100_000
    with ReplayBuffer(capacity, VALUE, seed=7) as buf:
        buf.add_many(values(0, 3 * capacity))  # wrapped twice: slots and positions differ
        counts = np.bincount(buf.sample(draws)["v"] - 2 * capacity, minlength=capacity)
    assert counts.sum() == draws and len(counts) == capacity
    expected = draws / capacity
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < chi_square_limit(capacity - 1), (chi2, counts)


def test_recent_draws_only_from_the_window():
    with ReplayBuffer(100, VALUE, seed=3) as buf:
        buf.add_many(values(0, 250))
        for recent in (1, 7, 100):
            drawn = buf.sample(5000, recent=recent)["v"]
            assert drawn.min() >= 250 - recent and drawn.max() == 249
            assert len(np.unique(drawn)) == recent  # every record of the window shows up


def test_recent_larger_than_the_contents_draws_from_what_is_there():
    with ReplayBuffer(100, VALUE) as buf:
        buf.add_many(values(0, 5))
        assert set(buf.sample(500, recent=50)["v"].tolist()) == set(range(5))


def test_the_same_seed_draws_the_same_records():
    with ReplayBuffer(1000, VALUE, seed=11) as a, ReplayBuffer(1000, VALUE, seed=11) as b:
        a.add_many(values(0, 1000))
        b.add_many(values(0, 1000))
        assert (a.sample(64)["v"] == b.sample(64)["v"]).all()
        assert (a.sample(64, rng=5)["v"] == a.sample(64, rng=5)["v"]).all()
        g1, g2 = np.random.default_rng(9), np.random.default_rng(9)
        assert (a.sample(64, rng=g1)["v"] == b.sample(64, rng=g2)["v"]).all()
        assert (a.sample(64, rng=g1)["v"] != a.sample(64, rng=5)["v"]).any()


def test_pickled_copies_of_a_seeded_buffer_draw_different_reproducible_numbers():
    with ReplayBuffer(1000, VALUE, seed=11) as buf:
        buf.add_many(values(0, 1000))
        c1, c2 = pickle.loads(pickle.dumps(buf)), pickle.loads(pickle.dumps(buf))
        d1, d2 = c1.sample(32)["v"], c2.sample(32)["v"]
        assert (d1 != d2).any()
    with ReplayBuffer(1000, VALUE, seed=11) as again:
        again.add_many(values(0, 1000))
        assert (pickle.loads(pickle.dumps(again)).sample(32)["v"] == d1).all()


def _sample_in_child(buf, out_queue):
    out_queue.put(buf.sample(16)["v"].tolist())


@pytest.mark.parametrize("seed", [None, 4])
def test_a_forked_child_draws_other_numbers_than_its_parent(seed):
    ctx = mp.get_context("fork")
    with ReplayBuffer(1000, VALUE, seed=seed) as buf:
        buf.add_many(values(0, 1000))
        results = ctx.SimpleQueue()
        children = [ctx.Process(target=_sample_in_child, args=(buf, results)) for _ in range(2)]
        for c in children:
            c.start()
        for c in children:
            c.join(JOIN_S)
        drawn = [results.get(), results.get(), buf.sample(16)["v"].tolist()]
        assert len({tuple(d) for d in drawn}) == 3


def test_out_is_filled_and_returned_with_no_allocation():
    with ReplayBuffer(16, TRANSITION) as buf:
        buf.add_many(np.zeros(16, TRANSITION))
        out = np.empty(32, TRANSITION)
        buf.sample(32, out=out)
        tracemalloc.start()
        for _ in range(100):
            got = buf.sample(32, out=out)
        allocated = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got is out or got.base is out
        assert allocated < 2048  # small Python objects only, no arrays


def test_return_indices_gives_the_position_of_each_record():
    with ReplayBuffer(8, VALUE) as buf:
        buf.add_many(values(100, 120))  # position p holds value 100 + p
        records, positions = buf.sample(50, return_indices=True)
        assert positions.dtype == np.uint64
        assert (records["v"] == positions.astype(np.int64) + 100).all()


def test_sampling_an_empty_buffer_raises_empty_at_once():
    with ReplayBuffer(4, VALUE) as buf:
        started = time.monotonic()
        with pytest.raises(replay.Empty, match="empty"):
            buf.sample(1)
        assert time.monotonic() - started < 1.0


# ---- torn records -----------------------------------------------------------------

# Every field of a record holds the same value: a record copied while a writer was
# replacing it would mix two values.
WIDE = np.dtype([("a", "i8"), ("payload", "i8", (510,)), ("z", "i8")])


def wide(value, n=1):
    items = np.empty(n, WIDE)
    items["a"] = items["z"] = value
    items["payload"] = np.asarray(value).reshape(-1, 1) if n > 1 else value
    return items


def consistent(records):
    return (records["payload"] == records["a"][:, None]).all() and (records["a"] == records["z"]).all()


def _write_until(buf, first, stop, batch):
    value = first
    while not stop.is_set():
        if batch == 1:
            buf.add(wide(value)[0])
        else:
            buf.add_many(wide(np.arange(value, value + batch), batch))
        value += batch


def test_no_torn_record_under_concurrent_overwrite_with_threads():
    # The calls keep the GIL, so threads interleave between calls rather than inside
    # them; the spawned-process test below is the one where copies truly overlap.
    with ReplayBuffer(3, WIDE, seed=1) as buf:
        buf.add_many(wide(np.arange(3), 3))
        stop = threading.Event()
        writers = [threading.Thread(target=_write_until, args=(buf, 10**6 * (k + 1), stop, k + 1))
                   for k in range(3)]
        for w in writers:
            w.start()
        try:
            for _ in range(300):
                assert consistent(buf.sample(8))
        finally:
            stop.set()
            for w in writers:
                w.join(JOIN_S)
        assert buf.added > 3


def test_no_torn_record_under_concurrent_overwrite_with_spawned_processes():
    ctx = mp.get_context("spawn")
    with ReplayBuffer(3, WIDE, seed=2) as buf:
        buf.add_many(wide(np.arange(3), 3))
        stop = ctx.Event()
        writers = [ctx.Process(target=_write_until, args=(buf, 10**9 * (k + 1), stop, k + 1))
                   for k in range(2)]
        for w in writers:
            w.start()
        try:
            deadline = time.monotonic() + JOIN_S
            while buf.added < 1000:  # the writers are running (spawning takes a while)
                assert time.monotonic() < deadline, "the writers did not start"
                time.sleep(0.01)
            checked = torn = 0
            sampling_ends = time.monotonic() + 1.5
            while time.monotonic() < sampling_ends:
                torn += int(not consistent(buf.sample(16)))
                checked += 16
        finally:
            stop.set()
            for w in writers:
                w.join(JOIN_S)
        assert all(w.exitcode == 0 for w in writers)
        assert torn == 0
        assert checked > 1000


# ---- processes and pickling ---------------------------------------------------------


def test_a_buffer_pickled_in_the_same_process_is_the_same_buffer():
    with ReplayBuffer(4, VALUE) as buf:
        copy = pickle.loads(pickle.dumps(buf))
        copy.add((5,))
        assert buf.added == 1 and buf.sample(1)["v"][0] == 5


def _add_in_child(buf, start, n):
    buf.add_many(values(start, start + n))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_records_added_by_child_processes_are_sampled_by_the_parent(method):
    ctx = mp.get_context(method)
    with ReplayBuffer(100, VALUE) as buf:
        children = [ctx.Process(target=_add_in_child, args=(buf, 10 * k, 10)) for k in range(3)]
        for c in children:
            c.start()
        for c in children:
            c.join(JOIN_S)
            assert c.exitcode == 0
        assert buf.added == 30 == len(buf)
        assert set(buf.sample(2000, rng=0)["v"].tolist()) == set(range(30))


def test_context_manager_removes_the_shared_memory():
    prefix = f"rq-{os.getpid()}-"
    before = {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    with ReplayBuffer(4, VALUE) as buf:
        assert {n for n in os.listdir("/dev/shm") if n.startswith(prefix)} - before
    assert not {n for n in os.listdir("/dev/shm") if n.startswith(prefix)} - before
    with pytest.raises(replay.Closed):
        pickle.loads(pickle.dumps(buf))


def _make_buffer_and_exit(names):
    buf = replay.PrioritizedReplayBuffer(4, VALUE)
    names.put(buf._segment.name)


def test_a_buffer_made_in_a_fork_child_is_removed_when_the_child_exits():
    ctx = mp.get_context("fork")
    names = ctx.SimpleQueue()
    child = ctx.Process(target=_make_buffer_and_exit, args=(names,))
    child.start()
    child.join(JOIN_S)
    assert child.exitcode == 0
    assert not os.path.exists(os.path.join("/dev/shm", names.get()))


# ---- reuse limits -------------------------------------------------------------------


def test_max_times_sampled_retires_a_record_after_that_many_draws():
    with ReplayBuffer(10, VALUE, max_times_sampled=3, seed=0) as buf:
        buf.add_many(values(0, 10))
        drawn = np.concatenate([buf.sample(5, timeout=0)["v"] for _ in range(6)])
        assert np.bincount(drawn, minlength=10).tolist() == [3] * 10
        with pytest.raises(replay.Empty, match="retire after 3"):
            buf.sample(1, timeout=0)
        buf.add((10,))  # a fresh record can be drawn again, three times
        assert buf.sample(3, timeout=0)["v"].tolist() == [10, 10, 10]


def test_max_times_sampled_sample_waits_for_the_timeout_then_raises_empty():
    with ReplayBuffer(4, VALUE, max_times_sampled=1) as buf:
        buf.add((1,))
        buf.sample(1)
        started = time.monotonic()
        with pytest.raises(replay.Empty):
            buf.sample(1, timeout=0.2)
        assert 0.2 <= time.monotonic() - started < 2.0


def test_limiter_sample_waits_then_times_out():
    with ReplayBuffer(100, VALUE, samples_per_insert=2.0, error_buffer=4.0, min_size_to_sample=2) as buf:
        buf.add((0,))
        with pytest.raises(replay.Empty, match="min_size_to_sample"):
            buf.sample(1, timeout=0.1)  # fewer than min_size_to_sample added
        buf.add_many(values(1, 4))  # added 4: allowed = 2 * (4 - 2) + 4 = 8 samples
        buf.sample(8, timeout=0)
        started = time.monotonic()
        with pytest.raises(replay.Empty, match="rate limiter"):
            buf.sample(1, timeout=0.2)
        assert 0.2 <= time.monotonic() - started < 2.0
        assert buf.sampled == 8


def test_limiter_sample_proceeds_after_adds_from_another_thread():
    with ReplayBuffer(100, VALUE, samples_per_insert=1.0) as buf:  # error_buffer 2
        buf.add_many(values(0, 3))
        buf.sample(4, timeout=0)  # allowed = 1 * (3 - 1) + 2 = 4
        adder = threading.Timer(0.1, lambda: buf.add_many(values(3, 13)))
        adder.start()
        started = time.monotonic()
        assert len(buf.sample(10, timeout=JOIN_S)) == 10  # waits for the adds
        assert 0.05 <= time.monotonic() - started < JOIN_S
        adder.join()
        assert buf.sampled == 14


def test_limiter_lets_concurrent_samplers_take_no_more_than_allowed():
    with ReplayBuffer(1000, VALUE, samples_per_insert=1.0, error_buffer=2.0) as buf:
        buf.add_many(values(0, 101))  # allowed = 100 + 2
        taken = []

        def take():
            while True:
                try:
                    taken.append(len(buf.sample(1, timeout=0)))
                except replay.Empty:
                    return
        threads = [threading.Thread(target=take) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_S)
        assert sum(taken) == buf.sampled == 102


# ---- save and load ------------------------------------------------------------------


def test_save_load_round_trip(tmp_path):
    path = tmp_path / "buffer.rb"
    with ReplayBuffer(8, TRANSITION, max_times_sampled=5) as buf:
        items = np.zeros(13, TRANSITION)
        items["action"] = np.arange(13)
        items["obs"] = np.arange(13)[:, None]
        buf.add_many(items)
        buf.sample(20, rng=0)
        buf.save(path)
        assert os.listdir(tmp_path) == ["buffer.rb"]  # no temporary file left
        with ReplayBuffer(8, TRANSITION, max_times_sampled=5) as other:
            other.add((np.zeros(4), 99, 0, False))
            other.load(path)
            assert (other.added, len(other), other.sampled) == (13, 8, 20)
            # Draw counts were saved too: 8 records x 5 draws, 20 of them used before.
            records, positions = other.sample(20, rng=1, timeout=0, return_indices=True)
            with pytest.raises(replay.Empty):
                other.sample(1, timeout=0)
            assert set(records["action"].tolist()) <= set(range(5, 13))
            assert (records["action"] == positions.astype(np.int64)).all()
            assert (records["obs"] == records["action"][:, None]).all()
            assert other.add(items[0]) == 13  # positions go on from the saved ones


def _saved(tmp_path, capacity=4, dtype=VALUE, cls=ReplayBuffer, **kw):
    path = tmp_path / "saved.rb"
    with cls(capacity, dtype, **kw) as buf:
        buf.add_many(np.zeros(3, dtype))
        buf.save(path)
    return path


@pytest.mark.parametrize("case, match", [
    ("magic", "not a replay buffer file"),
    ("version", "format version"),
    ("flipped byte", "checksum"),
    ("truncated", "checksum"),
])
def test_loading_a_corrupt_file_raises_a_clear_error_and_changes_nothing(tmp_path, case, match):
    path = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    if case == "magic":
        data[0:8] = b"NOTMAGIC"
    elif case == "version":
        data[8] = 99
    elif case == "flipped byte":
        data[len(data) // 2] ^= 0xFF
    else:
        data = data[:-10]
    path.write_bytes(bytes(data))
    with ReplayBuffer(4, VALUE) as buf:
        buf.add((42,))
        with pytest.raises(ValueError, match=match):
            buf.load(path)
        assert buf.added == 1 and buf.sample(3)["v"].tolist() == [42, 42, 42]


@pytest.mark.parametrize("other, match", [
    (dict(capacity=5), "capacity 5"),
    (dict(dtype=np.dtype([("w", "i8")])), "dtype"),
    (dict(cls=replay.PrioritizedReplayBuffer), "PrioritizedReplayBuffer"),
])
def test_loading_a_mismatched_file_raises_a_clear_error_naming_the_fix(tmp_path, other, match):
    path = _saved(tmp_path)
    kw = dict(capacity=4, dtype=VALUE, cls=ReplayBuffer) | other
    with kw["cls"](kw["capacity"], kw["dtype"]) as buf:
        with pytest.raises(ValueError, match=match) as error:
            buf.load(path)
        assert "load it into" in str(error.value)
        assert buf.added == 0


# ---- clear errors before anything is written -------------------------------------------


@pytest.mark.parametrize("call, error, match", [
    (lambda b: b.add((1, 2)), (TypeError, ValueError), "item"),
    (lambda b: b.add("text"), TypeError, "cannot store"),
    (lambda b: b.add(np.zeros(2, "i8")), TypeError, "this buffer holds"),
    (lambda b: b.add_many(np.zeros(3, "i4")), TypeError, "add_many's items"),
    (lambda b: b.add_many([1, 2]), TypeError, "numpy array"),
    (lambda b: b.sample(0), ValueError, "batch_size"),
    (lambda b: b.sample(-1), ValueError, "batch_size"),
    (lambda b: b.sample(1.5), ValueError, "batch_size"),
    (lambda b: b.sample(1, recent=0), ValueError, "recent"),
    (lambda b: b.sample(1, recent=5), ValueError, "recent"),
    (lambda b: b.sample(2, out=np.empty(1, VALUE)), ValueError, "fewer than batch_size"),
    (lambda b: b.sample(1, out=np.empty(1, "i4")), TypeError, "out"),
    (lambda b: b.sample(1, rng="x"), TypeError, "rng"),
    (lambda b: b.sample(1, timeout=-1), ValueError, "timeout"),
])
def test_bad_input_gives_a_clear_error_and_leaves_the_buffer_unchanged(call, error, match):
    with ReplayBuffer(4, VALUE) as buf:
        buf.add((7,))
        with pytest.raises(error, match=match):
            call(buf)
        assert (buf.added, buf.sampled, len(buf)) == (1, 0, 1)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(capacity=0), ValueError, "capacity"),
    (dict(capacity=2.0), TypeError, "capacity"),
    (dict(dtype=object), TypeError, "Python objects"),
    (dict(max_times_sampled=0), ValueError, "max_times_sampled"),
    (dict(samples_per_insert=0), ValueError, "samples_per_insert"),
    (dict(samples_per_insert=float("nan")), ValueError, "samples_per_insert"),
    (dict(error_buffer=1.0), ValueError, "needs samples_per_insert"),
    (dict(min_size_to_sample=0), ValueError, "min_size_to_sample"),
    (dict(seed=1.5), TypeError, "seed"),
])
def test_bad_settings_are_rejected_before_any_shared_memory_is_made(kwargs, error, match):
    args = dict(capacity=4, dtype=VALUE) | kwargs
    with pytest.raises(error, match=match):
        ReplayBuffer(args.pop("capacity"), args.pop("dtype"), **args)
