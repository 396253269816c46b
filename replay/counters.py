"""Counters: named 64-bit atomic counters in shared memory, for threads and processes."""
from __future__ import annotations

import struct
from collections.abc import Iterable

import numpy as np

from ._rq import ffi, lib
from ._shm import Segment, SegmentGone

__all__ = ["Counters"]


class Counters:
    """Integer and float counters that any thread or process can add to without a lock.

    Integers use an atomic add; floats a compare-and-swap loop, so no update is lost.
    Each counter sits on its own cache line. Pickle the object (or pass it to a
    `multiprocessing.Process`) to use the same counters in another process.

        >>> c = Counters(["steps", "episodes"], ["return_sum"])
        >>> c.add("steps", 8); c.add("return_sum", 21.5)
        >>> c["steps"], c.snapshot()["return_sum"]
        (8, 21.5)
    """

    def __init__(self, int_names: Iterable[str], float_names: Iterable[str] = ()):
        int_names, float_names = tuple(int_names), tuple(float_names)
        names = int_names + float_names
        bad = [n for n in names if not isinstance(n, str) or not n]
        if bad:
            raise TypeError(f"counter names must be non-empty strings, got {bad!r}")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"counter names must be unique; repeated: {', '.join(repeated)}")
        segment = Segment.create(lib.rq_counters_bytes(len(names)))
        lib.rq_counters_init(segment.address, len(names))
        self._setup(segment, int_names, float_names)

    def _setup(self, segment: Segment, int_names: tuple, float_names: tuple) -> None:
        self._segment = segment
        self._mem = segment.address
        self._int_names, self._float_names = int_names, float_names
        self._index = {name: i for i, name in enumerate(int_names + float_names)}

    @classmethod
    def _attach(cls, name: str, int_names: tuple, float_names: tuple) -> Counters:
        self = cls.__new__(cls)
        n = len(int_names) + len(float_names)
        try:
            segment = Segment.attach(name, lib.rq_counters_bytes(n))
        except SegmentGone as error:
            raise RuntimeError(f"the counters are gone: {error}") from None
        if lib.rq_counters_check(segment.address, segment.size, n) != lib.RQ_OK:
            raise ValueError(f"shared memory {name!r} does not hold {n} counters")
        self._setup(segment, int_names, float_names)
        return self

    def __reduce__(self):
        return Counters._attach, (self._segment.name, self._int_names, self._float_names)

    @property
    def names(self) -> tuple[str, ...]:
        return self._int_names + self._float_names

    def _slot(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(
                f"no counter named {name!r}; the counters are: {', '.join(self._index)}"
            ) from None

    def add(self, name: str, value=1) -> None:
        """Add `value` (an int for integer counters) to the counter `name`."""
        i = self._slot(name)
        if i < len(self._int_names):
            lib.rq_counter_add_int(self._mem, i, _as_int(name, value))
        else:
            lib.rq_counter_add_float(self._mem, i, float(value))

    def set(self, name: str, value) -> None:
        """Overwrite a counter (used to restore counters when a run resumes)."""
        i = self._slot(name)
        if i < len(self._int_names):
            lib.rq_counter_set_int(self._mem, i, _as_int(name, value))
        else:
            lib.rq_counter_set_float(self._mem, i, float(value))

    def __getitem__(self, name: str):
        i = self._slot(name)
        raw = lib.rq_counter_load(self._mem, i)
        if i < len(self._int_names):
            return raw - (1 << 64) if raw >> 63 else raw  # two's complement
        return struct.unpack("d", struct.pack("Q", raw))[0]

    def snapshot(self) -> dict:
        """Every counter's current value. Each value is read atomically; the set is not
        one instant, as other threads keep adding while it is read."""
        raw = np.empty(len(self._index), np.uint64)
        lib.rq_counters_read(self._mem, ffi.from_buffer("uint64_t[]", raw), len(raw))
        n_int = len(self._int_names)
        ints = raw[:n_int].view(np.int64).tolist()
        floats = raw[n_int:].view(np.float64).tolist()
        return dict(zip(self._int_names, ints)) | dict(zip(self._float_names, floats))

    def close(self) -> None:
        """Remove the shared memory's name (creator only); attached processes keep it."""
        self._segment.unlink()

    def __repr__(self) -> str:
        return f"Counters({self.snapshot()})"


def _as_int(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"counter {name!r} counts integers, got {value!r}")
    return int(value)
