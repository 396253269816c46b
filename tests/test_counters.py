"""Counters: exact totals under contention from threads and processes, reading and
setting, clear errors, and sharing with a child process by pickling."""
import multiprocessing as mp
import pickle
import threading
import time

import pytest

from replay import Counters

JOIN_S = 60.0


INT_STEPS = (1, 2, -1, 5)   # per round: adds 7
FLOAT_STEPS = (0.5, 0.25)   # per round: adds 0.75, exactly representable, as are all sums here


def _hammer(counters, rounds):
    for _ in range(rounds):
        for step in INT_STEPS:
            counters.add("steps", step)
        counters.add("episodes")
        for step in FLOAT_STEPS:
            counters.add("return_sum", step)


def _hammer_with_threads(counters, threads, rounds, gate=None, parties=1):
    if gate is not None:  # start together, so that the processes really contend
        gate.add("ready")
        while gate["ready"] < parties:
            time.sleep(0.001)
    workers = [threading.Thread(target=_hammer, args=(counters, rounds)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_totals_are_exact_under_contention_from_threads_in_several_processes():
    processes, threads, rounds = 3, 4, 3000
    c = Counters(["steps", "episodes"], ["return_sum"])
    gate = Counters(["ready"])
    ctx = mp.get_context("spawn")
    children = [ctx.Process(target=_hammer_with_threads, args=(c, threads, rounds, gate, processes + 1))
                for _ in range(processes)]
    try:
        for p in children:
            p.start()
        _hammer_with_threads(c, threads, rounds, gate, processes + 1)  # this process as well
        for p in children:
            p.join(JOIN_S)
            assert p.exitcode == 0, f"child exit code {p.exitcode}"
    finally:
        for p in children:
            if p.is_alive():
                p.kill()
            p.join()
    adders = (processes + 1) * threads * rounds
    assert c.snapshot() == {"steps": 7 * adders, "episodes": adders, "return_sum": 0.75 * adders}
    c.close()
    gate.close()


def test_snapshot_getitem_and_set():
    c = Counters(["a", "b"], ["x", "y"])
    assert c.names == ("a", "b", "x", "y")
    assert c.snapshot() == {"a": 0, "b": 0, "x": 0.0, "y": 0.0}
    c.add("a", 3)
    c.add("b")
    c.add("x", 1.5)
    c.add("y", 2)  # an int added to a float counter is a float
    snap = c.snapshot()
    assert snap == {"a": 3, "b": 1, "x": 1.5, "y": 2.0}
    assert list(snap) == ["a", "b", "x", "y"]
    assert type(snap["a"]) is int and type(snap["x"]) is float
    assert (c["a"], c["b"], c["x"], c["y"]) == (3, 1, 1.5, 2.0)
    c.set("a", -(2**62))
    c.set("x", -0.125)
    c.add("a", -1)
    assert c["a"] == -(2**62) - 1 and c["x"] == -0.125
    c.set("y", 0)
    assert c["y"] == 0.0
    assert "a" in repr(c)
    c.close()


def test_unknown_name_raises_key_error_listing_the_names():
    c = Counters(["steps", "episodes"], ["return_sum"])
    for call in (lambda: c["nope"], lambda: c.add("nope"), lambda: c.set("nope", 1)):
        with pytest.raises(KeyError, match="nope.*steps, episodes, return_sum"):
            call()
    c.close()


@pytest.mark.parametrize("ints, floats", [(["a", "b", "a"], []), (["a"], ["a"]), ([], ["x", "x"])])
def test_repeated_names_are_rejected(ints, floats):
    with pytest.raises(ValueError, match="repeated"):
        Counters(ints, floats)


@pytest.mark.parametrize("names", [[""], [1], [None]])
def test_names_must_be_non_empty_strings(names):
    with pytest.raises(TypeError, match="non-empty strings"):
        Counters(names)


@pytest.mark.parametrize("value", [0.5, 1.0, True, "1", None])
def test_a_value_that_is_not_an_int_is_rejected_for_an_int_counter(value):
    c = Counters(["steps"], ["x"])
    c.add("steps", 4)
    with pytest.raises(TypeError, match="integers"):
        c.add("steps", value)
    with pytest.raises(TypeError, match="integers"):
        c.set("steps", value)
    assert c["steps"] == 4
    c.close()


def _add_in_child(counters):
    counters.add("steps", 5)
    counters.add("return_sum", 2.5)


def test_counters_pickled_to_a_child_process_are_the_same_counters():
    c = Counters(["steps"], ["return_sum"])
    c.add("steps", 1)
    child = mp.get_context("spawn").Process(target=_add_in_child, args=(c,))
    child.start()
    child.join(JOIN_S)
    assert child.exitcode == 0
    assert c.snapshot() == {"steps": 6, "return_sum": 2.5}
    c.close()


def test_counters_pickled_in_the_same_process_share_their_values():
    c = Counters(["steps"], ["return_sum"])
    twin = pickle.loads(pickle.dumps(c))
    twin.add("steps", 2)
    c.add("return_sum", 0.5)
    assert twin.snapshot() == c.snapshot() == {"steps": 2, "return_sum": 0.5}
    c.close()
    with pytest.raises(RuntimeError, match="gone"):
        pickle.loads(pickle.dumps(c))
