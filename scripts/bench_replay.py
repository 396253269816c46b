"""Replay buffers side by side: replay.ReplayBuffer and PrioritizedReplayBuffer against cpprb,
Stable-Baselines3 and TorchRL, on CartPole-sized transitions and Atari-sized frames.

Usage (from the project root, in the project's environment):

    python scripts/bench_replay.py                  # every cell, 5 repeats (~2-4 min)
    python scripts/bench_replay.py --quick          # smoke run: short cells, 1 repeat
    python scripts/bench_replay.py --only 'sample'  # cells whose name matches a regex
    python scripts/bench_replay.py --profile        # where the time goes in replay's calls

What is measured (one process unless said otherwise; rates are medians of the repeats)
  * Records are CartPole transitions: obs and next_obs 4 x f4, action i8, reward f4, done
    bool (45 bytes; replay stores them as one structured record). Buffers hold
    100 000 of them; sample and update cells start from a full buffer.
  * add/item       one transition per call: replay ``add(record)``, cpprb
                   ``add(obs=..., act=..., ...)``, SB3 ``add(obs, next_obs, action, reward,
                   done, infos)`` with n_envs=1, TorchRL ``add(tensordict_row)``.
  * add/batch64    64 transitions per call: replay ``add_many``, cpprb ``add`` of arrays,
                   SB3 with n_envs=64 (its batched form: one vector-env step), TorchRL
                   ``extend``.
  * sample/uniform ``sample(256)`` (SB3 and TorchRL return torch tensors, as their API
                   does); replay also with ``out=`` (no allocation).
  * sample/prio    prioritized ``sample(256, beta=0.4)`` then ``update_priorities`` of the
                   256 drawn indices with new priorities (alpha 0.6); counted as 256
                   transitions per pair. TorchRL is tried and skipped when its C++
                   segment tree does not load.
  * mp/4w1s        4 writer processes add batches of 64 for a fixed time (2 s) while 1
                   process ``sample(256)``s from the same buffer (fork); add rate (all
                   writers) and the sampler's rate while writing: replay.ReplayBuffer
                   against cpprb.MPReplayBuffer; also the cores each side used (CPU
                   time over wall time), which shows a side that waits.
  * atari/*        records of 4 x 84 x 84 u1 (28 224 bytes, a frame stack), 10 000 of them:
                   ``add_many`` of 64 into a buffer filled once before (the steady state),
                   the first lap through a fresh buffer (every page is touched for the
                   first time), and ``sample(32)``; in GB/s of record payload, with numpy
                   copying the same bytes (a slice copy, a gather of 32 rows) as a ceiling.
Each cell repeats an operation in chunks until --seconds have passed and reports items/s;
the whole cell is repeated --repeats times and the median and spread are printed, then
the ratios to each competitor and the bars. A competitor that is not installed is skipped
with the reason. GB/s is 10^9 bytes. This script is standalone: nothing imports it.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import re
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import exit_on_sigterm, load_average, machine  # noqa: E402  (scripts/machine.py)

try:
    from replay import PrioritizedReplayBuffer, ReplayBuffer
    REPLAY_MISSING = None
except ImportError as error:
    REPLAY_MISSING = f"replay has no replay buffer yet ({error})"

try:
    import cpprb
    CPPRB_MISSING = None
except ImportError:
    CPPRB_MISSING = "cpprb is not installed (pip install cpprb)"

try:
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
    torch.set_num_threads(1)
    SB3_MISSING = None
except ImportError:
    SB3_MISSING = "stable-baselines3 is not installed (pip install stable-baselines3)"

try:
    import logging

    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage
    from torchrl.data import PrioritizedReplayBuffer as TorchRLPrioritized
    from torchrl.data import ReplayBuffer as TorchRLReplayBuffer
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # no line per storage it creates
    TORCHRL_MISSING = None
except ImportError:
    TORCHRL_MISSING = "torchrl is not installed"

CTX = mp.get_context("fork")
CAPACITY = 100_000
ATARI_CAPACITY = 10_000
SAMPLE = 256
ATARI_SAMPLE = 32
BATCH = 64
WRITERS = 4
TRANSITION = np.dtype([("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"),
                       ("next_obs", "f4", (4,)), ("done", "?")])
FRAMES = np.dtype([("obs", "u1", (4, 84, 84))])
ENV_DICT = {"obs": {"shape": 4, "dtype": np.float32}, "act": {"dtype": np.int64},
            "rew": {"dtype": np.float32}, "next_obs": {"shape": 4, "dtype": np.float32},
            "done": {"dtype": np.bool_}}
ATARI_ENV_DICT = {"obs": {"shape": (4, 84, 84), "dtype": np.uint8}}


def transitions(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros(n, TRANSITION)
    out["obs"] = rng.standard_normal((n, 4))
    out["next_obs"] = rng.standard_normal((n, 4))
    out["action"] = rng.integers(2, size=n)
    out["reward"] = 1.0
    out["done"] = rng.random(n) < 0.05
    return out


DATA = transitions(CAPACITY)
COLUMNS = {k: np.ascontiguousarray(DATA[k]) for k in TRANSITION.names}
PRIORITIES = np.random.default_rng(1).random(SAMPLE) + 0.1


def rate(chunk, items_per_chunk: int, seconds: float) -> float:
    """Items per second of `chunk()` run repeatedly for at least `seconds`."""
    chunk()  # warm up
    done, start = 0, time.perf_counter()
    while True:
        chunk()
        done += items_per_chunk
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


# ---- the buffers, each behind the same few functions ---------------------------------------


def make(impl: str, prioritized: bool = False, capacity: int = CAPACITY, n_envs: int = 1, atari=False):
    """A buffer of `impl`, or a string saying why it cannot be measured."""
    if impl == "replay":
        if REPLAY_MISSING:
            return REPLAY_MISSING
        dtype = FRAMES if atari else TRANSITION
        return (PrioritizedReplayBuffer(capacity, dtype, alpha=0.6, seed=0) if prioritized
                else ReplayBuffer(capacity, dtype, seed=0))
    if impl == "cpprb":
        if CPPRB_MISSING:
            return CPPRB_MISSING
        env = ATARI_ENV_DICT if atari else ENV_DICT
        return (cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6) if prioritized
                else cpprb.ReplayBuffer(capacity, env))
    if impl == "sb3":
        if SB3_MISSING:
            return SB3_MISSING
        if prioritized:
            return "Stable-Baselines3 has no prioritized replay buffer"
        return SB3ReplayBuffer(capacity // n_envs, spaces.Box(-np.inf, np.inf, (4,), np.float32),
                               spaces.Discrete(2), device="cpu", n_envs=n_envs)
    if impl == "torchrl":
        if TORCHRL_MISSING:
            return TORCHRL_MISSING
        if not prioritized:
            return TorchRLReplayBuffer(storage=LazyTensorStorage(capacity))
        try:
            import torchrl._torchrl  # noqa: F401  (the C++ segment trees)
        except ImportError as error:
            why = str(error).split(": ", 1)[-1][:40]  # the missing symbol, not the file's path
            return (f"TorchRL's C++ extension, which its prioritized sampler needs, does not load "
                    f"against torch {torch.__version__} ({why}...)")
        return TorchRLPrioritized(alpha=0.6, beta=0.4, storage=LazyTensorStorage(capacity))
    raise ValueError(impl)


def close(buf) -> None:
    if hasattr(buf, "close") and not isinstance(buf, str):
        buf.close()


def torchrl_rows(n: int):
    return TensorDict({k: torch.from_numpy(v[:n].copy()) for k, v in COLUMNS.items()}, batch_size=[n])


def fill(impl: str, buf) -> None:
    """Add a little over CAPACITY transitions, in chunks of 1024 (a multiple of SB3's n_envs)."""
    rows = torchrl_rows(CAPACITY) if impl == "torchrl" else None
    for start in range(0, CAPACITY, 1024):
        start %= CAPACITY - 1024
        add_batch(impl, buf, start, 1024, None if rows is None else rows[start:start + 1024])


def add_batch(impl: str, buf, start: int, n: int, rows=None) -> None:
    if impl == "replay":
        buf.add_many(DATA[start:start + n])
    elif impl == "cpprb":
        c = COLUMNS
        buf.add(obs=c["obs"][start:start + n], act=c["action"][start:start + n],
                rew=c["reward"][start:start + n], next_obs=c["next_obs"][start:start + n],
                done=c["done"][start:start + n])
    elif impl == "torchrl":
        buf.extend(rows)
    elif impl == "sb3":
        c = COLUMNS
        for i in range(start, start + n, buf.n_envs):
            j = i + buf.n_envs
            buf.add(c["obs"][i:j], c["next_obs"][i:j], c["action"][i:j], c["reward"][i:j],
                    c["done"][i:j], [{}] * buf.n_envs)


# ---- single-process cells ---------------------------------------------------------------------


def cell_add_item(impl: str, seconds: float):
    buf = make(impl, n_envs=1)
    if isinstance(buf, str):
        return buf
    n, c = 1000, COLUMNS
    try:
        if impl == "replay":
            add = buf.add

            def chunk():
                for i in range(n):
                    add(DATA[i])
        elif impl == "cpprb":
            def chunk():
                for i in range(n):
                    buf.add(obs=c["obs"][i], act=c["action"][i], rew=c["reward"][i],
                            next_obs=c["next_obs"][i], done=c["done"][i])
        elif impl == "sb3":
            info = [{}]

            def chunk():
                for i in range(n):
                    j = i + 1
                    buf.add(c["obs"][i:j], c["next_obs"][i:j], c["action"][i:j], c["reward"][i:j],
                            c["done"][i:j], info)
        else:
            rows = torchrl_rows(n)

            def chunk():
                for i in range(n):
                    buf.add(rows[i])
        return rate(chunk, n, seconds)
    finally:
        close(buf)


def cell_add_batch(impl: str, seconds: float):
    buf = make(impl, n_envs=BATCH)
    if isinstance(buf, str):
        return buf
    try:
        calls = 100
        rows = torchrl_rows(BATCH) if impl == "torchrl" else None

        def chunk():
            for k in range(calls):
                add_batch(impl, buf, (k * BATCH) % CAPACITY, BATCH, rows)
        return rate(chunk, calls * BATCH, seconds)
    finally:
        close(buf)


def cell_sample_uniform(impl: str, seconds: float, out: bool = False):
    buf = make(impl, n_envs=1 if impl != "sb3" else BATCH)
    if isinstance(buf, str):
        return buf
    try:
        fill(impl, buf)
        calls = 20
        if out:
            dest = np.empty(SAMPLE, TRANSITION)

            def chunk():
                for _ in range(calls):
                    buf.sample(SAMPLE, out=dest)
        else:
            def chunk():
                for _ in range(calls):
                    buf.sample(SAMPLE)
        return rate(chunk, calls * SAMPLE, seconds)
    finally:
        close(buf)


def cell_sample_prioritized(impl: str, seconds: float):
    buf = make(impl, prioritized=True)
    if isinstance(buf, str):
        return buf
    try:
        fill(impl, buf)
        calls = 20
        if impl == "replay":
            def chunk():
                for _ in range(calls):
                    s = buf.sample(SAMPLE, beta=0.4)
                    buf.update_priorities(s.indices, PRIORITIES)
        elif impl == "cpprb":
            def chunk():
                for _ in range(calls):
                    s = buf.sample(SAMPLE, beta=0.4)
                    buf.update_priorities(s["indexes"], PRIORITIES)
        else:
            priorities = torch.from_numpy(PRIORITIES)

            def chunk():
                for _ in range(calls):
                    _, info = buf.sample(SAMPLE, return_info=True)
                    buf.update_priority(info["index"], priorities)
        return rate(chunk, calls * SAMPLE, seconds)
    finally:
        close(buf)


_FRAMES = []


def atari_records() -> np.ndarray:
    """ATARI_CAPACITY random frame stacks (made once: 282 MB)."""
    if not _FRAMES:
        payload = np.random.default_rng(0).bytes(ATARI_CAPACITY * FRAMES.itemsize)
        _FRAMES.append(np.frombuffer(bytearray(payload), FRAMES))
    return _FRAMES[0]


def cell_atari(impl: str, seconds: float, what: str):
    """Bytes per second of 4 x 84 x 84 u1 records: "add" (add_many of 64 into a buffer that
    has been filled once, the steady state), "fill" (one lap through a fresh buffer: the
    first write to each page of memory is a page fault) or "sample" (sample(32))."""
    records = atari_records()
    frames = records["obs"]  # the same bytes as [N, 4, 84, 84] u1, for cpprb and numpy
    n = ATARI_SAMPLE if what == "sample" else BATCH
    rng = np.random.default_rng(0)
    if impl == "numpy copy":  # the ceiling: the same bytes copied by numpy
        dest = np.empty_like(frames)
        if what == "add":
            dest[:] = frames  # touch every page first, as the "add" cell does
        k = [0]

        def chunk():
            if what == "sample":
                np.take(frames, rng.integers(ATARI_CAPACITY, size=n), axis=0, out=dest[:n])
            else:
                i = k[0] = (k[0] + n) % (ATARI_CAPACITY - n)
                np.copyto(dest[i:i + n], frames[i:i + n])
        if what == "fill":
            start = time.perf_counter()
            for i in range(0, ATARI_CAPACITY - n + 1, n):
                np.copyto(dest[i:i + n], frames[i:i + n])
            return (ATARI_CAPACITY // n) * n * FRAMES.itemsize / (time.perf_counter() - start)
        return rate(chunk, n * FRAMES.itemsize, seconds)
    buf = make(impl, capacity=ATARI_CAPACITY, atari=True)
    if isinstance(buf, str):
        return buf
    try:
        def add(i, n):
            if impl == "replay":
                buf.add_many(records[i:i + n])
            else:
                buf.add(obs=frames[i:i + n])
        start = time.perf_counter()
        for i in range(0, ATARI_CAPACITY - n + 1, n):
            add(i, n)
        if what == "fill":
            return (ATARI_CAPACITY // n) * n * FRAMES.itemsize / (time.perf_counter() - start)
        if what == "add":
            k = [0]

            def chunk():
                i = k[0] = (k[0] + n) % (ATARI_CAPACITY - n)
                add(i, n)
        else:
            def chunk():
                buf.sample(n)
        return rate(chunk, n * FRAMES.itemsize, seconds)
    finally:
        close(buf)


# ---- 4 writers + 1 sampler, processes ---------------------------------------------------------


def _writer(impl, buf, barrier, seconds, result, slot):
    barrier.wait()
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    k = slot * 7919
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            add_batch(impl, buf, k % (CAPACITY - BATCH), BATCH)
            k += BATCH
        done += 10 * BATCH
    elapsed = time.perf_counter() - start
    result[2 * slot], result[2 * slot + 1] = done / elapsed, (time.process_time() - cpu) / elapsed


def _sampler(buf, barrier, seconds, result, slot):
    barrier.wait()
    done, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        buf.sample(SAMPLE)
        done += SAMPLE
    elapsed = time.perf_counter() - start
    result[2 * slot], result[2 * slot + 1] = done / elapsed, (time.process_time() - cpu) / elapsed


def cell_mp(impl: str, seconds: float):
    """(add rate of all writers, sample rate of the sampler while they write, cores used by
    the writers, cores used by the sampler)."""
    if impl == "replay":
        buf = make("replay")
    elif CPPRB_MISSING:
        buf = CPPRB_MISSING
    else:
        buf = cpprb.MPReplayBuffer(CAPACITY, ENV_DICT, ctx=CTX)
    if isinstance(buf, str):
        return buf
    try:
        fill(impl, buf)
        result = CTX.RawArray("d", 2 * (WRITERS + 1))  # per process: rate, CPU time / wall time
        barrier = CTX.Barrier(WRITERS + 1, timeout=60)
        procs = [CTX.Process(target=_writer, args=(impl, buf, barrier, seconds, result, w), daemon=True)
                 for w in range(WRITERS)]
        procs.append(CTX.Process(target=_sampler, args=(buf, barrier, seconds, result, WRITERS), daemon=True))
        for p in procs:
            p.start()
        for p in procs:
            p.join(seconds + 60)
        if any(p.exitcode != 0 for p in procs):
            for p in procs:
                if p.is_alive():
                    p.kill()
            return f"a worker failed (exit codes {[p.exitcode for p in procs]})"
        return (sum(result[0:2 * WRITERS:2]), result[2 * WRITERS],
                sum(result[1:2 * WRITERS:2]), result[2 * WRITERS + 1])
    finally:
        close(buf)


# ---- where the time goes ---------------------------------------------------------------------


def profile() -> None:
    """Cost of replay's calls against batch size (a fixed cost per call plus a cost per record),
    and of the C calls alone under them, to split the wrapper's time from the core's."""
    if REPLAY_MISSING:
        print(f"--profile: {REPLAY_MISSING}")
        return
    from replay._rq import ffi, lib  # internals, for the C-only rows
    buf = ReplayBuffer(CAPACITY, TRANSITION, seed=0)
    pbuf = PrioritizedReplayBuffer(CAPACITY, TRANSITION, alpha=0.6, seed=0)
    fill("replay", buf)
    fill("replay", pbuf)
    sizes = (1, 16, 64, 256, 1024)
    rng = np.random.default_rng(2)
    g = {"buf": buf, "pbuf": pbuf, "DATA": DATA, "np": np, "TRANSITION": TRANSITION, "lib": lib,
         "ffi": ffi, "row": DATA[0], "NULL": ffi.NULL}
    for n in sizes:
        out, pos, prob = np.empty(n, TRANSITION), np.empty(n, np.uint64), np.empty(n)
        idx = np.ascontiguousarray(pbuf.sample(n).indices, np.uint64)
        pa, pb = rng.random(n) + 0.1, rng.random(n) + 0.1
        g.update({f"out{n}": out, f"idx{n}": idx, f"gidx{n}": np.arange(n) * 37, f"pa{n}": pa, f"pb{n}": pb,
                  f"c_out{n}": ffi.from_buffer(out), f"c_pos{n}": ffi.from_buffer("uint64_t[]", pos),
                  f"c_prob{n}": ffi.from_buffer("double[]", prob),
                  f"c_idx{n}": ffi.from_buffer("uint64_t[]", idx), f"c_data{n}": ffi.from_buffer(DATA[:n]),
                  f"c_pa{n}": ffi.from_buffer("double[]", pa), f"c_pb{n}": ffi.from_buffer("double[]", pb)})
    # update_priorities alternates two sets of priorities: setting a leaf to its own value is free
    rows = [
        ("add(record)", "buf.add(row)", None),
        ("add_many(n)", "buf.add_many(DATA[:{n}])", sizes),
        ("  C only: rb_add", "lib.rb_add(buf._mem, c_data{n}, {n})", sizes),
        ("sample(n)", "buf.sample({n})", sizes),
        ("sample(n, out=)", "buf.sample({n}, out=out{n})", sizes),
        ("  C only: rbpy_sample",
         "lib.rbpy_sample(buf._mem, buf._rng, c_out{n}, c_pos{n}, NULL, {n}, 0, 0)", sizes),
        ("prioritized sample(n)", "pbuf.sample({n}, beta=0.4)", sizes),
        ("  C only: rbpy_sample",
         "lib.rbpy_sample(pbuf._mem, pbuf._rng, c_out{n}, c_pos{n}, c_prob{n}, {n}, 0, 0)", sizes),
        ("update_priorities(n)",
         "pbuf.update_priorities(idx{n}, pa{n}); pbuf.update_priorities(idx{n}, pb{n})", sizes),
        ("  C only: rb_update_priorities",
         "lib.rb_update_priorities(pbuf._mem, c_idx{n}, c_pa{n}, {n}); "
         "lib.rb_update_priorities(pbuf._mem, c_idx{n}, c_pb{n}, {n})", sizes),
        ("numpy: np.empty(n, dtype)", "np.empty({n}, TRANSITION)", sizes),
        ("numpy: DATA[idx] gather", "DATA[gidx{n}]", sizes),
    ]
    print("\nPer-call cost in one thread (best of 5 timing runs, microseconds); fit = fixed + per record;"
          "\nupdate_priorities rows are per call (each timing makes two calls)")
    print(f"  {'call':32s}" + "".join(f"{f'n={n}':>9s}" for n in sizes) + "  fixed us  ns/record")
    for label, stmt, ns in rows:
        calls = 2 if "update_priorities" in stmt else 1
        if ns is None:
            t = min(timeit.Timer(stmt, globals=g).repeat(5, 20_000)) / 20_000 * 1e6
            print(f"  {label:32s}{t:9.2f}")
            continue
        times = []
        for n in ns:
            number = max(20, 20_000 // n)
            best = min(timeit.Timer(stmt.format(n=n), globals=g).repeat(5, number))
            times.append(best / number / calls * 1e6)
        slope, fixed = np.polyfit(ns, times, 1)
        print(f"  {label:32s}" + "".join(f"{t:9.2f}" for t in times) + f"  {fixed:8.2f}  {slope * 1e3:9.1f}")
    buf.close()
    pbuf.close()


# ---- running and reporting ---------------------------------------------------------------------

IMPLS = ("replay", "cpprb", "sb3", "torchrl")
CELLS = [  # name, function, implementations, unit
    ("add/item", cell_add_item, IMPLS, "items/s"),
    ("add/batch64", cell_add_batch, IMPLS, "items/s"),
    ("sample/uniform", cell_sample_uniform, IMPLS, "items/s"),
    ("sample/uniform/out=", lambda impl, s: cell_sample_uniform(impl, s, out=True), ("replay",), "items/s"),
    ("sample/prio+update", cell_sample_prioritized, ("replay", "cpprb", "torchrl"), "items/s"),
    ("atari/add64", lambda impl, s: cell_atari(impl, s, "add"), ("replay", "cpprb", "numpy copy"), "B/s"),
    ("atari/add64/first-lap", lambda impl, s: cell_atari(impl, s, "fill"), ("replay", "cpprb", "numpy copy"),
     "B/s"),
    ("atari/sample32", lambda impl, s: cell_atari(impl, s, "sample"), ("replay", "cpprb", "numpy copy"),
     "B/s"),
]


def fmt(x: float, unit: str) -> str:
    if unit == "B/s":
        return f"{x / 1e9:.2f} GB/s"
    return f"{x / 1e6:.2f} M/s" if x >= 1e6 else f"{x / 1e3:.1f} k/s"


def measure(name, fn, impls, unit, repeats, seconds, results, labels=None):
    """Run the cell for every implementation, repeats outermost (so that a change in the
    machine's load falls on all of them alike), then store and print the medians."""
    labels = labels or {}
    runs, skipped = {impl: [] for impl in impls}, {}
    for _ in range(repeats):
        for impl in impls:
            if impl in skipped:
                continue
            r = fn(impl, seconds)
            if isinstance(r, str):
                skipped[impl] = r
                print(f"{name:22s} {labels.get(impl, impl):12s} skipped: {r}", flush=True)
            else:
                runs[impl].append(r)
    for impl, series in runs.items():
        label = labels.get(impl, impl)
        if not series:
            continue
        if isinstance(series[0], tuple):  # the multi-process cell: two rates, and cores used
            for part, what in enumerate(("add", "sample")):
                rates = [r[part] for r in series]
                results[(f"{name}/{what}", label)] = statistics.median(rates)
                cores = statistics.median(r[part + 2] for r in series)
                _line(f"{name}/{what}", label, rates, unit, f"; cores used {cores:.2f}")
        else:
            results[(name, label)] = statistics.median(series)
            _line(name, label, series, unit)


def _line(name, impl, runs, unit, extra=""):
    med = statistics.median(runs)
    spread = (max(runs) - min(runs)) / med if med else 0.0
    print(f"{name:22s} {impl:12s} {fmt(med, unit):>12s}  spread {spread:4.0%}  "
          f"(runs {', '.join(fmt(r, unit) for r in runs)}{extra})", flush=True)


def report(results) -> None:
    print("\nRatios, replay over each competitor (medians of the same run):")
    names = sorted({n for n, _ in results}, key=lambda n: list(dict.fromkeys(n for n, _ in results)).index(n))
    for name in names:
        ours = results.get((name, "replay"))
        if ours is None:
            continue
        base = name.replace("/out=", "")  # replay with out= against the others' plain sample
        parts = [f"{impl} {ours / results[(base, impl)]:.1f}x"
                 for impl in ("cpprb", "sb3", "torchrl", "cpprb MP") if results.get((base, impl))]
        print(f"  {name:22s} " + ", ".join(parts))

    def bar(label, name, impl, factor):
        ours, base = results.get((name, "replay")), results.get((name, impl))
        if ours is None or base is None:
            print(f"  SKIP  {label}  (cell not run)")
            return
        got = ours / base
        print(f"  {'PASS' if got >= factor else 'FAIL'}  {label}  (measured {got:.1f}x: "
              f"{fmt(ours, 'items/s')} vs {fmt(base, 'items/s')})")

    print("\nBars:")
    bar("batched add of 64 >= 5x cpprb", "add/batch64", "cpprb", 5)
    bar("uniform sample(256) >= 3x cpprb", "sample/uniform", "cpprb", 3)
    bar("prioritized sample(256) + update >= 3x cpprb", "sample/prio+update", "cpprb", 3)
    bar("4 writers + 1 sampler: add >= 10x cpprb MPReplayBuffer", "mp/4w1s/add", "cpprb MP", 10)
    bar("4 writers + 1 sampler: sampling while writing >= 5x", "mp/4w1s/sample", "cpprb MP", 5)
    bar("per-item add >= 3x SB3", "add/item", "sb3", 3)
    for name in ("atari/add64", "atari/sample32"):
        ours = results.get((name, "replay"))
        if ours is None:
            print(f"  SKIP  {name} >= 1 GB/s  (cell not run)")
        else:
            verdict = "PASS" if ours >= 1e9 else "FAIL"
            print(f"  {verdict}  {name} >= 1 GB/s  (measured {ours / 1e9:.2f} GB/s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short cells, 1 repeat (smoke run)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per cell (default 5; --quick: 1)")
    parser.add_argument("--seconds", type=float, default=None, help="time per run of a cell (default 0.5)")
    parser.add_argument("--only", metavar="PATTERN", help="regex on cell names, e.g. 'sample|mp'")
    parser.add_argument("--profile", action="store_true",
                        help="per-call costs of replay's buffers, then exit")
    args = parser.parse_args()
    exit_on_sigterm()
    repeats = args.repeats or (1 if args.quick else 5)
    seconds = args.seconds or (0.1 if args.quick else 0.5)

    print("replay.ReplayBuffer benchmark")
    print(machine("numpy", "cpprb", "stable-baselines3", "torchrl", "torch"))
    print(f"command: {' '.join([Path(sys.executable).name] + sys.argv)}")
    print(f"capacity {CAPACITY} transitions ({TRANSITION.itemsize} B each), sample {SAMPLE}, batch {BATCH}, "
          f"repeats {repeats}, {seconds:g} s per run\n")
    if args.profile:
        profile()
        return 0

    results = {}
    for name, fn, impls, unit in CELLS:
        if args.only and not re.search(args.only, name):
            continue
        measure(name, fn, impls, unit, repeats, seconds, results)
    if not args.only or re.search(args.only, "mp/4w1s"):
        mp_seconds = 0.5 if args.quick else 2.0
        measure("mp/4w1s", lambda impl, _: cell_mp(impl, mp_seconds), ("replay", "cpprb"), "items/s",
                repeats, mp_seconds, results, labels={"cpprb": "cpprb MP"})
    report(results)
    print(f"\nload average {load_average()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
