"""replay: a lock-free bounded queue of numpy records, replay buffers that sample them
(uniform and prioritized), and atomic counters, in shared memory, for threads and
processes. Needs only numpy and cffi.

    >>> import numpy as np
    >>> from replay import ArrayQueue
    >>> q = ArrayQueue(1024, [("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4")])
    >>> q.put((np.zeros(4), 1, 0.5))
    >>> float(q.get()["reward"])
    0.5

    >>> from replay import PrioritizedReplayBuffer
    >>> buf = PrioritizedReplayBuffer(100_000, q.dtype, alpha=0.6)
    >>> first = buf.add_many(np.zeros(64, q.dtype))
    >>> batch = buf.sample(32, beta=0.4)  # records, indices (positions), weights
    >>> buf.update_priorities(batch.indices, np.ones(32))
    32
"""
from queue import Empty, Full

from ._shm import SharedMemoryFull, remove_stale_segments
from .buffer import PrioritizedReplayBuffer, PrioritizedSample, ReplayBuffer
from .counters import Counters
from .queue import MAX_CAPACITY, MAX_RECORD_BYTES, ArrayQueue, Closed

__all__ = [
    "ArrayQueue",
    "Closed",
    "Counters",
    "Empty",
    "Full",
    "MAX_CAPACITY",
    "MAX_RECORD_BYTES",
    "PrioritizedReplayBuffer",
    "PrioritizedSample",
    "ReplayBuffer",
    "SharedMemoryFull",
    "remove_stale_segments",
]
