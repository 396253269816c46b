"""No shared memory outlives the program that made it.

Each scenario is a separate Python program (`python -c ...`) that creates queues and
counters, shares them with spawn workers, and then exits normally, raises, is
interrupted with SIGINT while blocked in get, or is killed with SIGKILL. Its segments
are named rq-<its pid>-<hex>; afterwards none may be left, except after SIGKILL, where
`remove_stale_segments()` (which every new queue calls) must remove them.
"""
import base64
import errno
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import replay
from replay import ArrayQueue, Counters

from conftest import own_segments, running

SHM = Path("/dev/shm")
ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 60.0

PRELUDE = """
import base64, multiprocessing as mp, os, pickle, sys
import numpy as np
from replay import ArrayQueue, Counters

def say(*words):
    print(*words, flush=True)

def share(name, obj):  # lets the test attach to the same queue
    say(name, base64.b64encode(pickle.dumps(obj)).decode())

ctx = mp.get_context("spawn")
q = ArrayQueue(8, "i8")
records = ArrayQueue(4, [("obs", "f4", (3,)), ("done", "?")])
never_closed = ArrayQueue(2, "i8")
counters = Counters(["n"], ["x"])
say("segments", *(o._segment.name for o in (q, records, never_closed, counters)))

# Spawn workers attach to every object: put, add, get.
workers = [
    ctx.Process(target=ArrayQueue.put_many, args=(q, np.arange(5))),
    ctx.Process(target=ArrayQueue.put, args=(records, (np.ones(3), True))),
    ctx.Process(target=Counters.add, args=(counters, "n", 3)),
    ctx.Process(target=Counters.add, args=(counters, "x", 0.5)),
    ctx.Process(target=ArrayQueue.get_many, args=(never_closed, 1)),
]
for w in workers:
    w.start()
never_closed.put(1)
for w in workers:
    w.join()
say("workers", *(w.pid for w in workers))
assert [w.exitcode for w in workers] == [0] * len(workers), [w.exitcode for w in workers]
assert q.get_many(8).tolist() == [0, 1, 2, 3, 4]
assert records.get()["done"]
assert counters.snapshot() == {"n": 3, "x": 0.5}
assert never_closed.empty()
"""

NORMAL_EXIT = PRELUDE + """
q.close()
say("done")
"""

EXCEPTION = PRELUDE + """
raise RuntimeError("the scenario fails here")
"""

SIGINT_WHILE_BLOCKED = PRELUDE + """
# A daemon worker blocked in get on one queue, and the main thread blocked in get on another.
waiter = ctx.Process(target=ArrayQueue.get, args=(records,), daemon=True)
waiter.start()
say("waiter", waiter.pid)
share("main_queue", q)
share("worker_queue", records)
say("blocking")
q.get()
say("not reached")
"""

KILLED = PRELUDE + """
share("main_queue", q)
say("blocking")
q.get()
"""


def rq_entries():
    return {p.name for p in SHM.iterdir() if p.name.startswith("rq-")}


def pid_of(name):
    return int(name.split("-")[1])


class Scenario:
    """A scenario program running in a subprocess; its output is read line by line."""

    def __init__(self, code, tmp_path):
        self.before = rq_entries()
        self.stderr_path = tmp_path / "stderr.txt"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True,
                                         stdout=subprocess.PIPE, stderr=stderr)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.said = {}

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.split())
        self.lines.put(None)

    def expect(self, word, timeout=WAIT_S):
        """Read lines until one starts with `word`; return the rest of it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the scenario did not say {word!r}: {self.stderr()}") from None
            if line is None:
                raise AssertionError(f"the scenario ended before saying {word!r}: {self.stderr()}")
            if line and line[0] == word:
                self.said[word] = line[1:]
                return line[1:]

    def attach(self, word):
        return pickle.loads(base64.b64decode(self.expect(word)[0]))

    def wait(self):
        try:
            code = self.proc.wait(WAIT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.reader.join(WAIT_S)
            if not self.reader.is_alive():  # else a leftover child holds the pipe: closing
                self.proc.stdout.close()    # it would wait for the reader's read forever
        return code

    def stderr(self):
        return self.stderr_path.read_text()

    def segments(self):
        """Its segments' names, as it reported them."""
        names = self.said["segments"]
        assert len(names) == 4 and all(pid_of(n) == self.proc.pid for n in names), names
        return set(names)

    def left_behind(self):
        """rq-* entries that appeared while it ran, made by it or by its workers."""
        pids = {self.proc.pid} | {int(p) for p in self.said.get("workers", ())}
        return {n for n in rq_entries() - self.before if pid_of(n) in pids}


def test_a_normal_exit_leaves_no_segments(tmp_path):
    s = Scenario(NORMAL_EXIT, tmp_path)
    s.expect("segments")
    s.expect("workers")
    s.expect("done")
    assert s.wait() == 0, s.stderr()
    assert not s.left_behind()
    assert not s.segments() & rq_entries()


def test_an_exception_leaves_no_segments(tmp_path):
    s = Scenario(EXCEPTION, tmp_path)
    s.expect("segments")
    s.expect("workers")
    assert s.wait() == 1
    assert "the scenario fails here" in s.stderr()
    assert not s.left_behind()
    assert not s.segments() & rq_entries()


def test_sigint_while_a_consumer_is_blocked_in_get_leaves_no_segments(tmp_path):
    s = Scenario(SIGINT_WHILE_BLOCKED, tmp_path)
    s.expect("segments")
    s.expect("workers")
    waiter_pid = int(s.expect("waiter")[0])
    main_queue, worker_queue = s.attach("main_queue"), s.attach("worker_queue")
    s.expect("blocking")
    # Both consumers asleep in get: the program's main thread and its worker.
    deadline = time.monotonic() + WAIT_S
    while main_queue.stats()["empty_waits"] == 0 or worker_queue.stats()["empty_waits"] == 0:
        assert time.monotonic() < deadline, "the consumers did not block"
        time.sleep(0.005)
    assert s.segments() <= rq_entries()
    s.proc.send_signal(signal.SIGINT)
    code = s.wait()
    assert code in (-signal.SIGINT, 1), (code, s.stderr())
    assert "KeyboardInterrupt" in s.stderr()
    assert "not reached" not in s.said
    assert not s.left_behind()
    assert not s.segments() & rq_entries()
    # The daemon worker blocked in get was stopped with its program, not left behind.
    deadline = time.monotonic() + WAIT_S
    while running(waiter_pid):
        assert time.monotonic() < deadline, "the blocked worker outlived its program"
        time.sleep(0.01)


def _killed_scenario(tmp_path):
    s = Scenario(KILLED, tmp_path)
    s.expect("segments")
    s.expect("workers")
    s.expect("blocking")
    names = s.segments()
    assert names <= rq_entries()
    s.proc.kill()
    assert s.wait() == -signal.SIGKILL
    assert names <= rq_entries(), "a SIGKILLed creator cannot clean up: its segments stay"
    return s, names


def test_segments_of_a_sigkilled_creator_are_removed_by_remove_stale_segments(tmp_path):
    s, names = _killed_scenario(tmp_path)
    removed = replay.remove_stale_segments()
    assert names <= set(removed)
    assert not s.left_behind()


def test_segments_of_a_sigkilled_creator_are_removed_by_the_next_new_queue(tmp_path):
    s, names = _killed_scenario(tmp_path)
    q = ArrayQueue(1, "i8")
    assert not s.left_behind()
    q.close()


def test_remove_stale_segments_keeps_segments_of_living_creators():
    q = ArrayQueue(1, "i8")
    c = Counters(["n"])
    replay.remove_stale_segments()
    assert {q._segment.name, c._segment.name} <= rq_entries()
    q.close()
    c.close()
    assert not {q._segment.name, c._segment.name} & rq_entries()


def test_a_full_dev_shm_raises_shared_memory_full_naming_the_size_and_leaves_no_segment(monkeypatch):
    from replay import _shm

    def no_space(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_shm.os, "posix_fallocate", no_space)
    before = own_segments()
    with pytest.raises(replay.SharedMemoryFull, match=r"/dev/shm has no room for [\d,]+ bytes .* free\)") as raised:
        ArrayQueue(1024, "i8")
    assert isinstance(raised.value, OSError) and raised.value.errno == errno.ENOSPC
    assert own_segments() == before
