"""ArrayQueue against a model: a collections.deque, a capacity and a closed flag.

Hypothesis drives random sequences of the non-blocking operations (borrow included) and
close at small capacities, and every result, including which exception is raised
(queue.Full, queue.Empty, replay.Closed), must match the model.
"""
import queue
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from replay import ArrayQueue, Closed


class QueueModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.q = None
        self.model = deque()
        self.capacity = 0
        self.closed = False
        self.next_value = 0  # every value put is new, so a duplicate or a loss shows
        self.taken = 0  # values taken so far: where the queue's ring starts

    @initialize(capacity=st.integers(1, 5))
    def make_queue(self, capacity):
        self.q = ArrayQueue(capacity, "i8")
        self.capacity = capacity

    def fresh(self, n):
        values = np.arange(self.next_value, self.next_value + n, dtype="i8")
        self.next_value += n
        return values

    def popleft(self):
        self.taken += 1
        return self.model.popleft()

    def expected_error(self, putting):
        """The exception the model says a call that moves nothing raises."""
        if putting:
            return Closed if self.closed else queue.Full
        return Closed if self.closed and not self.model else queue.Empty

    @rule()
    def put_nowait(self):
        value = int(self.fresh(1)[0])
        if self.closed or len(self.model) == self.capacity:
            with pytest.raises(self.expected_error(putting=True)):
                self.q.put_nowait(value)
        else:
            self.q.put_nowait(value)
            self.model.append(value)

    @rule()
    def get_nowait(self):
        if self.model:
            assert self.q.get_nowait() == self.popleft()
        else:
            with pytest.raises(self.expected_error(putting=False)):
                self.q.get_nowait()

    @rule(n=st.integers(0, 7))
    def put_many_without_blocking(self, n):
        values = self.fresh(n)
        room = self.capacity - len(self.model)
        if n == 0:
            assert self.q.put_many(values, block=False) == 0  # nothing to put: no error
        elif self.closed or room == 0:
            with pytest.raises(self.expected_error(putting=True)):
                self.q.put_many(values, block=False)
        else:
            put = min(n, room)
            assert self.q.put_many(values, block=False) == put
            self.model.extend(values[:put].tolist())

    @rule(max_items=st.integers(1, 7), into_out=st.booleans())
    def get_many_without_blocking(self, max_items, into_out):
        out = np.full(max_items + 1, -1, "i8") if into_out else None
        if self.model:
            got = self.q.get_many(max_items, block=False, out=out)
            expected = [self.popleft() for _ in range(min(max_items, len(self.model)))]
            assert got.tolist() == expected
            if into_out:
                assert got.base is out
        else:
            with pytest.raises(self.expected_error(putting=False)):
                self.q.get_many(max_items, block=False, out=out)

    @rule(max_items=st.integers(1, 7), extra=st.integers(0, 7))
    def borrow_without_blocking(self, max_items, extra):
        """Lent: the values next in line, up to the end of the ring. While lent, their
        slots stay full: a put finds only the room there was before the borrow."""
        if not self.model:
            with pytest.raises(self.expected_error(putting=False)):
                with self.q.borrow(max_items, block=False):
                    pass
            return
        room = self.capacity - len(self.model)
        lent = min(max_items, len(self.model), self.capacity - self.taken % self.capacity)
        expected = [self.popleft() for _ in range(lent)]
        with self.q.borrow(max_items, block=False) as got:
            if extra and not self.closed and room:
                assert self.q.put_many(self.fresh(extra), block=False) == min(extra, room)
                self.model.extend(range(self.next_value - extra, self.next_value - extra + min(extra, room)))
            elif extra:
                with pytest.raises(self.expected_error(putting=True)):
                    self.q.put_many(self.fresh(extra), block=False)
            assert got.tolist() == expected  # the put wrote nothing into the lent slots

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self):
        self.q.close()
        self.closed = True

    @rule()
    def close_again(self):
        if self.closed:
            self.q.close()  # harmless

    @invariant()
    def size_and_flags_match(self):
        if self.q is None:
            return
        n = len(self.model)
        assert len(self.q) == self.q.qsize() == n
        assert self.q.empty() == (n == 0)
        assert self.q.full() == (n == self.capacity)
        assert self.q.closed == self.closed
        assert self.q.stats() == {"full_waits": 0, "empty_waits": 0, "skipped": 0, "lost": 0}

    def teardown(self):
        if self.q is not None:
            self.q.close()


QueueModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_queue_matches_a_deque_model = QueueModel.TestCase
