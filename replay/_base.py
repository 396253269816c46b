"""What ArrayQueue and the replay buffers share: checking a dtype, turning items into
records with the same checks and messages, and waiting in slices."""
from __future__ import annotations

import math
import time

import numpy as np

from ._rq import ffi, lib

_from_buffer = ffi.from_buffer

MAX_RECORD_BYTES = lib.RQ_MAX_RECORD_SIZE

# Blocking calls wait in C for at most this long per call, then come back to Python, so
# that Ctrl-C and other signals are handled while a thread waits.
WAIT_SLICE_NS = 50_000_000

# (given kind, stored kind) pairs whose conversion loses information: float or complex
# into integer or bool, complex into float.
_LOSSY_KINDS = {g + q for g in "fc" for q in "iub"} | {"cf"}


def deadline_of(timeout: float | None) -> float | None:
    """When a wait of `timeout` seconds ends; None for no limit (None or infinity)."""
    return None if timeout is None or timeout == math.inf else time.monotonic() + timeout


def wait_slice_ns(until: float | None) -> int:
    """How long the next C call may wait: one slice, or less when `until` (a deadline
    from `deadline_of`) comes first; at least 1 ns, since 0 means "do not wait"."""
    if until is None:
        return WAIT_SLICE_NS
    return min(WAIT_SLICE_NS, max(1, int((until - time.monotonic()) * 1e9)))


def check_dtype(dtype: np.dtype) -> None:
    if dtype.hasobject:
        raise TypeError(
            f"dtype {dtype} holds Python objects, which cannot live in shared memory; "
            "use fixed-size fields (numbers, bools, fixed-length bytes)"
        )
    if dtype.itemsize == 0:
        raise ValueError(f"dtype {dtype} has size 0; records must hold at least one byte")
    if dtype.itemsize > MAX_RECORD_BYTES:
        raise ValueError(
            f"a record of dtype {dtype} takes {dtype.itemsize} bytes, more than the limit of "
            f"{MAX_RECORD_BYTES} ({MAX_RECORD_BYTES >> 20} MiB); put the large part elsewhere "
            "in shared memory and queue an index to it"
        )



class RecordHandle:
    """A handle on records of one numpy dtype in shared memory: the checks and
    conversions of items, with messages that name the container (`_NOUN`) and its
    batch-size argument (`_ROWS`)."""

    _NOUN, _ROWS = "container", "n"

    def _set_dtype(self, dtype: np.dtype) -> None:
        self._dtype = dtype
        # A dtype with a subarray, e.g. ("f4", (84, 84)), is stored as its base type with
        # that shape per item: numpy expands it when it creates an array.
        self._base = dtype.base
        self._item_shape = dtype.shape

    def _record(self, item):
        """One item as a cffi buffer of exactly one record, or a clear error."""
        if type(item) is np.void and item.dtype == self._dtype:  # a row of a record array
            return _from_buffer(item)
        if isinstance(item, (np.ndarray, np.generic)):
            if item.dtype != self._base or item.shape != self._item_shape:
                raise TypeError(
                    f"item has dtype {item.dtype} and shape {item.shape}; this {self._NOUN} holds "
                    f"{self._describe()}"
                )
            if isinstance(item, np.ndarray) and not item.flags.c_contiguous:
                item = np.ascontiguousarray(item)
        else:
            # Refuse conversions that drop a fraction or an imaginary part (5.7 into an
            # int queue); numpy itself refuses out-of-range Python ints.
            kinds = np.asarray(item).dtype.kind + self._base.kind if self._base.fields is None else ""
            if kinds in _LOSSY_KINDS:
                raise TypeError(f"cannot store {item!r} as {self._describe()} without losing "
                                "information; convert it explicitly")
            try:
                item = np.asarray(item, dtype=self._base)
            except (TypeError, ValueError, OverflowError) as error:
                raise TypeError(f"cannot store {item!r} as {self._describe()}: {error}") from None
            if item.shape != self._item_shape:
                raise ValueError(
                    f"item has shape {item.shape}; this {self._NOUN} holds {self._describe()}"
                )
        return _from_buffer(item)

    def _check_out(self, out, max_items: int) -> None:
        self._check_array(out, "out")
        if len(out) < max_items:
            raise ValueError(f"out has {len(out)} rows, fewer than {self._ROWS}={max_items}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("out must be C-contiguous and writeable")

    def _check_array(self, array, what: str) -> None:
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"{what} must be a numpy array of {self._describe()}, got "
                f"{type(array).__name__}; build one with np.asarray(..., dtype={self._NOUN}.dtype)"
            )
        if array.dtype != self._base or array.shape[1:] != self._item_shape or \
                array.ndim != 1 + len(self._item_shape):
            raise TypeError(
                f"{what} has dtype {array.dtype} and shape {array.shape}; it must be an "
                f"array of n {self._describe()}"
            )

    def _describe(self) -> str:
        if self._item_shape:
            return f"items of shape {self._item_shape} and dtype {self._base}"
        return f"items of dtype {self._dtype}"
