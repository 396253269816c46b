"""Throughput, idle cost and wake-up latency of replay.ArrayQueue against the usual baselines.

Usage (from the project root, in the project's environment):

    python scripts/bench_queue.py                 # full run: every cell, 3 repeats (~3-5 min)
    python scripts/bench_queue.py --quick         # smoke run: small counts, 1 repeat
    python scripts/bench_queue.py --repeats 5     # more repeats; the median is reported
    python scripts/bench_queue.py --only 'procs'  # cells whose name matches a regex
    python scripts/bench_queue.py --only '64B/1P1C/item'
    python scripts/bench_queue.py --only 'ArrayQueue(\+timeout)?:procs'  # what a timeout costs
    python scripts/bench_queue.py --profile       # where the time goes, per-item get/put

Cells are named SIZE/TOPOLOGY/MODE/IMPL, e.g. ``64B/4P2C/batch/ArrayQueue:procs``; the
extra measurements are named ``idle/...`` and ``latency/...``. ``--only`` is a regular
expression searched in those names (``--only '^(?!idle|latency)'`` skips the extras).

What is measured
  * Throughput: P producers put a fixed number of records, C consumers get them all.
    Records are 64 B or 1 KiB, a structured dtype ``[("seq", "i8"), ("pad", "u1", n)]``.
    Implementations:
      - ArrayQueue:threads   replay.ArrayQueue, producer and consumer threads
      - queue.Queue:threads  queue.Queue(maxsize=capacity), threads, the np.void record
      - ArrayQueue:procs     replay.ArrayQueue, processes ('fork')
      - ArrayQueue+timeout:procs  the same, with every put/get (put_many/get_many)
                             given timeout=30, to show what a timeout costs
      - ArrayQueue+borrow:procs   the same, consumers reading each batch where it lies
                             (borrow) instead of copying it out (batch mode only)
      - mp.Queue:procs       multiprocessing.Queue(maxsize=capacity), processes, the
                             record as a bytes object (pickled by the queue)
      - faster_fifo:procs    faster_fifo.Queue(100 MB buffer), processes, the record as
                             a bytes object (pickled by the queue, as in its README)
    Modes: ``item`` is put/get of one record; ``batch`` is put_many/get_many of 64
    (faster_fifo: put_many of a list of 64, get_many(max_messages_to_get=64)).
    queue.Queue and multiprocessing.Queue have no batch operation: batched ArrayQueue
    is compared with their per-item rate.
    The clock starts when every worker has passed a barrier (process start-up is not
    timed) and stops when the last consumer has received its last record. The last
    producer to finish closes the ArrayQueue (consumers drain it, then get Closed) or
    puts one sentinel per consumer into the other queues.
    Each cell moves a fixed number of records sized for ~0.5-2 s on a small machine,
    runs --repeats times, and reports the median rate. Also shown per cell: "cores",
    the CPU time of all workers over the wall time (a worker asleep in the kernel, or
    a machine busy with other work, shows as less than P + C cores), and for ArrayQueue
    the waits on a full and an empty queue from ArrayQueue.stats() in the last run.
  * Idle cost: a consumer blocked in get() for 2 s, as % of one core (getrusage in a
    child process; time.thread_time in a thread); multiprocessing.Queue for comparison.
  * Wake-up latency across processes: a consumer process blocked in get(); the
    producer writes time.perf_counter_ns() (CLOCK_MONOTONIC, shared by all processes)
    into the record and puts it; the consumer subtracts it from its own clock right
    after get() returns. 200 samples ~2 ms apart (after 10 warm-up samples); median and
    p99 in microseconds, also for multiprocessing.Queue and faster_fifo.

MB/s and GB/s are decimal (10^6, 10^9 bytes) of record payload.
This script is standalone: nothing in the project imports it.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import multiprocessing as mp
import os
import pstats
import queue as std_queue
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import exit_on_sigterm, load_average, machine  # noqa: E402  (scripts/machine.py)

from replay import ArrayQueue, Closed  # noqa: E402

try:
    import faster_fifo
except ImportError:  # optional baseline
    faster_fifo = None

CTX = mp.get_context("fork")
CAPACITY = 4096           # records, for every bounded queue
BATCH = 64
FF_BUFFER_BYTES = 100 * 1000 * 1000
JOIN_TIMEOUT_S = 180.0

SIZES = (64, 1024)
TOPOLOGIES = ((1, 1), (4, 2))
MODES = ("item", "batch")
IMPLS = ("ArrayQueue:threads", "queue.Queue:threads", "ArrayQueue:procs", "ArrayQueue+timeout:procs",
         "ArrayQueue+borrow:procs", "mp.Queue:procs", "faster_fifo:procs")
NO_BATCH = {"queue.Queue:threads", "mp.Queue:procs"}
ONLY_BATCH = {"ArrayQueue+borrow:procs"}

# Records moved per cell (all producers together), chosen from rates measured on a 2-core
# machine so that a cell takes roughly 0.5-2 s there. Keyed by (impl, mode, record size).
COUNTS = {
    ("ArrayQueue:threads", "item", 64): 800_000,
    ("ArrayQueue:threads", "item", 1024): 800_000,
    ("ArrayQueue:threads", "batch", 64): 15_000_000,
    ("ArrayQueue:threads", "batch", 1024): 8_000_000,
    ("queue.Queue:threads", "item", 64): 800_000,
    ("queue.Queue:threads", "item", 1024): 800_000,
    ("ArrayQueue:procs", "item", 64): 800_000,
    ("ArrayQueue:procs", "item", 1024): 800_000,
    ("ArrayQueue:procs", "batch", 64): 25_000_000,
    ("ArrayQueue:procs", "batch", 1024): 10_000_000,
    ("ArrayQueue+timeout:procs", "item", 64): 800_000,
    ("ArrayQueue+timeout:procs", "item", 1024): 800_000,
    ("ArrayQueue+timeout:procs", "batch", 64): 25_000_000,
    ("ArrayQueue+timeout:procs", "batch", 1024): 10_000_000,
    ("ArrayQueue+borrow:procs", "batch", 64): 25_000_000,
    ("ArrayQueue+borrow:procs", "batch", 1024): 10_000_000,
    ("mp.Queue:procs", "item", 64): 150_000,
    ("mp.Queue:procs", "item", 1024): 150_000,
    ("faster_fifo:procs", "item", 64): 200_000,
    ("faster_fifo:procs", "item", 1024): 200_000,
    ("faster_fifo:procs", "batch", 64): 400_000,
    ("faster_fifo:procs", "batch", 1024): 300_000,
}
QUICK_DIVISOR = 20


def dtype_of(size: int) -> np.dtype:
    return np.dtype([("seq", "i8"), ("pad", "u1", size - 8)])


# ---- the queues under test -------------------------------------------------------------
#
# Each implementation provides: make(dtype) -> queue; a producer loop and a consumer loop
# per mode; finish(q, consumers), called once by the last producer to stop the consumers.


def put_each(q, n, item):
    """The per-item producer loop shared by the queues whose put takes no options."""
    put = q.put
    for _ in range(n):
        put(item)


class AQ:
    """replay.ArrayQueue. Consumers stop on Closed once the queue is closed and drained."""

    @staticmethod
    def make(dtype):
        return ArrayQueue(CAPACITY, dtype)

    @staticmethod
    def payload(dtype, mode):
        return np.zeros(1, dtype)[0] if mode == "item" else np.zeros(BATCH, dtype)

    produce_item = staticmethod(put_each)

    @staticmethod
    def produce_batch(q, n_batches, block):
        put_many = q.put_many
        for _ in range(n_batches):
            put_many(block)

    @staticmethod
    def consume_item(q, dtype):
        get = q.get
        n = 0
        try:
            while True:
                get()
                n += 1
        except Closed:
            return n

    @staticmethod
    def consume_batch(q, dtype):
        get_many = q.get_many
        out = np.empty(BATCH, dtype)
        n = 0
        try:
            while True:
                n += len(get_many(BATCH, out=out))
        except Closed:
            return n

    @staticmethod
    def finish(q, consumers):
        q.close()


class AQTimeout(AQ):
    """replay.ArrayQueue with a timeout on every call, far longer than any wait here."""

    TIMEOUT_S = 30.0

    @staticmethod
    def produce_item(q, n, item):
        put, timeout = q.put, AQTimeout.TIMEOUT_S
        for _ in range(n):
            put(item, timeout=timeout)

    @staticmethod
    def produce_batch(q, n_batches, block):
        put_many, timeout = q.put_many, AQTimeout.TIMEOUT_S
        for _ in range(n_batches):
            put_many(block, timeout=timeout)

    @staticmethod
    def consume_item(q, dtype):
        get, timeout = q.get, AQTimeout.TIMEOUT_S
        n = 0
        try:
            while True:
                get(timeout=timeout)
                n += 1
        except Closed:
            return n

    @staticmethod
    def consume_batch(q, dtype):
        get_many, timeout = q.get_many, AQTimeout.TIMEOUT_S
        out = np.empty(BATCH, dtype)
        n = 0
        try:
            while True:
                n += len(get_many(BATCH, timeout=timeout, out=out))
        except Closed:
            return n


class AQBorrow(AQ):
    """replay.ArrayQueue, consumers reading each batch in the queue's slots (borrow)
    instead of copying it out; each reads every record's seq, as a consumer would."""

    @staticmethod
    def consume_batch(q, dtype):
        borrow = q.borrow
        n = 0
        try:
            while True:
                with borrow(BATCH) as records:
                    n += len(records["seq"])
        except Closed:
            return n


class SentinelQueue:
    """Queues stopped by one sentinel per consumer (put after every record)."""

    SENTINEL = None

    produce_item = staticmethod(put_each)

    @classmethod
    def consume_item(cls, q, dtype):
        get = q.get
        n = 0
        while True:
            if get() is None:
                return n
            n += 1

    @classmethod
    def finish(cls, q, consumers):
        for _ in range(consumers):
            q.put(cls.SENTINEL)


class StdQueue(SentinelQueue):
    @staticmethod
    def make(dtype):
        return std_queue.Queue(maxsize=CAPACITY)

    @staticmethod
    def payload(dtype, mode):
        return np.zeros(1, dtype)[0]


class MPQueue(SentinelQueue):
    # A multiprocessing.Queue put() hands the object to a feeder thread of the putting
    # process, so records of different producers are not ordered with a sentinel put by
    # one of them. Each producer flushes its feeder (close + join_thread) before it counts
    # itself done, and the main process puts the sentinels once all are done.
    FLUSH_AND_LET_MAIN_FINISH = True

    @staticmethod
    def make(dtype):
        return CTX.Queue(maxsize=CAPACITY)

    @staticmethod
    def payload(dtype, mode):
        return np.zeros(1, dtype).tobytes()


class FFQueue:
    """faster_fifo.Queue of bytes messages (pickled by the queue); b"" is the sentinel."""

    SENTINEL = b""

    @staticmethod
    def make(dtype):
        return faster_fifo.Queue(max_size_bytes=FF_BUFFER_BYTES)

    @staticmethod
    def payload(dtype, mode):
        record = np.zeros(1, dtype).tobytes()
        return record if mode == "item" else [record] * BATCH

    @staticmethod
    def produce_item(q, n, item):
        put = q.put
        for _ in range(n):
            put(item, timeout=1e9)

    @staticmethod
    def produce_batch(q, n_batches, block):
        put_many = q.put_many
        for _ in range(n_batches):
            put_many(block, timeout=1e9)

    @staticmethod
    def consume_item(q, dtype):
        get = q.get
        n = 0
        while True:
            if not get(timeout=1e9):
                return n
            n += 1

    @staticmethod
    def consume_batch(q, dtype):
        get_many = q.get_many
        n = 0
        while True:
            messages = get_many(timeout=1e9, max_messages_to_get=BATCH)
            if messages[-1]:
                n += len(messages)
                continue
            # Sentinels come after every record, so they end the batch. Give back the
            # ones meant for the other consumers.
            k = sum(1 for m in messages if not m)
            n += len(messages) - k
            if k > 1:
                q.put_many([FFQueue.SENTINEL] * (k - 1), timeout=1e9)
            return n

    @staticmethod
    def finish(q, consumers):
        q.put_many([FFQueue.SENTINEL] * consumers, timeout=1e9)


IMPL_CLASS = {
    "ArrayQueue:threads": AQ,
    "queue.Queue:threads": StdQueue,
    "ArrayQueue:procs": AQ,
    "ArrayQueue+timeout:procs": AQTimeout,
    "ArrayQueue+borrow:procs": AQBorrow,
    "mp.Queue:procs": MPQueue,
    "faster_fifo:procs": FFQueue,
}


def available(impl: str) -> bool:
    return impl != "faster_fifo:procs" or faster_fifo is not None


# ---- running one cell ------------------------------------------------------------------


# Each worker fills 4 cells of a shared int64 array: [start ns, end ns, cpu ns, records].
# Consumers take rows 0..C-1, producers C..C+P-1.
START, END, CPU, COUNT = range(4)


def _cpu_clock():
    # A process worker is its process's main thread; its process time also counts the feeder
    # thread of a multiprocessing.Queue, which does the work of its puts.
    if threading.current_thread() is threading.main_thread():
        return time.process_time_ns
    return time.thread_time_ns


def _producer(cls, q, mode, dtype, n, barrier, done, producers, consumers, slots, row,
              all_done, profile_path):
    payload = cls.payload(dtype, mode)
    cpu = _cpu_clock()
    barrier.wait()
    slots[4 * row + START] = time.perf_counter_ns()
    c0 = cpu()
    profiler = _start_profile(profile_path)
    if mode == "item":
        cls.produce_item(q, n, payload)
    else:
        cls.produce_batch(q, n // BATCH, payload)
    _stop_profile(profiler, profile_path)
    main_finishes = getattr(cls, "FLUSH_AND_LET_MAIN_FINISH", False)
    if main_finishes:
        q.close()
        q.join_thread()
    slots[4 * row + END] = time.perf_counter_ns()
    slots[4 * row + CPU] = cpu() - c0
    slots[4 * row + COUNT] = n
    with done.get_lock():
        done.value += 1
        last = done.value == producers
    if last:
        if main_finishes:
            all_done.set()
        else:
            cls.finish(q, consumers)


def _consumer(cls, q, mode, dtype, barrier, slots, row, profile_path):
    cpu = _cpu_clock()
    barrier.wait()
    slots[4 * row + START] = time.perf_counter_ns()
    c0 = cpu()
    profiler = _start_profile(profile_path)
    if mode == "item":
        n = cls.consume_item(q, dtype)
    else:
        n = cls.consume_batch(q, dtype)
    slots[4 * row + END] = time.perf_counter_ns()
    slots[4 * row + CPU] = cpu() - c0
    slots[4 * row + COUNT] = n
    _stop_profile(profiler, profile_path)


def _start_profile(path):
    if not path:
        return None
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def _stop_profile(profiler, path):
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(path)


class _ThreadCounter:
    """The slice of multiprocessing.Value that _producer uses, for threads."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()

    def get_lock(self):
        return self._lock


class CellRun:
    """One run of a cell: seconds of transfer, records, cores kept busy, queue stats."""

    def __init__(self, seconds, records, cores, stats):
        self.seconds, self.records, self.cores, self.stats = seconds, records, cores, stats


def run_cell(impl, mode, size, producers, consumers, n_items, profile_paths=None) -> CellRun:
    """Run one cell once."""
    cls = IMPL_CLASS[impl]
    dtype = dtype_of(size)
    unit = BATCH * producers if mode == "batch" else producers
    per_producer = max(n_items // unit, 1) * (unit // producers)
    total = per_producer * producers
    q = cls.make(dtype)
    threads = impl.endswith(":threads")
    prof_p, prof_c = profile_paths or (None, None)
    n_slots = 4 * (producers + consumers)
    if threads:
        barrier = threading.Barrier(producers + consumers + 1, timeout=JOIN_TIMEOUT_S)
        done = _ThreadCounter()
        all_done = threading.Event()
        slots = [0] * n_slots
        make = lambda target, args: threading.Thread(target=target, args=args, daemon=True)  # noqa: E731
    else:
        barrier = CTX.Barrier(producers + consumers + 1, timeout=JOIN_TIMEOUT_S)
        done = CTX.Value("q", 0)
        all_done = CTX.Event()
        slots = CTX.RawArray("q", n_slots)
        make = lambda target, args: CTX.Process(target=target, args=args, daemon=True)  # noqa: E731
    workers = [make(_consumer, (cls, q, mode, dtype, barrier, slots, i,
                                prof_c if i == 0 else None))
               for i in range(consumers)]
    workers += [make(_producer, (cls, q, mode, dtype, per_producer, barrier, done,
                                 producers, consumers, slots, consumers + i, all_done,
                                 prof_p if i == 0 else None))
                for i in range(producers)]
    gc.collect()
    for w in workers:
        w.start()
    stats = None
    try:
        barrier.wait()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        if getattr(cls, "FLUSH_AND_LET_MAIN_FINISH", False):
            if not all_done.wait(JOIN_TIMEOUT_S):
                raise RuntimeError("producers did not finish")
            cls.finish(q, consumers)
        for w in workers:
            w.join(max(deadline - time.monotonic(), 0.1))
        stuck = [w for w in workers if w.is_alive()]
        failed = [w for w in workers if not threads and w.exitcode not in (0, None)]
        if stuck or failed:
            raise RuntimeError(f"{len(stuck)} workers stuck, {len(failed)} failed")
        if isinstance(q, ArrayQueue):
            stats = q.stats()
    finally:
        if not threads:
            for w in workers:
                if w.is_alive():
                    w.kill()
        _dispose(impl, q)
    rows = [slots[4 * r:4 * r + 4] for r in range(producers + consumers)]
    received = sum(row[COUNT] for row in rows[:consumers])
    if received != total:
        raise RuntimeError(f"sent {total} records, received {received}")
    # Each worker stamps the clock as it leaves the barrier; the main process may be
    # scheduled late on a busy machine, so its own stamp would start the clock late.
    start = min(row[START] for row in rows)
    end = max(row[END] for row in rows[:consumers])
    seconds = (end - start) / 1e9
    cores = sum(row[CPU] for row in rows) / 1e9 / seconds
    return CellRun(seconds, total, cores, stats)


def _dispose(impl, q):
    if isinstance(q, ArrayQueue):
        q.close()
    elif impl == "mp.Queue:procs":
        q.close()
        q.join_thread()


# ---- idle cost and latency -------------------------------------------------------------


def _rusage_cpu():
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _idle_child_rusage(q, result, ready):
    c0 = _rusage_cpu()
    t0 = time.perf_counter()
    ready.set()
    q.get()
    t1 = time.perf_counter()
    result[0] = (_rusage_cpu() - c0) / (t1 - t0) * 100.0


def measure_idle(kind: str, seconds: float) -> float:
    """% of one core used by a consumer blocked in get() for `seconds`."""
    dtype = dtype_of(64)
    if kind == "mp.Queue:procs":
        q = CTX.Queue()
        item = 0
    else:
        q = ArrayQueue(16, dtype)
        item = np.zeros(1, dtype)[0]
    if kind == "ArrayQueue:threads":
        result = [0.0]

        def child():
            c0, t0 = time.thread_time(), time.perf_counter()
            ready.set()
            q.get()
            result[0] = (time.thread_time() - c0) / (time.perf_counter() - t0) * 100.0

        ready = threading.Event()
        worker = threading.Thread(target=child, daemon=True)
    else:
        result = CTX.RawArray("d", 1)
        ready = CTX.Event()
        worker = CTX.Process(target=_idle_child_rusage, args=(q, result, ready), daemon=True)
    worker.start()
    ready.wait()
    time.sleep(seconds)
    q.put(item)
    worker.join(JOIN_TIMEOUT_S)
    q.close()
    if kind == "mp.Queue:procs":
        q.join_thread()
    return result[0]


def _latency_child(kind, q, n, out, barrier):
    barrier.wait()
    now = time.perf_counter_ns
    if kind == "ArrayQueue:procs":
        get = q.get
        for i in range(n):
            record = get()
            t = now()
            out[i] = t - int(record["seq"])
    elif kind == "faster_fifo:procs":
        for i in range(n):
            stamp = q.get(timeout=1e9)
            t = now()
            out[i] = t - stamp
    else:
        for i in range(n):
            stamp = q.get()
            t = now()
            out[i] = t - stamp


def measure_latency(kind: str, samples: int, warmup: int = 10, gap_s: float = 0.002):
    """Wake-up latency put -> get across processes, in microseconds: (median, p99)."""
    n = samples + warmup
    dtype = dtype_of(64)
    if kind == "ArrayQueue:procs":
        q = ArrayQueue(CAPACITY, dtype)
    elif kind == "faster_fifo:procs":
        q = faster_fifo.Queue(max_size_bytes=FF_BUFFER_BYTES)
    else:
        q = CTX.Queue()
    out = CTX.RawArray("q", n)
    barrier = CTX.Barrier(2, timeout=JOIN_TIMEOUT_S)
    child = CTX.Process(target=_latency_child, args=(kind, q, n, out, barrier), daemon=True)
    child.start()
    barrier.wait()
    now = time.perf_counter_ns
    record = np.zeros(1, dtype)
    seq = record["seq"]
    item = record[0]
    for _ in range(n):
        time.sleep(gap_s)
        if kind == "ArrayQueue:procs":
            seq[0] = now()
            q.put(item)
        else:
            q.put(now())
    child.join(JOIN_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        raise RuntimeError("latency consumer stuck")
    if kind != "faster_fifo:procs":
        q.close()
    if kind == "mp.Queue:procs":
        q.join_thread()
    us = np.sort(np.frombuffer(out, dtype=np.int64)[warmup:] / 1e3)
    return float(np.median(us)), float(np.percentile(us, 99))


# ---- profile ---------------------------------------------------------------------------


def _print_profile(path: str, title: str, top: int = 14) -> None:
    stream = io.StringIO()
    stats = pstats.Stats(path, stream=stream)
    stats.sort_stats("tottime").print_stats(top)
    text = stream.getvalue()
    body = text[text.find("   ncalls"):] if "   ncalls" in text else text
    print(f"\n{title} (cProfile, sorted by own time; cProfile inflates Python-level calls)")
    print(body.rstrip())


def _per_call_ns(stmt, setup_globals, number=200_000, repeat=5):
    import timeit
    timer = timeit.Timer(stmt, globals=setup_globals)
    return min(timer.repeat(repeat=repeat, number=number)) / number * 1e9


def profile(n_items: int) -> None:
    print("\n== profile: 64B/1P1C/item/ArrayQueue:procs ==")
    with tempfile.TemporaryDirectory() as tmp:
        paths = (os.path.join(tmp, "producer.prof"), os.path.join(tmp, "consumer.prof"))
        run = run_cell("ArrayQueue:procs", "item", 64, 1, 1, n_items, paths)
        print(f"{run.records} records in {run.seconds:.2f} s under cProfile: "
              f"{run.records / run.seconds / 1e6:.2f} M/s")
        _print_profile(paths[1], "consumer, get()")
        _print_profile(paths[0], "producer, put()")

    # The same calls, one thread, no contention, no profiler: the cost of each piece.
    try:
        from replay._rq import ffi, lib
    except ImportError:
        return
    dtype = dtype_of(64)
    q = ArrayQueue(CAPACITY, dtype)
    arr = np.empty(1, dtype)
    item = np.zeros(1, dtype)[0]
    dtype_k = dtype_of(1024)
    q_k = ArrayQueue(CAPACITY, dtype_k)
    std = std_queue.Queue(maxsize=CAPACITY)
    g = {"q": q, "np": np, "dtype": dtype, "arr": arr, "item": item, "ffi": ffi, "lib": lib,
         "qq": q._q, "ibuf": ffi.from_buffer(item), "obuf": ffi.from_buffer(arr),
         "q_k": q_k, "item_k": np.zeros(1, dtype_k)[0], "std": std}
    rows = [
        ("q.put(item); q.get()  (whole round trip)", "q.put(item); q.get()"),
        ("the same with timeout=30 on both", "q.put(item, timeout=30.0); q.get(timeout=30.0)"),
        ("C only: rqpy_push + rqpy_pop", "lib.rqpy_push(qq, ibuf, 1, 0); lib.rqpy_pop(qq, obuf, 1, 0)"),
        ("get: np.empty(1, dtype)", "np.empty(1, dtype)"),
        ("get: ffi.from_buffer(out)", "ffi.from_buffer(arr)"),
        ("get: out[0]", "arr[0]"),
        ("put: item.dtype == queue dtype", "item.dtype == dtype"),
        ("put: type(item) is np.void", "type(item) is np.void"),
        ("put: ffi.from_buffer(item)", "ffi.from_buffer(item)"),
        ("for comparison: the same with 1 KiB records", "q_k.put(item_k); q_k.get()"),
        ("for comparison: queue.Queue put + get", "std.put(item); std.get()"),
    ]
    print("\nPer-call cost in one thread, no profiler (min of 5 x 200k calls, ns):")
    cost = {}
    for label, stmt in rows:
        cost[label] = _per_call_ns(stmt, g)
        print(f"  {label:45s} {cost[label]:8.0f}")
    whole, c_only = cost[rows[0][0]], cost[rows[2][0]]
    print(f"  -> the C calls are {c_only / whole:.0%} of a put+get round trip; the Python layer "
          f"(argument checks, numpy allocation, buffer export, call overhead) is the rest.")
    print(f"  -> a timeout makes a round trip {cost[rows[1][0]] / whole:.2f}x as long as none.")
    q.close()
    q_k.close()


# ---- machine and report ----------------------------------------------------------------


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    return f"{x / 1e3:.0f} k"


def cells(pattern):
    for size in SIZES:
        for producers, consumers in TOPOLOGIES:
            for mode in MODES:
                for impl in IMPLS:
                    if (mode == "batch" and impl in NO_BATCH) or (mode == "item" and impl in ONLY_BATCH):
                        continue
                    name = f"{size if size < 1024 else size // 1024}{'B' if size < 1024 else 'KiB'}" \
                           f"/{producers}P{consumers}C/{mode}/{impl}"
                    if pattern and not re.search(pattern, name):
                        continue
                    yield name, impl, mode, size, producers, consumers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, 1 repeat (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per cell (default 3; --quick: 1)")
    parser.add_argument("--only", metavar="PATTERN", help="regex on cell names, e.g. '64B/.*/procs'")
    parser.add_argument("--profile", action="store_true",
                        help="profile the per-item 64B 1P1C process cell and exit")
    args = parser.parse_args()
    exit_on_sigterm()
    repeats = args.repeats or (1 if args.quick else 3)
    divisor = QUICK_DIVISOR if args.quick else 1

    print("replay.ArrayQueue benchmark")
    print(machine("numpy", "cffi", "faster-fifo"))
    print(f"command: {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"capacity {CAPACITY} records, batch {BATCH}, repeats {repeats}, start method fork\n")

    if args.profile:
        profile(COUNTS[("ArrayQueue:procs", "item", 64)] // divisor)
        return 0

    results = {}  # name -> (median items/s, spread, size, median cores busy)
    for name, impl, mode, size, producers, consumers in cells(args.only):
        if not available(impl):
            print(f"{name:46s} skipped: faster_fifo is not importable", flush=True)
            continue
        n = COUNTS[(impl, mode, size)] // divisor
        runs = []
        try:
            for _ in range(repeats):
                runs.append(run_cell(impl, mode, size, producers, consumers, n))
        except Exception as error:  # report and go on with the other cells
            print(f"{name:46s} ERROR: {error}", flush=True)
            continue
        rates = [r.records / r.seconds for r in runs]
        median = statistics.median(rates)
        spread = (max(rates) - min(rates)) / median
        cores = statistics.median(r.cores for r in runs)
        results[name] = (median, spread, size, cores)
        waits = ""
        if runs[-1].stats:
            st = runs[-1].stats
            waits = f", last run waits full/empty {st['full_waits']}/{st['empty_waits']}"
        print(f"{name:46s} {fmt_rate(median):>9s} items/s {median * size / 1e6:7.0f} MB/s  "
              f"({runs[0].records} records, runs {', '.join(fmt_rate(r) for r in rates)}, "
              f"cores busy {', '.join(f'{r.cores:.1f}' for r in runs)}{waits})", flush=True)

    report(results)

    extras_failed = False
    idle = [("ArrayQueue:procs", "process, getrusage"), ("ArrayQueue:threads", "thread, thread_time"),
            ("mp.Queue:procs", "process, getrusage")]
    idle_s = 0.5 if args.quick else 2.0
    lines = []
    for kind, how in idle:
        if args.only and not re.search(args.only, f"idle/{kind}"):
            continue
        try:
            lines.append(f"  {kind:22s} {measure_idle(kind, idle_s):6.2f} % of a core ({how})")
        except Exception as error:
            lines.append(f"  {kind:22s} ERROR: {error}")
            extras_failed = True
    if lines:
        print(f"\nIdle consumer blocked in get() for {idle_s:g} s:")
        print("\n".join(lines))

    samples = 50 if args.quick else 200
    lines = []
    for kind in ("ArrayQueue:procs", "mp.Queue:procs", "faster_fifo:procs"):
        if not available(kind) or (args.only and not re.search(args.only, f"latency/{kind}")):
            continue
        try:
            med, p99 = measure_latency(kind, samples)
            lines.append(f"  {kind:22s} median {med:8.1f} us   p99 {p99:8.1f} us")
        except Exception as error:
            lines.append(f"  {kind:22s} ERROR: {error}")
            extras_failed = True
    if lines:
        print(f"\nWake-up latency put -> get across processes ({samples} samples, ~2 ms apart):")
        print("\n".join(lines))
    print(f"\nload average {load_average()} at the end")
    return 1 if extras_failed else 0


def report(results) -> None:
    if not results:
        return

    def get(size, topo, mode, impl):
        r = results.get(f"{size}/{topo}/{mode}/{impl}")
        return r[0] if r else None

    print("\nMedian of repeats; spread = (max - min) / median of the runs; cores = CPU time of the"
          "\nworkers over wall time. Ratios: ArrayQueue over the baseline in the same size, topology"
          "\nand mode (batched ArrayQueue over per-item queue.Queue / mp.Queue, which have no batch op).\n")
    header = (f"{'size':5s} {'topo':5s} {'mode':5s} {'implementation':24s} {'items/s':>9s} "
              f"{'MB/s':>7s} {'spread':>6s} {'cores':>5s}  {'vs queue.Queue':>14s} {'vs mp.Queue':>11s} "
              f"{'vs faster_fifo':>14s}")
    print(header)
    print("-" * len(header))
    for name, (rate, spread, size, cores) in results.items():
        s, topo, mode, impl = name.split("/")
        ratios = ["", "", ""]
        if impl.startswith("ArrayQueue"):
            if impl.endswith("threads"):
                base = get(s, topo, "item", "queue.Queue:threads")
                ratios[0] = f"{rate / base:.1f}x" if base else ""
            else:
                base = get(s, topo, "item", "mp.Queue:procs")
                ratios[1] = f"{rate / base:.1f}x" if base else ""
                base = get(s, topo, mode, "faster_fifo:procs")
                ratios[2] = f"{rate / base:.1f}x" if base else ""
        print(f"{s:5s} {topo:5s} {mode:5s} {impl:24s} {fmt_rate(rate):>9s} {rate * size / 1e6:7.0f} "
              f"{spread * 100:5.0f}% {cores:5.1f}  {ratios[0]:>14s} {ratios[1]:>11s} {ratios[2]:>14s}")

    _against_plain(results, "+timeout", "The cost of a timeout (timeout=30 on every call, over the "
                   "same cell without one):", "(cell without timeout not run)")
    _against_plain(results, "+borrow", "Reading batches in place (borrow) over copying them out "
                   "(get_many), same cell:", "(cell with get_many not run)")

    print("\nBars:")
    for topo in ("1P1C", "4P2C"):
        aq = get("64B", topo, "item", "ArrayQueue:procs")
        _bar(f"procs per item 64B {topo}: >= 10x mp.Queue", aq, get("64B", topo, "item", "mp.Queue:procs"), 10)
        _bar(f"procs per item 64B {topo}: >= 5x faster_fifo", aq, get("64B", topo, "item", "faster_fifo:procs"), 5)
    for topo in ("1P1C", "4P2C"):
        aq = get("64B", topo, "batch", "ArrayQueue:procs")
        _bar(f"procs batched 64B {topo}: >= 5 M items/s", aq, 1e6, 5, unit="M items/s")
        _bar(f"procs batched 64B {topo}: >= 10x faster_fifo batched", aq,
             get("64B", topo, "batch", "faster_fifo:procs"), 10)
    for topo in ("1P1C", "4P2C"):
        for impl in ("ArrayQueue:procs", "ArrayQueue:threads"):
            aq = get("1KiB", topo, "batch", impl)
            _bar(f"{impl.split(':')[1]} batched 1KiB {topo}: >= 1 GB/s", aq and aq * 1024, 1e9, 1,
                 unit="GB/s")
    for size in ("64B", "1KiB"):
        for topo in ("1P1C", "4P2C"):
            _bar(f"threads per item {size} {topo}: >= 3x queue.Queue",
                 get(size, topo, "item", "ArrayQueue:threads"),
                 get(size, topo, "item", "queue.Queue:threads"), 3)


def _against_plain(results, tag: str, title: str, missing: str) -> None:
    """Each cell of a variant (its implementation's name carries `tag`) over the same cell
    of plain ArrayQueue."""
    pairs = [(name, rate, results.get(name.replace(tag, ""))) for name, (rate, *_) in
             results.items() if tag in name]
    if pairs:
        print("\n" + title)
        for name, rate, plain in pairs:
            print(f"  {name:46s} {f'{rate / plain[0]:.2f}x' if plain else missing}")


def _bar(label, value, base, factor, unit=None):
    if value is None or base is None:
        print(f"  SKIP  {label}  (cell not run)")
        return
    got = value / base
    shown = f"{got:.2f} {unit}" if unit else f"{got:.1f}x"
    print(f"  {'PASS' if got >= factor else 'FAIL'}  {label}  (measured {shown})")


if __name__ == "__main__":
    sys.exit(main())
