"""ReplayBuffer and PrioritizedReplayBuffer: rings of numpy records in shared memory that
any number of threads and processes add to and sample from, without a lock.

Writers never wait: one atomic fetch-add claims their positions. Samplers draw records at
random in C and copy them under a per-slot seqlock, so a record being overwritten is
never returned torn. Prioritized buffers keep a sum tree of priority^alpha in the same
shared memory (Schaul et al. 2016, "Prioritized Experience Replay", arXiv:1511.05952).
The algorithm is described in native/README.md ("Replay buffers").
"""
from __future__ import annotations

import json
import math
import os
import queue
import secrets
import struct
import threading
import time
import weakref
import zlib
from typing import NamedTuple

import numpy as np

from ._rq import ffi, lib
from ._shm import Segment, SegmentGone
from ._base import RecordHandle, check_dtype, deadline_of, wait_slice_ns
from .queue import Closed

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer", "PrioritizedSample", "MAX_TIMES_SAMPLED"]

MAX_TIMES_SAMPLED = lib.RB_MAX_TIMES_SAMPLED

# A sampler without limits whose draws keep landing on slots being overwritten tries again
# this many times (yielding between tries) before it reports the buffer as contended.
_CONTENDED_ROUNDS = 100_000
# error_buffer when none is given: Reverb's SampleToInsertRatio needs at least
# max(1, samples_per_insert) for the ratio to be reachable one insert at a time; twice
# that leaves room for a few inserts that land while a batch is being drawn.
_ERROR_BUFFER_SLACK = 2.0

_FILE_MAGIC = b"RPLYBUF\x00"
_FILE_VERSION = 1
_FILE_HEAD = struct.Struct("<8sII")  # magic, version, length of the JSON description

_sample, _add, _from_buffer, _new = lib.rbpy_sample, lib.rb_add, ffi.from_buffer, ffi.new
_weights, _update_checked = lib.rb_weights, lib.rb_update_priorities_checked
_F8, _U8, _I8 = np.dtype(np.float64), np.dtype(np.uint64), np.dtype(np.int64)
_BAD_PRIORITY, _BAD_POSITION = lib.RB_BAD_PRIORITY, lib.RB_BAD_POSITION


class PrioritizedSample(NamedTuple):
    """What `PrioritizedReplayBuffer.sample` returns."""

    records: np.ndarray  # [B] records of the buffer's dtype
    indices: np.ndarray  # [B] uint64 positions, for update_priorities
    weights: np.ndarray  # [B] float32 importance-sampling weights, max 1 in the batch


class _Settings(NamedTuple):
    """Everything fixed when a buffer is made; also what a pickled copy carries."""

    capacity: int
    record_size: int
    prioritized: bool
    alpha: float
    max_times_sampled: int  # 0: no limit
    samples_per_insert: float  # 0: no rate limiter
    error_buffer: float
    min_size_to_sample: int


def _config(settings: _Settings):
    config = ffi.new("rb_config_t *")
    config.capacity = settings.capacity
    config.record_size = settings.record_size
    config.prioritized = int(settings.prioritized)
    config.alpha = settings.alpha
    config.max_times_sampled = settings.max_times_sampled
    config.samples_per_insert = settings.samples_per_insert
    config.error_buffer = settings.error_buffer
    config.min_size_to_sample = settings.min_size_to_sample
    return config


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_number(name: str, value, *, positive: bool) -> float:
    if isinstance(value, (bool, np.bool_)) or \
            not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return value


def _child_seed(seed: int | None, copy: int) -> int | None:
    """The seed of the copy-th copy (pickled or forked) of a handle seeded with `seed`."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, copy]).generate_state(1, np.uint64)[0])


# Handles in this process: a forked child re-seeds each one, as a pickled copy would be,
# so that parent and child never draw the same numbers.
_HANDLES: weakref.WeakSet = weakref.WeakSet()


def _count_fork_copies() -> None:
    for buf in list(_HANDLES):
        buf._copies += 1


def _reseed_forked_copies() -> None:
    for buf in list(_HANDLES):
        buf._reseed(_child_seed(buf._seed, buf._copies))


os.register_at_fork(before=_count_fork_copies, after_in_child=_reseed_forked_copies)


class ReplayBuffer(RecordHandle):
    """A ring of `capacity` records of one numpy dtype, sampled uniformly with replacement.

    `add`/`add_many` never wait; when the ring is full the oldest records are overwritten.
    `sample` draws from the records published so far (or from the `recent` most recent
    positions). Pass the buffer to a `multiprocessing.Process` (fork or spawn), or pickle
    it, and both sides use the same records; the creating process removes the shared
    memory when the buffer is closed, collected, or the program exits, as for ArrayQueue.

    Reuse limits (both optional, kept in shared memory): `max_times_sampled` retires a
    record once it has been drawn that many times; `samples_per_insert` is Reverb's
    SampleToInsertRatio: `sample` waits (up to its `timeout`) while
    ``sampled + batch_size > samples_per_insert * (added - min_size_to_sample) + error_buffer``.
    `add` never waits. `error_buffer` defaults to ``2 * max(1, samples_per_insert)``.

    Random draws happen in C, with a xoshiro256** state per handle, seeded from `seed`
    (or from the OS when None). A copy of a seeded handle, pickled or inherited by a
    forked child, is seeded with a value derived from `seed` and how many copies were
    made before it, so a program that starts the same processes in the same order draws
    the same numbers; copies of an unseeded handle seed from the OS. `sample(rng=...)`
    takes a seed or a `numpy.random.Generator` for one call. A handle's generator is not
    for threads that sample at the same time: give each thread its own copy
    (`pickle.loads(pickle.dumps(buf))`) or its own `rng`.
    """

    _PRIORITIZED = False

    def __init__(self, capacity: int, dtype, *, max_times_sampled: int | None = None,
                 samples_per_insert: float | None = None, error_buffer: float | None = None,
                 min_size_to_sample: int = 1, seed: int | None = None):
        self._create(capacity, dtype, 1.0, max_times_sampled, samples_per_insert, error_buffer,
                     min_size_to_sample, seed)

    def _create(self, capacity, dtype, alpha, max_times_sampled, samples_per_insert,
                error_buffer, min_size_to_sample, seed) -> None:
        """Check every argument, then make and initialise the shared memory."""
        dtype = np.dtype(dtype)
        if not _is_int(capacity):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if not 1 <= capacity <= lib.RB_MAX_CAPACITY:
            raise ValueError(f"capacity must be between 1 and {lib.RB_MAX_CAPACITY}, got {capacity}")
        check_dtype(dtype)
        if max_times_sampled is not None:
            if not _is_int(max_times_sampled) or not 1 <= max_times_sampled <= MAX_TIMES_SAMPLED:
                raise ValueError(f"max_times_sampled must be None or an int from 1 to "
                                 f"{MAX_TIMES_SAMPLED}, got {max_times_sampled!r}")
        spi = 0.0 if samples_per_insert is None else _check_number(
            "samples_per_insert", samples_per_insert, positive=True)
        if error_buffer is not None and samples_per_insert is None:
            raise ValueError("error_buffer is the rate limiter's slack; it needs samples_per_insert")
        if error_buffer is None:
            error_buffer = _ERROR_BUFFER_SLACK * max(1.0, spi) if spi else 0.0
        error_buffer = _check_number("error_buffer", error_buffer, positive=False)
        if not _is_int(min_size_to_sample) or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be an int >= 1, got {min_size_to_sample!r}")
        if seed is not None and not _is_int(seed):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        settings = _Settings(int(capacity), dtype.itemsize, self._PRIORITIZED, float(alpha),
                             int(max_times_sampled or 0), spi, float(error_buffer),
                             int(min_size_to_sample))
        config = _config(settings)
        segment = Segment.create(lib.rb_bytes(config))
        lib.rb_init(segment.address, config)
        self._setup(segment, settings, dtype, seed)

    def _setup(self, segment: Segment, settings: _Settings, dtype: np.dtype, seed) -> None:
        self._segment = segment
        self._mem = segment.address
        self._settings = settings
        self._capacity = settings.capacity
        self._set_dtype(dtype)
        # This handle's random state, allocated once; and per thread, the positions of
        # draws nobody asked for (C reads them back to settle the batch, so two threads
        # sampling through one handle must not share them).
        self._rng = ffi.new("uint64_t[4]")
        self._scratch = threading.local()
        self._reseed(seed)
        self._waits = bool(settings.samples_per_insert or settings.max_times_sampled
                           or settings.min_size_to_sample > 1)
        _HANDLES.add(self)

    def _reseed(self, seed) -> None:
        """Seed this handle's generator; its copies derive their seeds from `seed`."""
        self._seed = None if seed is None else int(seed) % 2**64
        self._copies = 0
        lib.rb_seed(self._rng, secrets.randbits(64) if seed is None else self._seed)

    @classmethod
    def _attach(cls, name: str, settings: _Settings, dtype: np.dtype, seed) -> ReplayBuffer:
        self = cls.__new__(cls)
        config = _config(settings)
        try:
            segment = Segment.attach(name, lib.rb_bytes(config))
        except SegmentGone as error:
            raise Closed(f"the replay buffer is closed: {error}") from None
        if lib.rb_check(segment.address, segment.size, config) != lib.RB_OK:
            raise ValueError(f"shared memory {name!r} does not hold a replay buffer of this version")
        self._setup(segment, settings, dtype, seed)
        return self

    def __reduce__(self):
        self._copies += 1
        return type(self)._attach, (self._segment.name, self._settings, self._dtype,
                                    _child_seed(self._seed, self._copies))

    # ---- properties -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def _stats(self):
        out = ffi.new("rb_stats_t *")
        lib.rb_stats(self._mem, out)
        return out

    def __len__(self) -> int:
        """Records held now: published and not yet overwritten (at most `capacity`)."""
        return self._stats().size

    @property
    def added(self) -> int:
        """Records ever added (published)."""
        return self._stats().added

    @property
    def sampled(self) -> int:
        """Records ever returned by `sample` (what the rate limiter counts)."""
        return self._stats().sampled

    def stats(self) -> dict:
        """Counters: positions claimed, records added, held, sampled, dropped (not written
        because a live writer still held their slot a whole lap later), reclaimed (slots
        taken back from writers that died before publishing), and for prioritized
        buffers the largest priority seen and the sum tree's total."""
        s = self._stats()
        return {"claimed": s.claimed, "added": s.added, "size": s.size, "sampled": s.sampled,
                "dropped": s.dropped, "reclaimed": s.reclaimed, "tree_passes": s.tree_passes,
                "max_priority": s.max_priority, "total_priority": s.total_priority}

    # ---- add --------------------------------------------------------------------------

    def add(self, item) -> int:
        """Add one record; return its position (absolute, increasing). Never waits."""
        return _add(self._mem, self._record(item), 1)

    def add_many(self, items: np.ndarray) -> int:
        """Add the records of `items` (an array of the dtype) in order with one claim;
        return the position of the first. Of more than `capacity` records only the last
        `capacity` are kept, as if they had been added one by one."""
        self._check_array(items, "add_many's items")
        items = np.ascontiguousarray(items)
        if len(items) == 0:
            return _add(self._mem, ffi.NULL, 0)
        return _add(self._mem, _from_buffer(items), len(items))

    # ---- sample -----------------------------------------------------------------------

    def sample(self, batch_size: int, *, out: np.ndarray | None = None, recent: int | None = None,
               rng=None, timeout: float | None = None, return_indices: bool = False):
        """Return `batch_size` records drawn uniformly at random with replacement from the
        records held (or from the `recent` most recent positions, 1 <= recent <= capacity;
        positions still being written are skipped).

        `out`: a writable, C-contiguous array of the dtype with at least `batch_size` rows,
        filled and returned (`out[:batch_size]`) with no allocation. `rng`: None (this
        handle's generator), an int seed, or a `numpy.random.Generator` (one 64-bit seed
        is drawn from it). `timeout` (seconds; None waits forever, 0 not at all) applies
        while the rate limiter, `min_size_to_sample` or `max_times_sampled` keep records
        from being drawn. Raises `replay.Empty` (which is `queue.Empty`) when nothing can
        be drawn: at once from an empty buffer without those limits, else after the
        timeout. With `return_indices`, returns `(records, positions)`.
        """
        self._check_batch_size(batch_size)
        if recent is not None and (not _is_int(recent) or not 1 <= recent <= self._capacity):
            raise ValueError(f"recent must be None or an int from 1 to the capacity "
                             f"{self._capacity}, got {recent!r}")
        out = self._out(out, batch_size)
        if return_indices:
            positions = np.empty(batch_size, np.uint64)
        else:  # nobody asked for them: this thread's scratch array
            positions = getattr(self._scratch, "positions", None)
            if positions is None or len(positions) < batch_size:
                positions = self._scratch.positions = np.empty(batch_size, np.uint64)
            positions = positions[:batch_size]
        self._draw(out, positions, ffi.NULL, recent or 0, rng, timeout)
        return (out, positions) if return_indices else out

    def _check_batch_size(self, batch_size) -> None:
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")

    def _out(self, out, batch_size: int) -> np.ndarray:
        if out is None:
            return np.empty(batch_size, self._dtype)
        self._check_out(out, batch_size)
        return out if len(out) == batch_size else out[:batch_size]

    def _generator(self, rng):
        """The C random state for one call: this handle's, or one seeded for the call."""
        if rng is None:
            return self._rng
        if isinstance(rng, np.random.Generator):
            seed = int(rng.integers(0, 2**64, dtype=np.uint64))
        elif _is_int(rng):
            seed = int(rng) % 2**64
        else:
            raise TypeError(f"rng must be None, an int seed or a numpy.random.Generator, got {rng!r}")
        state = _new("uint64_t[4]")  # one per call: threads may share the handle
        lib.rb_seed(state, seed)
        return state

    def _draw(self, out, positions, probabilities, recent: int, rng, timeout) -> None:
        """Fill out and positions (and probabilities) in full, or raise Empty having taken
        nothing: C draws a whole batch or gives every draw back (native/README.md)."""
        if timeout is not None and timeout != math.inf:
            timeout = _check_number("timeout", timeout, positive=False)
        state = self._generator(rng)
        n = len(out)
        out_c, pos_c = _from_buffer(out), ffi.from_buffer("uint64_t[]", positions)
        waits = self._waits and timeout != 0
        until = deadline_of(timeout) if waits else None
        rounds = 0
        while True:
            got = _sample(self._mem, state, out_c, pos_c, probabilities, n, recent,
                          wait_slice_ns(until) if waits else 0)
            if got == n:
                return
            if got < 0:
                raise RuntimeError(f"replay buffer error {got}")
            if not self._waits and self._overwritten_meanwhile(rounds := rounds + 1):
                os.sched_yield()  # the writers were faster: the records are there, try again
                continue
            if not waits or (until is not None and time.monotonic() >= until):
                break
        raise queue.Empty(self._why_empty(n, timeout))

    def _overwritten_meanwhile(self, rounds: int) -> bool:
        """Whether a draw without limits failed only because writers kept overwriting
        the slots it read (a small ring under heavy writing): records are published and
        drawable, so trying again succeeds once a copy slips between two writes."""
        s = self._stats()
        drawable = s.size > 0 and not (self._PRIORITIZED and s.total_priority <= 0)
        return drawable and rounds <= _CONTENDED_ROUNDS

    def _why_empty(self, n: int, timeout) -> str:
        s, settings = self._stats(), self._settings
        if s.size == 0 and not self._waits:
            return "the replay buffer is empty: add records before sampling"
        reasons = []
        if self._PRIORITIZED and s.total_priority <= 0:
            reasons.append("every record has priority 0")
        if s.added < settings.min_size_to_sample:
            reasons.append(f"{s.added} records added, fewer than min_size_to_sample="
                           f"{settings.min_size_to_sample}")
        if settings.samples_per_insert:
            reasons.append(f"the rate limiter allows {settings.samples_per_insert} samples per "
                           f"insert (+{settings.error_buffer}); {s.sampled} sampled, {s.added} added")
        if settings.max_times_sampled:
            reasons.append(f"records retire after {settings.max_times_sampled} draws: fewer "
                           f"than {n} draws may be left")
        waited = "at once" if timeout == 0 or not self._waits else f"within {timeout} s"
        return (f"could not draw a batch of {n} records {waited} (nothing was taken): "
                + ("; ".join(reasons) or "writers overwrote every slot it tried to read; "
                   "give the buffer a larger capacity"))

    # ---- save and load ----------------------------------------------------------------

    def save(self, path) -> None:
        """Write the records held now, their positions, draw counts and priorities, and
        the counters, to `path`: a temporary file in the same folder, then a rename, so
        that `path` is never left half-written. Adds that run meanwhile may or may not
        be included (each record is copied whole)."""
        cap = self._capacity
        records = np.empty(cap, self._dtype)
        positions = np.empty(cap, np.uint64)
        leaves = np.zeros(cap, np.float64)
        uses = np.zeros(cap, np.uint64)
        s = self._stats()  # counters before the copy: added may lag the records a little
        n = lib.rb_export(self._mem, _from_buffer(records), ffi.from_buffer("uint64_t[]", positions),
                          ffi.from_buffer("double[]", leaves), ffi.from_buffer("uint64_t[]", uses), cap)
        description = {
            "kind": type(self).__name__, "prioritized": self._PRIORITIZED,
            "capacity": cap, "dtype": np.lib.format.dtype_to_descr(self._dtype),
            "itemsize": self._dtype.itemsize, "alpha": self._settings.alpha, "count": n,
            "claimed": max(s.claimed, int(positions[n - 1]) + 1 if n else 0),
            "added": s.added, "sampled": s.sampled, "max_priority": s.max_priority,
        }
        head = json.dumps(description).encode()
        parts = [_FILE_HEAD.pack(_FILE_MAGIC, _FILE_VERSION, len(head)), head,
                 records[:n].tobytes(), positions[:n].tobytes(), leaves[:n].tobytes(),
                 uses[:n].tobytes()]
        checksum = 0
        for part in parts:
            checksum = zlib.crc32(part, checksum)
        path = os.fspath(path)
        temporary = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with open(temporary, "wb") as f:
                for part in parts:
                    f.write(part)
                f.write(struct.pack("<I", checksum))
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def load(self, path) -> None:
        """Replace the contents with those saved in `path` by `save`. Everything in the
        file is checked first (format, version, checksum, kind, dtype, capacity); a
        problem raises ValueError and leaves the buffer unchanged. Nothing else may add
        to or sample from the buffer while it loads."""
        data = open(os.fspath(path), "rb").read()
        description, records, positions, leaves, uses = self._parse(data, os.fspath(path))
        old_alpha, alpha = description["alpha"], self._settings.alpha
        if self._PRIORITIZED and old_alpha != alpha:
            # Leaves hold priority^alpha: re-express them with this buffer's alpha (leaves
            # saved with alpha 0 are all 1: give them the largest priority seen).
            leaves = leaves ** (alpha / old_alpha) if old_alpha else \
                np.full_like(leaves, description["max_priority"] ** alpha)
        records = np.ascontiguousarray(records)
        lib.rb_import(self._mem, _from_buffer(records) if len(records) else ffi.NULL,
                      ffi.from_buffer("uint64_t[]", positions), ffi.from_buffer("double[]", leaves),
                      ffi.from_buffer("uint64_t[]", uses), len(records), description["claimed"],
                      description["added"], description["sampled"], description["max_priority"])

    def _parse(self, data: bytes, path: str):
        def bad(problem: str, fix: str) -> ValueError:
            return ValueError(f"cannot load {path!r}: {problem}; {fix}")

        if len(data) < _FILE_HEAD.size + 4 or data[:8] != _FILE_MAGIC:
            raise bad("it is not a replay buffer file (wrong magic)",
                      "pass a file written by ReplayBuffer.save")
        _, version, head_len = _FILE_HEAD.unpack_from(data)
        if version != _FILE_VERSION:
            raise bad(f"it has format version {version}, this code reads version {_FILE_VERSION}",
                      "load it with the version of this package that saved it")
        (checksum,) = struct.unpack("<I", data[-4:])
        if zlib.crc32(data[:-4]) != checksum:
            raise bad("the checksum does not match: the file is corrupt or truncated",
                      "save the buffer again or use a good copy")
        try:
            description = json.loads(data[_FILE_HEAD.size:_FILE_HEAD.size + head_len])
            saved_dtype = np.dtype(np.lib.format.descr_to_dtype(
                _as_descr(description["dtype"])))
        except (ValueError, KeyError, TypeError) as error:
            raise bad(f"its description cannot be read ({error})", "save the buffer again") from None
        if description["prioritized"] != self._PRIORITIZED:
            raise bad(f"it holds a {description['kind']}, this is a {type(self).__name__}",
                      f"load it into a {description['kind']}")
        if saved_dtype != self._dtype:
            raise bad(f"its records have dtype {saved_dtype}, this buffer's are {self._dtype}",
                      "load it into a buffer made with the saved dtype")
        if description["capacity"] != self._capacity:
            raise bad(f"it was saved from a buffer of capacity {description['capacity']}, this "
                      f"one has capacity {self._capacity}",
                      "load it into a buffer of the same capacity")
        n, size = description["count"], self._dtype.itemsize
        offset = _FILE_HEAD.size + head_len
        expected = offset + n * (size + 8 + 8 + 8) + 4
        if len(data) != expected or not 0 <= n <= self._capacity:
            raise bad(f"it is {len(data)} bytes, its description says {expected}",
                      "save the buffer again")
        records = np.frombuffer(data, self._dtype, n, offset)
        offset += n * size
        positions, leaves, uses = (np.frombuffer(data, t, n, offset + i * 8 * n)
                                   for i, t in enumerate((np.uint64, np.float64, np.uint64)))
        return description, records, positions, leaves, uses

    # ---- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Remove the shared memory's name (in the creating process); handles already
        attached, here or in other processes, keep working until they are collected."""
        self._segment.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)}/{self._capacity}, dtype={self._dtype})"

    # Words in the messages of RecordHandle's record checks.
    _NOUN, _ROWS = "buffer", "batch_size"


def _as_descr(descr):
    """JSON turns the tuples of a dtype description into lists: turn them back."""
    if isinstance(descr, list):
        return [tuple(_as_descr(x) for x in field) if isinstance(field, list) else field
                for field in descr]
    return descr


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016): record i is drawn with
    probability P(i) = p_i^alpha / sum_k p_k^alpha.

    New records enter at the largest priority seen so far (1.0 at first). The sum tree
    lives in the shared memory and is updated without a lock, so writers and learners in
    any process may add and update priorities at the same time (native/README.md says
    why sampling stays correct while sums are briefly inconsistent). Takes the keywords
    of ReplayBuffer.
    """

    _PRIORITIZED = True

    def __init__(self, capacity: int, dtype, alpha: float = 0.6, *,
                 max_times_sampled: int | None = None, samples_per_insert: float | None = None,
                 error_buffer: float | None = None, min_size_to_sample: int = 1,
                 seed: int | None = None):
        alpha = _check_number("alpha", alpha, positive=False)
        self._create(capacity, dtype, alpha, max_times_sampled, samples_per_insert, error_buffer,
                     min_size_to_sample, seed)

    @property
    def alpha(self) -> float:
        return self._settings.alpha

    def sample(self, batch_size: int, beta: float = 0.4, *, out: np.ndarray | None = None,
               rng=None, timeout: float | None = None) -> PrioritizedSample:
        """Draw `batch_size` records with probability P(i) (with replacement) and return
        them with their positions and importance-sampling weights
        w_i = (N * P(i))^-beta / max_j w_j, N = len(self). The maximum is over the batch
        (a lock-free tree keeps sums, not minima, so the buffer-wide maximum weight is
        not known); the largest weight in each batch is therefore exactly 1.
        `out`, `rng` and `timeout` are as in ReplayBuffer.sample."""
        self._check_batch_size(batch_size)
        beta = _check_number("beta", beta, positive=False)
        out = self._out(out, batch_size)
        positions = np.empty(batch_size, np.uint64)
        # Read by no one but rb_weights below: a C array, and one per call, since threads
        # with their own rng may sample through one handle at the same time.
        probabilities = _new("double[]", batch_size)
        self._draw(out, positions, probabilities, 0, rng, timeout)
        weights = np.empty(batch_size, np.float32)
        _weights(probabilities, batch_size, beta, _from_buffer("float[]", weights))
        return PrioritizedSample(out, positions, weights)

    def update_priorities(self, indices, priorities) -> int:
        """Set the priorities of the records at `indices` (positions from `sample`).
        Indices whose slot has been overwritten since are ignored. Priorities must be
        finite and >= 0, and indices positions that were claimed: otherwise ValueError,
        before anything is written. Returns the count applied."""
        # The common case, arrays from sample() and float64 priorities, goes to C as is;
        # C checks every value (one pass each) before it writes anything.
        if type(indices) is not np.ndarray:
            indices = np.asarray(indices)
        if type(priorities) is not np.ndarray or priorities.dtype != _F8:
            priorities = np.asarray(priorities, dtype=np.float64)
        n = len(indices) if indices.ndim == 1 else -1
        if n < 0 or priorities.ndim != 1 or len(priorities) != n:
            raise ValueError(f"indices and priorities must be 1-D and of one length, got shapes "
                             f"{indices.shape} and {priorities.shape}")
        if n == 0:
            return 0
        kind = indices.dtype.kind
        if kind != "u" and kind != "i":
            raise TypeError(f"indices must be integer positions from sample(), "
                            f"got dtype {indices.dtype}")
        # Signed indices go as int64: a negative one reads in C as 2^63 or more, out of range.
        wanted = _U8 if kind == "u" else _I8
        if indices.dtype != wanted or not indices.flags.c_contiguous:
            indices = np.ascontiguousarray(indices, dtype=wanted)
        if not priorities.flags.c_contiguous:
            priorities = np.ascontiguousarray(priorities)
        detail = _new("uint64_t[2]")
        applied = _update_checked(self._mem, _from_buffer("uint64_t[]", indices),
                                  _from_buffer("double[]", priorities), n, detail)
        if applied == _BAD_PRIORITY:
            raise ValueError(f"priorities must be finite and >= 0, got {priorities[detail[0]]}")
        if applied == _BAD_POSITION:
            raise ValueError(f"index {indices[detail[0]]} is out of range: positions so far "
                             f"are 0 to {detail[1] - 1}")
        return applied

    def priority_sums(self) -> tuple[float, float]:
        """(the sum tree's root, the exact sum of its leaves): equal up to the rounding of
        concurrent float adds, which the drift correction keeps small."""
        return self._stats().total_priority, lib.rb_leaf_sum(self._mem)
