/*
 * rb: replay buffers in shared memory (uniform and proportional prioritized).
 *
 * A ring of `capacity` slots. A writer claims positions with one fetch-add on the
 * write cursor `claimed`, takes each slot by a compare-and-swap of its stamp, writes
 * the record and publishes it: it never waits for another writer or for a sampler.
 * Samplers draw positions at random (in C, xoshiro256** per handle) and copy records
 * under a per-slot seqlock: stamp, copy, re-check the stamp, and draw again if it
 * changed, so no torn record is ever returned. Prioritized buffers keep a sum tree of
 * priority^alpha next to the slots, updated without a lock: a change is an exchange of
 * the leaf and a delta added to every ancestor with atomic64.h's float add.
 *
 * Prioritized sampling is Schaul et al. 2016, "Prioritized Experience Replay"
 * (arXiv:1511.05952), proportional variant; the reuse limits follow DeepMind Reverb's
 * max_times_sampled and SampleToInsertRatio rate limiter. Step-by-step description,
 * memory orderings and the failure cases: native/README.md, "Replay buffers".
 */
#define _GNU_SOURCE
#include "rb.h"
#include "atomic64.h"
#include "common.h" /* LINE, SLOT_ALIGN, clock, deadlines, spin-then-yield, process_alive */

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RB_MAGIC 0x3146554252504552ull /* "REPRBUF1" */
#define RB_VERSION 2 /* 2: use counts with pending draws */

#ifdef RB_TEST_HOOKS
/* Test builds only (native/stress_rb.c): called after a writer has taken a slot and
 * before it publishes it, so that a test can stop a writer thread there. */
void rb_test_hook(uint64_t pos);
#define TEST_HOOK(pos) rb_test_hook(pos)
#else
#define TEST_HOOK(pos) ((void)0)
#endif

/* A draw that fails (slot being written, overwritten, used up, or an empty part of the
 * tree) is retried; after this many failures in a row a census scan decides. */
#define MAX_REJECTS 64
#define CENSUS_ROUNDS 4
/* Waiting samplers spin, then yield (SPIN_ROUNDS, YIELD_ROUNDS: common.h), then sleep
 * with a doubling nap up to MAX_NAP_NS: writers never wake anyone, so add pays nothing
 * for waiting samplers. */
#define FIRST_NAP_NS 20000ll
#define MAX_NAP_NS 1000000ll

/* common.h asserts that 64-bit atomics are lock-free. */
_Static_assert(sizeof(double) == 8, "a sum-tree node is one 64-bit word");

/*
 * Stamps: one 64-bit word per slot, the seqlock word.
 *   0            empty: nothing was ever published here;
 *   2p + 1       the record of position p is published here;
 *   2 * pid      a writer of process `pid` is writing the slot (pid > 0, so never 0).
 * A published stamp never repeats (positions only grow), so a sampler that reads the
 * same published stamp before and after its copy knows that nobody wrote in between.
 */
#define EMPTY 0ull
static inline uint64_t published(uint64_t p) { return 2 * p + 1; }
static inline bool is_published(uint64_t s) { return s & 1; }
static inline bool is_writing(uint64_t s) { return s != EMPTY && !(s & 1); }
static inline uint64_t position_of(uint64_t s) { return s >> 1; }
static inline uint64_t writing(pid_t pid) { return (uint64_t)(uint32_t)pid << 1; }
static inline pid_t writer_of(uint64_t s) { return (pid_t)(s >> 1); }

/*
 * Use counts (max_times_sampled): tag << 32 | pending << 16 | count.
 *   count    draws of this record returned to callers: it only grows, and the record
 *            retires when it reaches max_times_sampled;
 *   pending  draws held by batches still being drawn: each becomes a count when its
 *            batch is complete, or is given back when the batch fails, so that a failed
 *            sample takes nothing;
 *   tag      the low 32 bits of the position, so that a sampler's change can never land
 *            on the record that replaced the one it drew (that would take 2^32 / capacity
 *            laps of the ring between its read of the stamp and its compare-and-swap).
 * A record may be drawn while count + pending < max_times_sampled <= 65535, so both
 * fields fit in 16 bits.
 */
#define TAG_MASK 0xffffffffull
#define ONE_PENDING (1ull << 16)
static inline uint64_t fresh_uses(uint64_t p) { return (p & TAG_MASK) << 32; }
static inline bool uses_of(uint64_t u, uint64_t p) { return (u >> 32) == (p & TAG_MASK); }
static inline uint64_t count_of(uint64_t u) { return u & 0xffff; }
static inline uint64_t pending_of(uint64_t u) { return (u >> 16) & 0xffff; }
static inline uint64_t held_of(uint64_t u) { return count_of(u) + pending_of(u); }

typedef struct {
    _Atomic uint64_t stamp; /* see above */
    _Atomic uint64_t uses;  /* tag and draw count of the record held */
    /* the record follows at offset 16, as 64-bit words (see store_record) */
} slot_t;
_Static_assert(sizeof(slot_t) == 16, "record words start at offset 16, 8-byte aligned");

typedef struct {
    /* Line 0: written once by rb_init, read-only afterwards. */
    uint64_t magic, version, capacity, record_size, slot_size, prioritized;
    uint64_t leaves, tree_offset, slots_offset, total_bytes;
    double alpha, samples_per_insert, error_buffer;
    uint64_t min_size_to_sample, max_times_sampled;
    char pad0[LINE - 15 * 8];
    /* Line 1: the write cursor, the next position a writer claims. */
    _Atomic uint64_t claimed;
    char pad1[LINE - 8];
    /* Line 2: records published so far, and records held now (writers, after publishing). */
    _Atomic uint64_t added, size;
    char pad2[LINE - 16];
    /* Line 3: records returned by samplers; the rate limiter reserves here. */
    _Atomic uint64_t sampled;
    char pad3[LINE - 8];
    /* Line 4: the largest priority seen (bits of a double), read by every prioritized add. */
    _Atomic uint64_t max_priority;
    char pad4[LINE - 8];
    /* Line 5: the sum tree's guard (high 32 bits: batches begun; low 32 bits: batches
     * in flight) and the schedule of drift-correction passes. */
    _Atomic uint64_t tree_guard, tree_changes, next_pass, tree_passes;
    char pad5[LINE - 32];
    /* Line 6: rare statistics. */
    _Atomic uint64_t dropped, reclaimed;
    char pad6[LINE - 16];
} header_t;

_Static_assert(sizeof(header_t) == 7 * LINE, "header is seven separate lines");
_Static_assert(offsetof(header_t, claimed) == 1 * LINE, "the write cursor on its own line");
_Static_assert(offsetof(header_t, added) == 2 * LINE, "publication counts apart from the cursor");
_Static_assert(offsetof(header_t, sampled) == 3 * LINE, "sampler count apart from writers' lines");
_Static_assert(offsetof(header_t, tree_guard) == 5 * LINE, "tree guard on its own line");

#define GUARD_BEGUN (1ull << 32)
#define GUARD_ACTIVE 0xffffffffull

static inline uint64_t record_words(uint64_t record_size) { return (record_size + 7) / 8; }

static inline slot_t *slot_of(header_t *h, uint64_t index) {
    return (slot_t *)((char *)h + h->slots_offset + index * h->slot_size);
}
static inline _Atomic uint64_t *words_of(slot_t *s) { return (_Atomic uint64_t *)(s + 1); }
static inline _Atomic uint64_t *tree_of(header_t *h) {
    return (_Atomic uint64_t *)((char *)h + h->tree_offset);
}
static inline double node(_Atomic uint64_t *tree, uint64_t i) {
    return f64_from_bits(atomic_load_explicit(&tree[i], memory_order_relaxed));
}

/* ---- layout ---- */

static uint64_t leaves_for(uint64_t capacity) {
    uint64_t n = 1;
    while (n < capacity) n <<= 1;
    return n;
}

static bool config_ok(const rb_config_t *c) {
    return c->capacity >= 1 && c->capacity <= RB_MAX_CAPACITY && c->record_size >= 1 &&
           c->record_size <= RB_MAX_RECORD_SIZE && c->max_times_sampled <= RB_MAX_TIMES_SAMPLED &&
           isfinite(c->alpha) && c->alpha >= 0 && isfinite(c->samples_per_insert) &&
           c->samples_per_insert >= 0 && isfinite(c->error_buffer) && c->error_buffer >= 0 &&
           (c->prioritized == 0 || c->prioritized == 1);
}

static void layout(const rb_config_t *c, uint64_t *tree_offset, uint64_t *slots_offset,
                   uint64_t *slot_size, uint64_t *total) {
    *tree_offset = sizeof(header_t);
    uint64_t tree_bytes = c->prioritized ? 2 * leaves_for(c->capacity) * 8 : 0;
    *slots_offset = round_up(*tree_offset + tree_bytes, LINE);
    *slot_size = round_up(sizeof(slot_t) + 8 * record_words(c->record_size), SLOT_ALIGN);
    *total = *slots_offset + c->capacity * *slot_size;
}

uint64_t rb_bytes(const rb_config_t *c) {
    if (!config_ok(c)) return 0;
    uint64_t tree_offset, slots_offset, slot_size, total;
    layout(c, &tree_offset, &slots_offset, &slot_size, &total);
    return total;
}

/* Empty every slot and zero the tree and the counters (the header's line 0 stays). */
static void reset(header_t *h) {
    memset((char *)h + LINE, 0, sizeof(header_t) - LINE);
    atomic_init(&h->max_priority, f64_to_bits(1.0));
    if (h->prioritized) memset(tree_of(h), 0, 2 * h->leaves * 8);
    for (uint64_t i = 0; i < h->capacity; i++) {
        atomic_init(&slot_of(h, i)->stamp, EMPTY);
        atomic_init(&slot_of(h, i)->uses, 0);
    }
}

int rb_init(void *mem, const rb_config_t *c) {
    if (!config_ok(c)) return RB_BAD_ARGUMENT;
    header_t *h = mem;
    memset(h, 0, sizeof *h);
    h->capacity = c->capacity;
    h->record_size = c->record_size;
    h->prioritized = (uint64_t)c->prioritized;
    h->leaves = leaves_for(c->capacity);
    layout(c, &h->tree_offset, &h->slots_offset, &h->slot_size, &h->total_bytes);
    h->alpha = c->alpha;
    h->samples_per_insert = c->samples_per_insert;
    h->error_buffer = c->error_buffer;
    h->min_size_to_sample = c->min_size_to_sample;
    h->max_times_sampled = c->max_times_sampled;
    reset(h);
    h->version = RB_VERSION;
    /* Release: whoever reads the magic (rb_check, acquire) sees the initialised region. */
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, RB_MAGIC, memory_order_release);
    return RB_OK;
}

int rb_check(const void *mem, uint64_t mem_bytes, const rb_config_t *c) {
    const header_t *h = mem;
    if (mem_bytes < sizeof *h || !config_ok(c)) return RB_BAD_HEADER;
    if (atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != RB_MAGIC ||
        h->version != RB_VERSION || h->capacity != c->capacity ||
        h->record_size != c->record_size || h->prioritized != (uint64_t)c->prioritized ||
        h->alpha != c->alpha || h->max_times_sampled != c->max_times_sampled ||
        h->samples_per_insert != c->samples_per_insert || h->error_buffer != c->error_buffer ||
        h->min_size_to_sample != c->min_size_to_sample || h->total_bytes != rb_bytes(c) ||
        h->total_bytes > mem_bytes)
        return RB_BAD_HEADER;
    return RB_OK;
}

/* ---- records as 64-bit words ----
 * The record bytes are read by samplers while a writer may be overwriting them; the
 * seqlock detects that afterwards. To keep that a race on atomics (defined behaviour,
 * and silent under ThreadSanitizer) rather than a data race, slots hold the record as
 * relaxed 64-bit atomic words; on x86-64 and AArch64 these are plain loads and stores. */

static void store_record(_Atomic uint64_t *dst, const char *src, uint64_t size) {
    uint64_t full = size / 8, w;
    for (uint64_t i = 0; i < full; i++) {
        memcpy(&w, src + 8 * i, 8);
        atomic_store_explicit(&dst[i], w, memory_order_relaxed);
    }
    if (size % 8) {
        w = 0;
        memcpy(&w, src + 8 * full, size % 8);
        atomic_store_explicit(&dst[full], w, memory_order_relaxed);
    }
}

static void load_record(char *dst, _Atomic uint64_t *src, uint64_t size) {
    uint64_t full = size / 8, w;
    for (uint64_t i = 0; i < full; i++) {
        w = atomic_load_explicit(&src[i], memory_order_relaxed);
        memcpy(dst + 8 * i, &w, 8);
    }
    if (size % 8) {
        w = atomic_load_explicit(&src[full], memory_order_relaxed);
        memcpy(dst + 8 * full, &w, size % 8);
    }
}

/* ---- random numbers: xoshiro256** (Blackman and Vigna), seeded by splitmix64 ---- */

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t next64(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

void rb_seed(uint64_t *rng, uint64_t seed) {
    for (int i = 0; i < 4; i++) { /* splitmix64: never an all-zero state */
        uint64_t z = (seed += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        rng[i] = z ^ (z >> 31);
    }
}

/* Uniform in [0, n): Lemire's multiply-shift; its bias is below n / 2^64. */
static inline uint64_t below(uint64_t *rng, uint64_t n) {
    return (uint64_t)(((unsigned __int128)next64(rng) * n) >> 64);
}
/* Uniform in [0, 1), 53 bits. */
static inline double unit(uint64_t *rng) { return (double)(next64(rng) >> 11) * 0x1.0p-53; }

/* ---- writers' process ids, and whether a writer is still alive ----
 * A stamp being written names its writer's process, not its thread: from Python a
 * thread cannot die inside a C call while its process lives (rq.c's registry works per
 * thread because its claims are undone per thread). take_slot asks process_alive
 * (common.h) whether that process still runs. */

static _Atomic pid_t cached_pid;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void forget_pid(void) { atomic_store_explicit(&cached_pid, 0, memory_order_relaxed); }
static void install_atfork(void) { pthread_atfork(NULL, NULL, forget_pid); }

/* getpid() is a system call; the cache is cleared in a forked child (relaxed: the
 * child's handler runs in the thread that reads it next). */
static pid_t my_pid(void) {
    pid_t pid = atomic_load_explicit(&cached_pid, memory_order_relaxed);
    if (pid == 0) {
        pthread_once(&atfork_once, install_atfork);
        pid = getpid();
        atomic_store_explicit(&cached_pid, pid, memory_order_relaxed);
    }
    return pid;
}

/* ---- the sum tree ----
 * Node 1 is the root, node i has children 2i and 2i+1, leaf of slot s is node
 * leaves + s. Each node holds a double (as bits): priority^alpha for a leaf, the sum of
 * its subtree for the others, up to the rounding of concurrent adds. */

/* Begin/end a batch of leaf changes. The guard lets a drift-correction pass see that
 * no change was in flight while it read a node and its children (see correct_drift).
 * Relaxed RMW then a release fence: a pass that reads any node value this batch writes
 * afterwards also sees the begun count move (the seqlock writer's pattern). */
static void tree_begin(header_t *h) {
    atomic_fetch_add_explicit(&h->tree_guard, GUARD_BEGUN + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}
/* Release: a pass that acquires a guard with nothing in flight sees every node
 * change of the batches that ended. */
static void tree_end(header_t *h, uint64_t changes) {
    atomic_fetch_sub_explicit(&h->tree_guard, 1, memory_order_release);
    if (changes) atomic_fetch_add_explicit(&h->tree_changes, changes, memory_order_relaxed);
}

static void propagate(header_t *h, uint64_t slot, double delta) {
    if (delta == 0) return;
    _Atomic uint64_t *tree = tree_of(h);
    for (uint64_t i = (h->leaves + slot) >> 1; i >= 1; i >>= 1) atomic_add_f64(&tree[i], delta);
}

/* Set the leaf of `slot` to `value` and add the difference to its ancestors. The
 * exchange returns the value it replaced, so concurrent changes of one leaf add up to
 * the last value: each propagates exactly the step it made. acq_rel: see set_leaf_of. */
static double set_leaf(header_t *h, uint64_t slot, double value) {
    uint64_t old = atomic_exchange_explicit(&tree_of(h)[h->leaves + slot], f64_to_bits(value),
                                            memory_order_acq_rel);
    propagate(h, slot, value - f64_from_bits(old));
    return f64_from_bits(old);
}

/*
 * Set the leaf of the record at position p, unless its slot holds another record.
 * 1. Check that the slot still holds p (acquire: pairs with the publication).
 * 2. Exchange the leaf (acq_rel) and propagate.
 * 3. Check again. A writer that took the slot sets the new record's leaf (an acq_rel
 *    exchange, after the release fence that follows its claim). If our exchange came
 *    after the writer's, our acquire makes its claim visible, so this check fails and
 *    we put the writer's value back, unless something changed the leaf since. If ours
 *    came first, the writer's exchange replaces our value and propagates the step.
 */
static bool set_leaf_of(header_t *h, uint64_t slot, uint64_t p, double value) {
    slot_t *s = slot_of(h, slot);
    if (atomic_load_explicit(&s->stamp, memory_order_acquire) != published(p)) return false;
    double old = set_leaf(h, slot, value);
    if (atomic_load_explicit(&s->stamp, memory_order_acquire) == published(p)) return true;
    uint64_t mine = f64_to_bits(value);
    if (atomic_compare_exchange_strong_explicit(&tree_of(h)[h->leaves + slot], &mine,
                                                f64_to_bits(old), memory_order_acq_rel,
                                                memory_order_relaxed))
        propagate(h, slot, old - value);
    return false;
}

/*
 * One drift-correction pass. Concurrent float adds round, so a node drifts from the sum
 * of its children by a few ulps per add. For each internal node, bottom-up: read the
 * guard (acquire), the node and its two children, then the guard again after an acquire
 * fence (the seqlock reader's pattern). If no batch was in flight and none began, the
 * three values are one consistent state, so `left + right - node` is exactly the
 * node's rounding error; add its opposite with the atomic add, which composes with any
 * change that starts later. Nodes read while a batch was in flight are left for the
 * next pass.
 */
static void correct_drift(header_t *h) {
    _Atomic uint64_t *tree = tree_of(h);
    for (uint64_t i = h->leaves - 1; i >= 1; i--) {
        uint64_t g1 = atomic_load_explicit(&h->tree_guard, memory_order_acquire);
        if (g1 & GUARD_ACTIVE) continue;
        double left = node(tree, 2 * i), right = node(tree, 2 * i + 1), self = node(tree, i);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&h->tree_guard, memory_order_relaxed) != g1) continue;
        double error = left + right - self;
        if (error != 0) atomic_add_f64(&tree[i], error);
    }
    atomic_fetch_add_explicit(&h->tree_passes, 1, memory_order_relaxed);
}

/* A pass after every max(leaves, 65536) leaf changes, run by the caller of
 * rb_update_priorities that crosses the mark (amortised O(1) per change; never a writer).
 * One pass at a time: next_pass holds PASS_RUNNING meanwhile, so two passes never both
 * correct a node from the same reading. */
#define PASS_RUNNING UINT64_MAX
static void maybe_correct_drift(header_t *h) {
    uint64_t every = h->leaves > 65536 ? h->leaves : 65536;
    uint64_t changes = atomic_load_explicit(&h->tree_changes, memory_order_relaxed);
    uint64_t next = atomic_load_explicit(&h->next_pass, memory_order_relaxed);
    if (changes < next ||
        !atomic_compare_exchange_strong_explicit(&h->next_pass, &next, PASS_RUNNING,
                                                 memory_order_relaxed, memory_order_relaxed))
        return;
    correct_drift(h);
    atomic_store_explicit(&h->next_pass, changes + every, memory_order_relaxed);
}

static void raise_max_priority(header_t *h, double priority) {
    uint64_t old = atomic_load_explicit(&h->max_priority, memory_order_relaxed);
    while (priority > f64_from_bits(old) &&
           !atomic_compare_exchange_weak_explicit(&h->max_priority, &old, f64_to_bits(priority),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/* ---- add ---- */

/*
 * Take slot s for position p. Returns false when the record must be dropped instead:
 * a live writer is still writing the slot (it was lapped: capacity records were claimed
 * while it wrote one), or a later position is already published there. A slot whose
 * writer died is taken back. Acquire on success: the previous writer's record words
 * come before ours in each word's modification order.
 */
static bool take_slot(slot_t *s, uint64_t p, pid_t me, bool *overwrote, bool *reclaimed) {
    uint64_t old = atomic_load_explicit(&s->stamp, memory_order_relaxed);
    for (;;) {
        bool dead = false;
        if (is_writing(old)) {
            pid_t writer = writer_of(old);
            if (writer == me || process_alive(writer)) return false;
            dead = true;
        } else if (is_published(old) && position_of(old) > p) {
            return false;
        }
        if (atomic_compare_exchange_weak_explicit(&s->stamp, &old, writing(me),
                                                  memory_order_acquire, memory_order_relaxed)) {
            *overwrote = is_published(old);
            *reclaimed = dead;
            return true;
        }
    }
}

uint64_t rb_add(void *mem, const void *records, uint64_t n) {
    header_t *h = mem;
    /* 1. Claim positions [first, first + n) with one fetch-add. Relaxed: samplers only
     *    use the cursor to bound their draws; each record is handed over by its stamp. */
    uint64_t first = atomic_fetch_add_explicit(&h->claimed, n, memory_order_relaxed);
    if (n == 0) return first;
    /* Of a batch longer than the ring, the first records would be overwritten by the
     * batch itself: they count as added and displaced at once. */
    uint64_t skip = n > h->capacity ? n - h->capacity : 0;
    pid_t me = my_pid();
    double leaf = 0;
    if (h->prioritized) {
        leaf = pow(f64_from_bits(atomic_load_explicit(&h->max_priority, memory_order_relaxed)),
                   h->alpha);
        tree_begin(h);
    }
    uint64_t done = 0, overwritten = 0, lost = 0, reclaimed = 0;
    for (uint64_t i = skip; i < n; i++) {
        uint64_t p = first + i, index = p % h->capacity;
        slot_t *s = slot_of(h, index);
        bool overwrote, dead;
        /* 2. Take the slot: its stamp now says "being written by this process". */
        if (!take_slot(s, p, me, &overwrote, &dead)) {
            lost++;
            continue;
        }
        overwritten += overwrote;
        reclaimed += dead;
        /* 3. Release fence: a sampler that reads any word we write below and then fences
         *    (acquire) sees the stamp change of step 2, so its re-check fails. */
        atomic_thread_fence(memory_order_release);
        TEST_HOOK(p);
        /* 4. Write the record and its fresh use count (relaxed; published by step 6). */
        store_record(words_of(s), (const char *)records + i * h->record_size, h->record_size);
        atomic_store_explicit(&s->uses, fresh_uses(p), memory_order_relaxed);
        /* 5. Prioritized: the new record's leaf gets the largest priority seen. */
        if (h->prioritized) set_leaf(h, index, leaf);
        /* 6. Publish. Release: the record, its use count and its leaf happen before a
         *    sampler's acquire load of the stamp. A plain store: only this process can
         *    move the stamp away from "being written by me" while it lives. */
        atomic_store_explicit(&s->stamp, published(p), memory_order_release);
        done++;
    }
    if (h->prioritized) tree_end(h, done);
    /* 7. Counters, once per batch (relaxed: statistics and the limiter's input; a
     *    sampler never relies on them to read a record). */
    atomic_fetch_add_explicit(&h->added, done + skip, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->size, done - overwritten, memory_order_relaxed); /* mod 2^64 */
    if (lost) atomic_fetch_add_explicit(&h->dropped, lost, memory_order_relaxed);
    if (reclaimed) atomic_fetch_add_explicit(&h->reclaimed, reclaimed, memory_order_relaxed);
    return first;
}

/* ---- sample ---- */

#define ANY UINT64_MAX

/* True if slot `index` holds a published record (position `want`, or any when ANY)
 * that may still be drawn. */
static bool drawable(header_t *h, uint64_t index, uint64_t want, uint64_t *pos) {
    slot_t *s = slot_of(h, index);
    uint64_t stamp = atomic_load_explicit(&s->stamp, memory_order_acquire);
    if (!is_published(stamp) || (want != ANY && position_of(stamp) != want)) return false;
    *pos = position_of(stamp);
    if (h->max_times_sampled) {
        uint64_t u = atomic_load_explicit(&s->uses, memory_order_relaxed);
        if (!uses_of(u, *pos) || held_of(u) >= h->max_times_sampled) return false;
    }
    return true;
}

/* Hold one draw of position p against max_times_sampled (pending + 1). False if its
 * draws are used up or held by others, or the slot holds another record by now. Relaxed
 * throughout: the use word orders nothing else; the record's words are read under the
 * seqlock, and its stamp, not this word, says whose record it is. */
static bool hold_use(header_t *h, uint64_t index, uint64_t p) {
    _Atomic uint64_t *uses = &slot_of(h, index)->uses;
    uint64_t u = atomic_load_explicit(uses, memory_order_relaxed);
    do {
        if (!uses_of(u, p) || held_of(u) >= h->max_times_sampled) return false;
    } while (!atomic_compare_exchange_weak_explicit(uses, &u, u + ONE_PENDING,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

/* Settle one held draw of position p: `keep` turns it into a count (pending - 1,
 * count + 1), else it is given back (pending - 1). Nothing to do if the slot holds
 * another record by now: the writer reset the word. Returns true when this draw was
 * the record's last (count reached max_times_sampled): exactly one settler sees that,
 * since counts never go down. */
static bool settle_use(header_t *h, uint64_t index, uint64_t p, bool keep) {
    _Atomic uint64_t *uses = &slot_of(h, index)->uses;
    uint64_t u = atomic_load_explicit(uses, memory_order_relaxed), next;
    do {
        if (!uses_of(u, p) || pending_of(u) == 0) return false;
        next = u - ONE_PENDING + (keep ? 1 : 0);
    } while (!atomic_compare_exchange_weak_explicit(uses, &u, next, memory_order_relaxed,
                                                    memory_order_relaxed));
    return keep && count_of(next) >= h->max_times_sampled;
}

/*
 * The seqlock read of one slot into `out`:
 * 1. load the stamp (acquire: pairs with the publication, so the words we copy are at
 *    least that record's);
 * 2. copy the words (relaxed);
 * 3. acquire fence, then load the stamp again: if a writer wrote any word we copied,
 *    its claim (before its release fence) is visible here and the stamp differs.
 * Then hold the draw (max_times_sampled). The stamp equal before and after means the
 * copy is one record.
 */
static bool take(header_t *h, uint64_t index, uint64_t want, char *out, uint64_t *pos) {
    slot_t *s = slot_of(h, index);
    if (!drawable(h, index, want, pos)) return false;
    uint64_t stamp = published(*pos);
    load_record(out, words_of(s), h->record_size);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s->stamp, memory_order_relaxed) != stamp) return false;
    return !h->max_times_sampled || hold_use(h, index, *pos);
}

enum { TAKEN, RETRY, NONE };

/* The window of positions a uniform draw chooses from: the last `capacity` claimed, or
 * the last `recent`. */
static void window(header_t *h, uint64_t recent, uint64_t *lo, uint64_t *hi) {
    *hi = atomic_load_explicit(&h->claimed, memory_order_relaxed);
    uint64_t span = recent && recent < h->capacity ? recent : h->capacity;
    *lo = *hi > span ? *hi - span : 0;
}

/* Census: after MAX_REJECTS failed draws, count what can be drawn; NONE if nothing,
 * else draw among those (uniformly, or by leaf for prioritized buffers) by a scan.
 * *sum is the scan's total, which the draw's probability is taken against. */
static int census(header_t *h, uint64_t *rng, uint64_t recent, char *out, uint64_t *pos,
                  double *leaf, double *sum) {
    uint64_t lo, hi, p;
    double total = 0;
    _Atomic uint64_t *tree = h->prioritized ? tree_of(h) : NULL;
    window(h, recent, &lo, &hi);
    for (uint64_t q = lo; q < hi; q++) {
        uint64_t index = q % h->capacity;
        if (!drawable(h, index, h->prioritized ? ANY : q, &p)) continue;
        total += tree ? node(tree, h->leaves + index) : 1.0;
    }
    if (!(total > 0)) return NONE;
    *sum = total;
    double u = unit(rng) * total;
    for (uint64_t q = lo; q < hi; q++) {
        uint64_t index = q % h->capacity;
        if (!drawable(h, index, h->prioritized ? ANY : q, &p)) continue;
        double w = tree ? node(tree, h->leaves + index) : 1.0;
        if (u < w) {
            *leaf = w;
            return take(h, index, h->prioritized ? ANY : q, out, pos) ? TAKEN : RETRY;
        }
        u -= w;
    }
    return RETRY; /* things moved between the two scans */
}

static int draw_uniform(header_t *h, uint64_t *rng, uint64_t lo, uint64_t hi, char *out,
                        uint64_t *pos) {
    uint64_t p = lo + below(rng, hi - lo);
    return take(h, p % h->capacity, p, out, pos) ? TAKEN : RETRY;
}

/*
 * Descend from the root: at each node go left if u < left child's sum, else subtract
 * it and go right. log2(leaves) steps whatever the sums say, so it always ends. With
 * sums briefly inconsistent it may end on a leaf past the capacity or of priority 0
 * (an empty, overwritten or used-up slot): that draw is refused and retried. A leaf
 * with priority is then read under the seqlock like any uniform draw.
 */
static int draw_prioritized(header_t *h, uint64_t *rng, char *out, uint64_t *pos,
                            double *leaf, double *total) {
    _Atomic uint64_t *tree = tree_of(h);
    *total = node(tree, 1);
    if (!(*total > 0) || !isfinite(*total)) return RETRY;
    double u = unit(rng) * *total;
    uint64_t i = 1;
    while (i < h->leaves) {
        double left = node(tree, 2 * i);
        if (u < left) {
            i = 2 * i;
        } else {
            u -= left;
            i = 2 * i + 1;
        }
    }
    uint64_t index = i - h->leaves;
    if (index >= h->capacity) return RETRY;
    *leaf = node(tree, i);
    if (!(*leaf > 0)) return RETRY;
    return take(h, index, ANY, out, pos) ? TAKEN : RETRY;
}

/* One record into out; false if nothing can be drawn. */
static bool draw(header_t *h, uint64_t *rng, char *out, uint64_t *pos, double *probability,
                 uint64_t recent) {
    uint64_t lo = 0, hi = 0;
    double leaf = 0, total = 0;
    int result = RETRY;
    for (int attempt = 0; attempt < MAX_REJECTS; attempt++) {
        if (h->prioritized) {
            result = draw_prioritized(h, rng, out, pos, &leaf, &total);
        } else {
            if (attempt % 16 == 0) window(h, recent, &lo, &hi); /* writers move it */
            if (hi == lo) return false;
            result = draw_uniform(h, rng, lo, hi, out, pos);
        }
        if (result == TAKEN) break;
    }
    for (int round = 0; result != TAKEN && round < CENSUS_ROUNDS; round++) {
        result = census(h, rng, recent, out, pos, &leaf, &total);
        if (result == NONE) return false;
    }
    if (result != TAKEN) return false;
    /* leaf > 0 and total > 0 here; a root read while a concurrent change was halfway up
     * the tree may be below the leaf: clamp. */
    if (probability) *probability = leaf < total ? leaf / total : 1.0;
    return true;
}

/*
 * Rate limiter (Reverb's SampleToInsertRatio, samples side only): a batch of n may go
 * ahead while sampled + n <= samples_per_insert * (added - min_size) + error_buffer, and
 * never before min_size_to_sample records were added. The CAS reserves the n draws, so
 * concurrent samplers cannot pass the limit together; a stale `added` is only stricter
 * (it only grows).
 */
static bool reserve(header_t *h, uint64_t n) {
    uint64_t added = atomic_load_explicit(&h->added, memory_order_relaxed);
    if (added < h->min_size_to_sample || added == 0) return false;
    if (h->samples_per_insert == 0) return true;
    double allowed = h->samples_per_insert * ((double)added - (double)h->min_size_to_sample) +
                     h->error_buffer;
    uint64_t sampled = atomic_load_explicit(&h->sampled, memory_order_relaxed);
    do {
        if ((double)(sampled + n) > allowed) return false;
    } while (!atomic_compare_exchange_weak_explicit(&h->sampled, &sampled, sampled + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

/*
 * Uniform draws in groups: draw GROUP positions, prefetch their slots, then read them.
 * In a ring larger than the caches each read is a cache miss; issued together, the
 * misses overlap instead of following one another. A refused candidate is replaced by a
 * full draw() (retries, census). Returns the count drawn.
 */
#define GROUP 16
static uint64_t draw_uniform_batch(header_t *h, uint64_t *rng, char *out, uint64_t *positions,
                                   uint64_t n, uint64_t recent) {
    uint64_t k = 0, candidates[GROUP], lines = h->slot_size > 256 ? 4 : h->slot_size / 64;
    while (k < n) {
        uint64_t m = n - k < GROUP ? n - k : GROUP, lo, hi;
        window(h, recent, &lo, &hi);
        if (hi == lo) return k;
        for (uint64_t i = 0; i < m; i++) {
            candidates[i] = lo + below(rng, hi - lo);
            char *slot = (char *)slot_of(h, candidates[i] % h->capacity);
            for (uint64_t line = 0; line < lines; line++) __builtin_prefetch(slot + 64 * line);
        }
        for (uint64_t i = 0; i < m; i++, k++) {
            char *dst = out + k * h->record_size;
            if (!take(h, candidates[i] % h->capacity, candidates[i], dst, &positions[k]) &&
                !draw(h, rng, dst, &positions[k], NULL, recent))
                return k;
        }
    }
    return k;
}

/*
 * Prioritized draws in groups, for the same reason, and with the descents interleaved:
 * 1. read the root once for the group: every draw of the group descends against it, and
 *    its probability is taken against it;
 * 2. draw GROUP numbers u in [0, root) and descend with all of them one level at a time.
 *    The GROUP descents do not depend on each other, so the loads of one level are in
 *    flight together instead of one after another (17 dependent loads each for 100 000
 *    records). The step is written without a branch: a branch on random data mispredicts
 *    half the time, and with the descents interleaved nothing is gained by guessing;
 * 3. refuse a leaf past the capacity or of priority 0 (as draw_prioritized does), and
 *    prefetch the slots of the others;
 * 4. read each candidate under the seqlock (take); a refused one is replaced by a full
 *    draw() (retries, census), as for uniform groups.
 * Returns the count drawn.
 */
static uint64_t draw_prioritized_batch(header_t *h, uint64_t *rng, char *out,
                                       uint64_t *positions, double *probabilities, uint64_t n) {
    _Atomic uint64_t *tree = tree_of(h);
    uint64_t k = 0, node_of[GROUP], lines = h->slot_size > 256 ? 4 : h->slot_size / 64;
    double u[GROUP], leaf[GROUP];
    while (k < n) {
        uint64_t m = n - k < GROUP ? n - k : GROUP;
        char *dst = out + k * h->record_size;
        double total = node(tree, 1);
        if (!(total > 0) || !isfinite(total)) { /* empty or moving: one full draw decides */
            if (!draw(h, rng, dst, &positions[k], &probabilities[k], 0)) return k;
            k++;
            continue;
        }
        for (uint64_t j = 0; j < m; j++) {
            u[j] = unit(rng) * total;
            node_of[j] = 1;
        }
        for (uint64_t level = 1; level < h->leaves; level <<= 1) {
            for (uint64_t j = 0; j < m; j++) {
                /* As draw_prioritized: go left iff u < left, else subtract left and go
                 * right. The subtraction is of left's bits masked to +0.0 when going
                 * left (u - 0.0 is u), so that no compiler turns it into a branch. */
                uint64_t left = atomic_load_explicit(&tree[2 * node_of[j]], memory_order_relaxed);
                bool right = !(u[j] < f64_from_bits(left));
                u[j] -= f64_from_bits(left & -(uint64_t)right);
                node_of[j] = 2 * node_of[j] + right;
            }
        }
        for (uint64_t j = 0; j < m; j++) {
            uint64_t index = node_of[j] - h->leaves;
            leaf[j] = index < h->capacity ? node(tree, node_of[j]) : 0.0;
            if (!(leaf[j] > 0)) continue; /* refused: replaced by a full draw below */
            char *slot = (char *)slot_of(h, index);
            for (uint64_t line = 0; line < lines; line++) __builtin_prefetch(slot + 64 * line);
        }
        for (uint64_t j = 0; j < m; j++, k++) {
            dst = out + k * h->record_size;
            if (leaf[j] > 0 && take(h, node_of[j] - h->leaves, ANY, dst, &positions[k])) {
                /* leaf > 0, total > 0; a root read before a change reached it may be
                 * below the leaf: clamp, as draw() does. */
                probabilities[k] = leaf[j] < total ? leaf[j] / total : 1.0;
            } else if (!draw(h, rng, dst, &positions[k], &probabilities[k], 0)) {
                return k;
            }
        }
    }
    return k;
}

/*
 * Settle every draw of a batch (max_times_sampled): kept when the batch is complete,
 * given back when it is not. A prioritized record whose last draw is kept leaves the
 * sum tree now, so that draws stop landing on it. Only a kept draw retires a record, and
 * a kept draw is never given back, so a record leaves the tree once, and only when its
 * draws were all returned to callers; a record held by a batch that fails stays in the
 * tree throughout (draws that land on it meanwhile are refused and drawn again).
 */
static void settle_batch(header_t *h, const uint64_t *positions, uint64_t k, bool keep) {
    bool tree = h->prioritized && keep;
    if (tree) tree_begin(h);
    uint64_t retired = 0;
    for (uint64_t i = 0; i < k; i++) {
        uint64_t p = positions[i], index = p % h->capacity;
        if (settle_use(h, index, p, keep) && tree) retired += set_leaf_of(h, index, p, 0.0);
    }
    if (tree) tree_end(h, retired);
}

/*
 * One try at a whole batch: n records, or nothing taken. The rate limiter's reservation
 * (or, without one, the count of records returned) and each record's draws become final
 * only when all n are drawn; a try that falls short gives everything back.
 */
static int64_t try_sample(header_t *h, uint64_t *rng, char *out, uint64_t *positions,
                          double *probabilities, uint64_t n, uint64_t recent) {
    if (!reserve(h, n)) return 0;
    uint64_t k = h->prioritized ? draw_prioritized_batch(h, rng, out, positions, probabilities, n)
                                : draw_uniform_batch(h, rng, out, positions, n, recent);
    bool complete = k == n;
    if (h->max_times_sampled) settle_batch(h, positions, k, complete);
    /* sampled counts records returned: give back the reservation, or count the batch. */
    if (h->samples_per_insert != 0 && !complete)
        atomic_fetch_sub_explicit(&h->sampled, n, memory_order_relaxed);
    else if (h->samples_per_insert == 0 && complete)
        atomic_fetch_add_explicit(&h->sampled, n, memory_order_relaxed);
    return complete ? (int64_t)n : 0;
}

/* One round of a sampler's wait: spin, then yield (keep_spinning, common.h), then a nap
 * of FIRST_NAP_NS doubling each round up to MAX_NAP_NS, never past the deadline. */
static void pause_round(int round, int64_t deadline) {
    if (keep_spinning(round)) return;
    int shift = round - SPIN_ROUNDS - YIELD_ROUNDS;
    int64_t nap = shift >= 6 ? MAX_NAP_NS : FIRST_NAP_NS << shift;
    if (nap > MAX_NAP_NS) nap = MAX_NAP_NS;
    if (deadline >= 0) {
        int64_t left = deadline - now_ns();
        if (left < nap) nap = left > 0 ? left : 0;
    }
    struct timespec ts = {nap / 1000000000ll, nap % 1000000000ll};
    nanosleep(&ts, NULL);
}

int64_t rb_sample(void *mem, uint64_t *rng, void *out, uint64_t *positions,
                  double *probabilities, uint64_t n, uint64_t recent, int64_t timeout_ns) {
    header_t *h = mem;
    if (h->prioritized && !probabilities) return RB_BAD_ARGUMENT;
    if (n == 0) return 0;
    int64_t deadline = -2;
    for (int round = 0;; round++) {
        int64_t k = try_sample(h, rng, out, positions, probabilities, n, recent);
        if (k > 0 || timeout_ns == 0) return k;
        if (deadline == -2) deadline = deadline_of(timeout_ns);
        if (expired(deadline)) return 0;
        pause_round(round, deadline);
    }
}

/* ---- priorities ---- */

uint64_t rb_update_priorities(void *mem, const uint64_t *positions, const double *priorities,
                              uint64_t n) {
    header_t *h = mem;
    if (!h->prioritized || n == 0) return 0;
    uint64_t applied = 0;
    double highest = 0;
    tree_begin(h);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = positions[i], index = p % h->capacity;
        if (h->max_times_sampled) { /* a used-up record stays out of the tree */
            uint64_t u = atomic_load_explicit(&slot_of(h, index)->uses, memory_order_relaxed);
            if (!uses_of(u, p) || count_of(u) >= h->max_times_sampled) continue;
        }
        if (set_leaf_of(h, index, p, pow(priorities[i], h->alpha))) {
            applied++;
            if (priorities[i] > highest) highest = priorities[i];
        }
    }
    tree_end(h, applied);
    raise_max_priority(h, highest);
    maybe_correct_drift(h);
    return applied;
}

/*
 * Check every argument first (priorities, then positions, in order), and write nothing
 * unless all are good. The positions are compared with `claimed` read once (relaxed):
 * it only grows, so a position below it was claimed. A negative index that the caller
 * passed as a signed 64-bit integer reads here as 2^63 or more: above any cursor.
 */
int64_t rb_update_priorities_checked(void *mem, const uint64_t *positions,
                                     const double *priorities, uint64_t n, uint64_t *detail) {
    header_t *h = mem;
    for (uint64_t i = 0; i < n; i++) {
        if (!(priorities[i] >= 0 && priorities[i] <= DBL_MAX)) { /* also NaN and inf */
            detail[0] = i;
            return RB_BAD_PRIORITY;
        }
    }
    uint64_t claimed = atomic_load_explicit(&h->claimed, memory_order_relaxed);
    for (uint64_t i = 0; i < n; i++) {
        if (positions[i] >= claimed) {
            detail[0] = i;
            detail[1] = claimed;
            return RB_BAD_POSITION;
        }
    }
    return (int64_t)rb_update_priorities(mem, positions, priorities, n);
}

/*
 * Importance-sampling weights w_i = (N * P_i)^-beta / max_j (N * P_j)^-beta. N cancels:
 * the largest weight belongs to the smallest probability P_min, so w_i = (P_min / P_i)^beta,
 * and the draw with P_min gets exactly 1. exp(beta * log(x)) rather than pow(x, beta):
 * 4 ns against 10-16 ns here, and in double both are far more exact than the float
 * weight they round to. A probability that
 * underflowed to 0 would make the formula 0/0: such a draw gets 1, the others 0, the
 * limit of the formula as that probability goes to 0.
 */
void rb_weights(const double *probabilities, uint64_t n, double beta, float *weights) {
    if (n == 0) return;
    double least = probabilities[0];
    for (uint64_t i = 1; i < n; i++)
        if (probabilities[i] < least) least = probabilities[i];
    for (uint64_t i = 0; i < n; i++) {
        if (beta == 0 || probabilities[i] == least)
            weights[i] = 1.0f;
        else if (!(least > 0))
            weights[i] = 0.0f;
        else
            weights[i] = (float)exp(beta * log(least / probabilities[i]));
    }
}

/* ---- statistics ---- */

void rb_stats(const void *mem, rb_stats_t *out) {
    header_t *h = (header_t *)mem;
    out->claimed = atomic_load_explicit(&h->claimed, memory_order_relaxed);
    out->added = atomic_load_explicit(&h->added, memory_order_relaxed);
    /* size is decremented late by writers that overwrite (step 7): clamp the transient. */
    int64_t size = (int64_t)atomic_load_explicit(&h->size, memory_order_relaxed);
    out->size = size < 0 ? 0 : (uint64_t)size > h->capacity ? h->capacity : (uint64_t)size;
    out->sampled = atomic_load_explicit(&h->sampled, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&h->dropped, memory_order_relaxed);
    out->reclaimed = atomic_load_explicit(&h->reclaimed, memory_order_relaxed);
    out->tree_passes = atomic_load_explicit(&h->tree_passes, memory_order_relaxed);
    out->max_priority = f64_from_bits(atomic_load_explicit(&h->max_priority, memory_order_relaxed));
    out->total_priority = h->prioritized ? node(tree_of(h), 1) : 0;
}

double rb_leaf_sum(const void *mem) {
    header_t *h = (header_t *)mem;
    if (!h->prioritized) return 0;
    double sum = 0;
    for (uint64_t i = 0; i < h->capacity; i++) sum += node(tree_of(h), h->leaves + i);
    return sum;
}

/* ---- save and load ---- */

uint64_t rb_export(const void *mem, void *records, uint64_t *positions, double *leaves,
                   uint64_t *uses, uint64_t max_n) {
    header_t *h = (header_t *)mem;
    uint64_t lo, hi, n = 0;
    window(h, 0, &lo, &hi);
    for (uint64_t p = lo; p < hi && n < max_n; p++) {
        uint64_t index = p % h->capacity;
        slot_t *s = slot_of(h, index);
        /* The seqlock read of take(), without counting a draw; a few tries per slot. */
        for (int attempt = 0; attempt < 8; attempt++) {
            if (atomic_load_explicit(&s->stamp, memory_order_acquire) != published(p)) break;
            load_record((char *)records + n * h->record_size, words_of(s), h->record_size);
            uint64_t u = atomic_load_explicit(&s->uses, memory_order_relaxed);
            double leaf = h->prioritized ? node(tree_of(h), h->leaves + index) : 0;
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&s->stamp, memory_order_relaxed) != published(p)) continue;
            positions[n] = p;
            leaves[n] = leaf;
            uses[n] = uses_of(u, p) ? count_of(u) : 0;
            n++;
            break;
        }
    }
    return n;
}

void rb_import(void *mem, const void *records, const uint64_t *positions, const double *leaves,
               const uint64_t *uses, uint64_t n, uint64_t claimed, uint64_t added,
               uint64_t sampled, double max_priority) {
    header_t *h = mem;
    reset(h);
    _Atomic uint64_t *tree = h->prioritized ? tree_of(h) : NULL;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p = positions[i], index = p % h->capacity;
        slot_t *s = slot_of(h, index);
        store_record(words_of(s), (const char *)records + i * h->record_size, h->record_size);
        atomic_store_explicit(&s->uses, fresh_uses(p) | (uses[i] & 0xffff), memory_order_relaxed);
        if (tree) atomic_store_explicit(&tree[h->leaves + index], f64_to_bits(leaves[i]),
                                        memory_order_relaxed);
        atomic_store_explicit(&s->stamp, published(p), memory_order_relaxed);
    }
    /* An exact sum tree, bottom-up. */
    if (tree)
        for (uint64_t i = h->leaves - 1; i >= 1; i--)
            atomic_store_explicit(&tree[i], f64_to_bits(node(tree, 2 * i) + node(tree, 2 * i + 1)),
                                  memory_order_relaxed);
    atomic_store_explicit(&h->added, added, memory_order_relaxed);
    atomic_store_explicit(&h->size, n, memory_order_relaxed);
    atomic_store_explicit(&h->sampled, sampled, memory_order_relaxed);
    atomic_store_explicit(&h->max_priority, f64_to_bits(max_priority), memory_order_relaxed);
    /* seq_cst, last: a process that sees the new cursor sees the loaded records. */
    atomic_store(&h->claimed, claimed);
}
