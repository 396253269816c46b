"""A model test: random sequences of add, add_many and seeded sample calls run against
ReplayBuffer and against a slow Python reference written from the description in
native/README.md ("Replay buffers"): a ring indexed by position, xoshiro256** seeded by
splitmix64, Lemire's multiply-shift for a bounded draw, candidates drawn in groups of 16,
retries then a census scan when records are used up (max_times_sampled), the
sample-to-insert limiter, and a batch that cannot be drawn whole taking nothing. In one thread
every draw is determined by the seed, so the records, positions and counters must match
exactly.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import replay
from replay import ReplayBuffer

VALUE = np.dtype([("v", "i8")])
MASK = 2**64 - 1
MAX_REJECTS, CENSUS_ROUNDS, GROUP = 64, 4, 16


class Xoshiro:
    """xoshiro256** (Blackman and Vigna), seeded as rb_seed does."""

    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed = (seed + 0x9E3779B97F4A7C15) & MASK
            z = seed
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
            self.s.append(z ^ (z >> 31))

    @staticmethod
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK

    def next(self):
        s = self.s
        result = (self.rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self.rotl(s[3], 45)
        return result

    def below(self, n):
        return (self.next() * n) >> 64

    def unit(self):
        return (self.next() >> 11) * 2.0**-53


class Reference:
    def __init__(self, capacity, max_times_sampled, samples_per_insert, error_buffer, min_size):
        self.capacity, self.mts = capacity, max_times_sampled
        self.spi, self.eb, self.min_size = samples_per_insert, error_buffer, min_size
        self.slots = {}  # slot -> (position, value)
        self.uses = {}  # position -> draws so far
        self.claimed = self.added = self.sampled = 0

    def add_many(self, vals):
        first, n = self.claimed, len(vals)
        self.claimed += n
        for i in range(max(0, n - self.capacity), n):
            p = first + i
            self.slots[p % self.capacity] = (p, vals[i])
            self.uses[p] = 0
        self.added += n
        return first

    def __len__(self):
        return len(self.slots)

    def _drawable(self, p):
        held = self.slots.get(p % self.capacity)
        return held is not None and held[0] == p and (not self.mts or self.uses[p] < self.mts)

    def _window(self, recent):
        span = recent if recent and recent < self.capacity else self.capacity
        return max(0, self.claimed - span), self.claimed

    def _draw(self, rng, recent):
        for attempt in range(MAX_REJECTS):
            if attempt % 16 == 0:
                lo, hi = self._window(recent)
            if hi == lo:
                return None
            p = lo + rng.below(hi - lo)
            if self._drawable(p):
                return self._take(p)
        for _ in range(CENSUS_ROUNDS):
            lo, hi = self._window(recent)
            total = sum(1.0 for q in range(lo, hi) if self._drawable(q))
            if not total > 0:
                return None
            u = rng.unit() * total
            for q in range(lo, hi):
                if self._drawable(q):
                    if u < 1.0:
                        return self._take(q)
                    u -= 1.0
        return None

    def _take(self, p):
        self.uses[p] += 1
        return p, self.slots[p % self.capacity][1]

    def sample(self, n, recent, seed):
        """(positions, values) of a full batch, or None where sample raises Empty."""
        if self.added < self.min_size or self.added == 0:
            return None
        if self.spi and self.sampled + n > self.spi * (self.added - self.min_size) + self.eb:
            return None
        rng, got, uses_before = Xoshiro(seed), [], dict(self.uses)
        while len(got) < n:  # in groups of GROUP candidates, replaced by a full draw if refused
            lo, hi = self._window(recent)
            if hi == lo:
                break
            candidates = [lo + rng.below(hi - lo) for _ in range(min(GROUP, n - len(got)))]
            for p in candidates:
                drawn = self._take(p) if self._drawable(p) else self._draw(rng, recent)
                if drawn is None:
                    break
                got.append(drawn)
            else:
                continue
            break
        if len(got) < n:  # all or nothing: a batch that falls short gives its draws back
            self.uses = uses_before
            return None
        self.sampled += n
        return got


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 10**6)),
    st.tuples(st.just("add_many"), st.integers(0, 12)),
    st.tuples(st.just("sample"), st.integers(1, 40), st.none() | st.integers(1, 6),
              st.integers(0, 2**64 - 1)),
)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 6),
       max_times_sampled=st.none() | st.integers(1, 3),
       limiter=st.none() | st.tuples(st.sampled_from([0.5, 1.0, 3.0]), st.sampled_from([None, 0.0, 5.0]),
                                      st.integers(1, 4)),
       operations=st.lists(operation, max_size=25))
def test_add_and_seeded_sample_sequences_match_the_reference(capacity, max_times_sampled, limiter,
                                                           operations):
    spi, eb, min_size = limiter if limiter else (None, None, 1)
    with ReplayBuffer(capacity, VALUE, max_times_sampled=max_times_sampled, samples_per_insert=spi,
                      error_buffer=eb, min_size_to_sample=min_size) as buf:
        ref = Reference(capacity, max_times_sampled or 0, spi or 0.0,
                        (2 * max(1.0, spi) if eb is None else eb) if spi else 0.0, min_size)
        next_value = 0
        for op in operations:
            if op[0] == "add":
                assert buf.add((op[1],)) == ref.add_many([op[1]])
            elif op[0] == "add_many":
                vals = list(range(next_value, next_value + op[1]))
                next_value += op[1]
                items = np.array([(v,) for v in vals], VALUE)
                assert buf.add_many(items) == ref.add_many(vals)
            else:
                _, n, recent, seed = op
                recent = min(recent, capacity) if recent else None
                expected = ref.sample(n, recent, seed)
                if expected is None:
                    try:
                        buf.sample(n, recent=recent, rng=seed, timeout=0)
                    except replay.Empty:
                        pass
                    else:
                        raise AssertionError("sample drew a batch the reference could not")
                else:
                    records, positions = buf.sample(n, recent=recent, rng=seed, timeout=0,
                                                    return_indices=True)
                    assert positions.tolist() == [p for p, _ in expected]
                    assert records["v"].tolist() == [v for _, v in expected]
            assert (len(buf), buf.added, buf.sampled) == (len(ref), ref.added, ref.sampled)
