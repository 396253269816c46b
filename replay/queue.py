"""ArrayQueue: a bounded lock-free queue of fixed-size numpy records in shared memory."""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ._base import (MAX_RECORD_BYTES, WAIT_SLICE_NS, RecordHandle, check_dtype, deadline_of,
                    wait_slice_ns)
from ._rq import ffi, lib
from ._shm import Segment, SegmentGone

__all__ = ["ArrayQueue", "Closed", "MAX_CAPACITY", "MAX_RECORD_BYTES"]

MAX_CAPACITY = lib.RQ_MAX_CAPACITY
MAX_PRODUCERS = lib.RQ_MAX_PRODUCERS
MAX_CONSUMERS = lib.RQ_MAX_CONSUMERS


# Bound once: these are on the per-item path.
_push, _pop, _from_buffer, _ndarray = lib.rqpy_push, lib.rqpy_pop, ffi.from_buffer, np.ndarray
_borrow, _release, _new_index = lib.rqpy_borrow, lib.rq_release, ffi.new


def _borrow_for_move(q, slot, n: int, timeout_ns: int) -> int:
    """rq_borrow with rq_pop's order of arguments, for ArrayQueue._move."""
    return _borrow(q, n, timeout_ns, slot)


class Closed(getattr(queue, "ShutDown", Exception)):
    """The queue is closed: puts are refused, and gets find it closed and drained."""


def _timeout_error(timeout) -> ValueError:
    return ValueError(
        f"timeout must be a positive number of seconds or None, got {timeout!r}; "
        "for a call that does not wait, pass block=False"
    )


def _check_timeout(block: bool, timeout: float | None) -> None:
    if block and timeout is not None and not (timeout > 0):  # also rejects NaN
        raise _timeout_error(timeout)


class Borrow:
    """What `ArrayQueue.borrow` returns: entering it lends the records, leaving it gives
    their slots back to the producers. Used once, and left on the thread that entered it:
    the loan belongs to that thread (native/README.md, "Borrow")."""

    __slots__ = ("_queue", "_args", "_thread", "_lent")

    def __init__(self, queue_: ArrayQueue, max_items: int, block: bool, timeout: float | None):
        self._queue, self._args, self._thread, self._lent = queue_, (max_items, block, timeout), None, 0

    def __enter__(self) -> np.ndarray:
        if self._thread is not None:
            raise RuntimeError("a borrow is used once: call queue.borrow(...) again for the next loan")
        self._thread = threading.get_ident()
        records = self._queue._lend(*self._args)
        self._lent = len(records)
        return records

    def __exit__(self, *exc) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "a borrow must end on the thread that began it (a `with queue.borrow(...)` "
                "block in a generator finished by another thread): its records stay lent "
                "until that thread ends its block")
        released = _release(self._queue._q)
        if released != self._lent:
            raise RuntimeError(f"queue error: the borrow of {self._lent} records released {released}")


class ArrayQueue(RecordHandle):
    """Bounded multi-producer multi-consumer FIFO of records of one numpy dtype.

    One item is one element of `dtype`, which may be structured, for example a
    transition ``[("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"), ("done", "?")]``.
    The interface is `queue.Queue`'s, plus `put_many`/`get_many` for numpy batches and
    `close()`. The records live in shared memory: pass the queue to a
    `multiprocessing.Process` (fork or spawn) and both sides use the same queue. The
    creating process removes the shared memory when the queue is closed, collected, or
    the program exits.

    Order: records from one producer come out in the order it put them; records from
    different producers interleave. `qsize()`, `empty()` and `full()` are snapshots that
    may be stale by the time they return, as with `queue.Queue`.
    """

    def __init__(self, capacity: int, dtype):
        dtype = np.dtype(dtype)
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
            raise TypeError(f"capacity must be an int, got {type(capacity).__name__}")
        if not 1 <= capacity <= MAX_CAPACITY:
            raise ValueError(f"capacity must be between 1 and {MAX_CAPACITY}, got {capacity}")
        check_dtype(dtype)
        capacity = int(capacity)
        segment = Segment.create(lib.rq_queue_bytes(capacity, dtype.itemsize))
        lib.rq_queue_init(segment.address, capacity, dtype.itemsize)
        self._setup(segment, capacity, dtype)

    def _setup(self, segment: Segment, capacity: int, dtype: np.dtype) -> None:
        self._segment = segment
        self._q = segment.address
        self._capacity = capacity
        self._set_dtype(dtype)
        # Every slot's record, read-only: a borrow lends a slice of it. Its buffer keeps
        # the mapping alive while any slice does (Segment.view).
        stride = lib.rq_slot_bytes(self._q)
        memory = segment.view(lib.rq_records_offset(self._q), stride * (capacity - 1) + dtype.itemsize)
        self._slots = np.ndarray(capacity, dtype, memory, strides=(stride,))
        self._slots.flags.writeable = False

    @classmethod
    def _attach(cls, name: str, capacity: int, dtype: np.dtype) -> ArrayQueue:
        self = cls.__new__(cls)
        try:
            segment = Segment.attach(name, lib.rq_queue_bytes(capacity, dtype.itemsize))
        except SegmentGone as error:
            raise Closed(f"the queue is closed: {error}") from None
        if lib.rq_queue_check(segment.address, segment.size, capacity, dtype.itemsize) != lib.RQ_OK:
            raise ValueError(f"shared memory {name!r} does not hold a queue of this version")
        self._setup(segment, capacity, dtype)
        return self

    def __reduce__(self):
        return ArrayQueue._attach, (self._segment.name, self._capacity, self._dtype)

    # ---- properties -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def maxsize(self) -> int:
        """`queue.Queue`'s name for the capacity."""
        return self._capacity

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def closed(self) -> bool:
        return bool(lib.rq_is_closed(self._q))

    def qsize(self) -> int:
        return lib.rq_size(self._q)

    __len__ = qsize

    def empty(self) -> bool:
        return lib.rq_size(self._q) == 0

    def full(self) -> bool:
        return lib.rq_size(self._q) >= self._capacity

    def stats(self) -> dict[str, int]:
        """Counts since the queue was created, over every process that uses it:

        - ``full_waits``, ``empty_waits``: calls that had to wait for room, or for an item;
        - ``skipped``: slots given up because the producer that claimed them died (for
          example killed) before writing its record; no record was in them;
        - ``lost``: records taken by a consumer that died before its get returned: the
          queue freed their slots for the producers, and nobody received them.
        """
        out = ffi.new("rq_stats_t *")
        lib.rq_stats(self._q, out)
        return {"full_waits": out.full_waits, "empty_waits": out.empty_waits,
                "skipped": out.skipped, "lost": out.lost}

    # ---- one item ---------------------------------------------------------------------

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        """Put one item, waiting for room if `block`. Raises `queue.Full` if there is no
        room (at once, or after `timeout` seconds), `Closed` if the queue is closed."""
        record = self._record(item)
        # One C call when there is room, with or without a timeout: the deadline is worked
        # out only once that call has found the queue full.
        if timeout is None:
            moved = _push(self._q, record, 1, WAIT_SLICE_NS if block else 0)
        elif not block or timeout > 0:  # a zero, negative or NaN timeout fails `timeout > 0`
            moved = _push(self._q, record, 1, 0)
        else:
            raise _timeout_error(timeout)
        if moved == 1:
            return
        if moved < 0:
            raise self._error(moved)
        if not (block and self._move(_push, record, 1, block, deadline_of(timeout))):
            raise queue.Full

    def put_nowait(self, item) -> None:
        self.put(item, block=False)

    def get(self, block: bool = True, timeout: float | None = None):
        """Remove and return one item (a numpy scalar of the dtype, or an array for a
        subarray dtype). Raises `queue.Empty` if there is none (at once, or after
        `timeout` seconds), `Closed` once the queue is closed and drained."""
        out = _ndarray(1, self._dtype)  # uninitialised, as np.empty, at half the cost
        buffer = _from_buffer(out)
        # One C call when there is an item, with or without a timeout (see put).
        if timeout is None:
            moved = _pop(self._q, buffer, 1, WAIT_SLICE_NS if block else 0)
        elif not block or timeout > 0:
            moved = _pop(self._q, buffer, 1, 0)
        else:
            raise _timeout_error(timeout)
        if moved == 1:
            return out[0]
        if moved < 0:
            raise self._error(moved)
        if not (block and self._move(_pop, buffer, 1, block, deadline_of(timeout))):
            raise queue.Empty
        return out[0]

    def get_nowait(self):
        return self.get(block=False)

    # ---- batches ----------------------------------------------------------------------

    def put_many(self, items: np.ndarray, block: bool = True, timeout: float | None = None) -> int:
        """Put the records of `items` (an array of the queue's dtype) in order, and return
        how many were put: all of them, unless the call did not block (`block=False`)
        or `timeout` ran out, in which case the first N were put and the rest were not.
        Raises `queue.Full` or `Closed` only when none could be put."""
        items = self._records(items)
        _check_timeout(block, timeout)
        n = len(items)
        if n == 0:
            return 0
        base = _from_buffer(items)
        size = self._dtype.itemsize
        done = 0
        try:
            # First one C call that does not wait: when everything fits, as it mostly does,
            # no deadline is worked out, with or without a timeout.
            moved = _push(self._q, base, n, 0)
            if moved < 0:
                raise self._error(moved)
            done = moved
            deadline = deadline_of(timeout) if done < n else None
            while done < n:
                moved = self._move(_push, base + done * size, n - done, block, deadline)
                if moved == 0:
                    break  # block=False, or the timeout ran out
                done += moved
        except Closed:
            if done == 0:
                raise
        finally:
            ffi.release(base)
        if done == 0:
            raise queue.Full
        return done

    def get_many(self, max_items: int, block: bool = True, timeout: float | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Remove and return between 1 and `max_items` records as an array, waiting for
        the first if `block`. With `out` (a writable, contiguous array of the dtype with
        at least `max_items` rows) the records are written there and `out[:n]` returned,
        with no allocation. Raises `queue.Empty` or `Closed` like `get`."""
        if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 1:
            raise ValueError(f"max_items must be a positive int, got {max_items!r}")
        _check_timeout(block, timeout)
        if out is None:
            out = np.empty(max_items, self._dtype)
        else:
            self._check_out(out, max_items)
        buffer = _from_buffer(out)
        # First one C call that does not wait (see put_many); wait only if it found nothing.
        n = _pop(self._q, buffer, max_items, 0)
        if n < 0:
            raise self._error(n)
        if n == 0 and block:
            n = self._move(_pop, buffer, max_items, block, deadline_of(timeout))
        if n == 0:
            raise queue.Empty
        return out[:n]

    def borrow(self, max_items: int, block: bool = True, timeout: float | None = None) -> Borrow:
        """Lend between 1 and `max_items` records where they lie in the queue, with no copy:

            with q.borrow(32) as records:   # a read-only array viewing the queue's slots
                obs = torch.tensor(records["obs"])   # copied out here, once

        Waits and raises like `get_many`, on entering the block. The records are taken
        from the queue as by a get, but their slots stay out of the producers' reach until
        the block ends; then the view (and anything sharing its memory, such as
        `torch.from_numpy` of a field) must not be used again, as the next records
        overwrite it. It may lend fewer records than are ready (a borrow never wraps
        around the queue's ring). One borrow at a time per thread: inside the block, this
        thread's gets and borrows on the same queue raise RuntimeError, and its puts
        may wait for the slots it holds. The block must end on the thread that began
        it. A process that dies inside the block loses the records, as a consumer dying
        inside a get does (`stats()["lost"]`). With records of 64 B to 1 KiB, borrowing
        moves about what `get_many` moves (the copy it saves stays in the cache); it pays
        for large records, such as a learner's batch of image fragments."""
        if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 1:
            raise ValueError(f"max_items must be a positive int, got {max_items!r}")
        _check_timeout(block, timeout)
        return Borrow(self, int(max_items), block, timeout)

    def _lend(self, max_items: int, block: bool, timeout: float | None) -> np.ndarray:
        slot = _new_index("uint64_t *")
        # First one C call that does not wait (see put_many); wait only if it found nothing.
        n = _borrow_for_move(self._q, slot, max_items, 0)
        if n < 0:
            raise self._error(n)  # no loan made (RQ_BORROWING: this thread's other one stays)
        try:
            if n == 0 and block:
                n = self._move(_borrow_for_move, slot, max_items, block, deadline_of(timeout))
            if n == 0:
                raise queue.Empty
            return self._slots[slot[0]:slot[0] + n]
        except BaseException:
            # This thread held no loan before the first call, so any it holds now is this
            # one, made before the exception came (a KeyboardInterrupt, say): give it back.
            _release(self._q)
            raise

    # ---- closing ----------------------------------------------------------------------

    def close(self) -> None:
        """Refuse later puts and wake every waiter; gets drain what is left, then raise
        `Closed`. In the creating process this also removes the shared memory's name
        (processes already attached keep their mapping)."""
        lib.rq_close(self._q)
        self._segment.unlink()

    def __enter__(self) -> ArrayQueue:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.qsize()}/{self._capacity}"
        return f"ArrayQueue({state}, dtype={self._dtype})"

    # ---- internals --------------------------------------------------------------------

    def _move(self, fn, buffer, n: int, block: bool, until: float | None) -> int:
        """Call rq_push/rq_pop/rq_borrow, waiting in slices until something moved or `until` (a
        time.monotonic() value; None for no limit) has passed; at least one call is made.
        Returns the count moved (0: nothing before `until`)."""
        if not block:
            moved = fn(self._q, buffer, n, 0)
        else:
            while True:
                moved = fn(self._q, buffer, n, wait_slice_ns(until))
                if moved != 0 or (until is not None and time.monotonic() >= until):
                    break
        if moved < 0:
            raise self._error(moved)
        return moved

    def _error(self, code: int) -> Exception:
        if code == lib.RQ_CLOSED:
            return Closed("the queue is closed" + (" and drained" if self.qsize() == 0 else ""))
        if code == lib.RQ_TOO_MANY_PRODUCERS:
            return RuntimeError(
                f"more than {MAX_PRODUCERS} threads are putting into this queue at once; "
                "use fewer producer threads or processes"
            )
        if code == lib.RQ_BORROWING:
            return RuntimeError(
                "this thread holds records borrowed from this queue: get or borrow again "
                "after its `with queue.borrow(...)` block ends"
            )
        if code == lib.RQ_TOO_MANY_CONSUMERS:
            return RuntimeError(
                f"more than {MAX_CONSUMERS} threads are getting from this queue at once; "
                "use fewer consumer threads or processes"
            )
        return RuntimeError(f"queue error {code}")

    _NOUN, _ROWS = "queue", "max_items"

    def _records(self, items) -> np.ndarray:
        self._check_array(items, "put_many's items")
        return np.ascontiguousarray(items)
