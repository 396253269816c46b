/*
 * rq: bounded MPMC array queue in shared memory.
 *
 * The algorithm is Dmitry Vyukov's bounded MPMC queue ("Bounded MPMC queue",
 * 1024cores.net), in the form of crossbeam's ArrayQueue: every slot carries a 64-bit
 * stamp that says, for the position that maps to it, whether the slot is free or holds
 * a published record. Producers claim positions by moving `tail`, consumers by moving
 * `head`; a claimed slot is handed over by a release store of its stamp.
 *
 * Additions to that algorithm, each described in native/README.md:
 *   - batches: one compare-and-swap claims a run of consecutive ready slots;
 *   - blocking: waiters sleep on futex words in the shared region (eventcounts);
 *   - close: a bit in `tail` that makes every later claim fail;
 *   - dead producers: a slot whose producer died between claim and publish is
 *     skipped once every thread that may own it is known to be gone;
 *   - dead consumers: a slot whose consumer died between claim and release is
 *     released for the next lap, and its record counted as lost, on the same terms.
 */
#define _GNU_SOURCE
#include "rq.h"
#include "atomic64.h"
#include "common.h" /* LINE, SLOT_ALIGN, clock, deadlines, spin-then-yield, thread_alive */

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x3151594c50455251ull /* "RQEPLYQ1" */
#define COUNTERS_MAGIC 0x31544e43504552ull
#define VERSION 2 /* 2: consumer registry and dead-consumer watch */

/* Bit 63 of tail: the queue is closed. Bit 63 of a stamp: the record was skipped. */
#define CLOSED_BIT (1ull << 63)
#define SKIP_BIT (1ull << 63)

#ifdef RQ_TEST_HOOKS
/* Test builds only (native/stress.c): called at these points of a push or pop, so that
 * a test can pause a thread or end it there and build the interleavings of the
 * dead-producer and dead-consumer policies. Normal builds compile the calls away. */
enum { RQ_HOOK_CLAIMING, RQ_HOOK_WRITING, RQ_HOOK_TAKING, RQ_HOOK_READING };
void rq_test_hook(int point, uint64_t pos);
#define TEST_HOOK(point, pos) rq_test_hook(point, pos)
#else
#define TEST_HOOK(point, pos) ((void)0)
#endif

/* How long a claimed slot may stay unpublished (or, claimed by a consumer, unreleased)
 * before the other side asks whether its owner is still alive (also the interval
 * between two such checks). */
#define STUCK_NS 20000000ll /* 20 ms */

/* common.h asserts the same of 64-bit atomics. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free to work across processes");
_Static_assert(sizeof(_Atomic uint64_t) == 8, "a stamp is one 64-bit word");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "futex words are 32 bits");

/*
 * Stamps. For position p (a 62-bit count of claims so far), the slot p % capacity holds
 *   2p      free for a producer at position p (or claimed by one and not yet published),
 *   2p + 1  a record published at position p, ready for the consumer at position p.
 * A consumer releases the slot for the next lap by storing 2(p + capacity). Doubling keeps
 * "published at p" and "free for p + capacity" apart even when capacity is 1.
 */
typedef struct {
    _Atomic uint64_t stamp;
    /* the record follows, at offset 8 */
} slot_t;

/* A registered producer (or consumer) thread and the positions it is about to claim.
 * The queue has one registry of these per role. */
typedef struct {
    _Atomic uint64_t owner;        /* pid << 32 | tid, 0 when the entry is free */
    _Atomic uint64_t intent_start; /* first position of the current claim */
    _Atomic uint64_t intent_count; /* positions claimed or being claimed; 0 when idle */
    char pad[SLOT_ALIGN - 24];
} claimant_t;
_Static_assert(sizeof(claimant_t) == SLOT_ALIGN, "one registry entry per cache line");

enum { PRODUCER, CONSUMER }; /* the two registries, and a thread's two roles */
#define REGISTRY_SIZE(role) ((role) == PRODUCER ? RQ_MAX_PRODUCERS : RQ_MAX_CONSUMERS)

typedef struct {
    /* Line 0: written once by rq_queue_init, read-only afterwards. */
    uint64_t magic, version, capacity, record_size, slot_size;
    uint64_t producers_offset, consumers_offset, slots_offset, total_bytes;
    uint64_t instance; /* tells two queues apart that a process mapped at one address */
    char pad0[LINE - 10 * 8];
    /* Line 1: next position a producer claims; bit 63 is the closed flag. */
    _Atomic uint64_t tail;
    char pad1[LINE - 8];
    /* Line 2: next position a consumer claims. */
    _Atomic uint64_t head;
    char pad2[LINE - 8];
    /* Line 3: the futex word consumers sleep on while the queue is empty: bit 0 says
     * someone may be asleep, the other bits count wake-ups (see wake()). */
    _Atomic uint32_t pop_word;
    char pad3[LINE - 4];
    /* Line 4: the futex word producers sleep on while the queue is full. */
    _Atomic uint32_t push_word;
    char pad4[LINE - 4];
    /* Line 5: rarely written statistics and the dead-producer watch (consumers write it). */
    _Atomic uint64_t full_waits, empty_waits, skipped, lost;
    _Atomic uint64_t stuck_pos;      /* position + 1 of a slot seen claimed and unpublished */
    _Atomic int64_t stuck_since_ns;  /* when it was first seen (CLOCK_MONOTONIC) */
    char pad5[LINE - 6 * 8];
    /* Line 6: the dead-consumer watch (producers write it, apart from the consumers' line). */
    _Atomic uint64_t held_pos;       /* position + 1 of a slot seen still holding its record */
    _Atomic int64_t held_since_ns;   /* when it was first seen (CLOCK_MONOTONIC) */
    char pad6[LINE - 2 * 8];
} header_t;

_Static_assert(sizeof(header_t) == 7 * LINE, "header is seven separate lines");
_Static_assert(offsetof(header_t, tail) == 1 * LINE, "tail on its own line");
_Static_assert(offsetof(header_t, head) == 2 * LINE, "head on its own line, apart from tail");
_Static_assert(offsetof(header_t, pop_word) == 3 * LINE, "wait words apart from the indices");

static inline slot_t *slot_at(header_t *h, uint64_t pos) {
    return (slot_t *)((char *)h + h->slots_offset + (pos % h->capacity) * h->slot_size);
}
static inline char *record_of(slot_t *s) { return (char *)s + sizeof(uint64_t); }
static inline claimant_t *registry(header_t *h, int role) {
    return (claimant_t *)((char *)h + (role == PRODUCER ? h->producers_offset : h->consumers_offset));
}

/* ---- futex: shared (not FUTEX_PRIVATE), since waiters may be in other processes ---- */

static void futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000ll;
        ts.tv_nsec = timeout_ns % 1000000000ll;
        tsp = &ts;
    }
    /* Returns at once if *word != expected (EAGAIN); EINTR and ETIMEDOUT are normal. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, tsp, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *word, int count) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, count, NULL, NULL, 0);
}

#define SLEEPING 1u /* bit 0 of a futex word: a thread may be asleep on it */

/*
 * Wake the sleepers on `word` after making progress. The seq_cst fence orders our stamp
 * stores before the load of the word; it pairs with the fence in announce() between a
 * sleeper's setting of SLEEPING and its re-check of the queue. Either we see the bit,
 * or the sleeper's re-check sees our record: no wake-up is lost (the Dekker pattern).
 * The first waker clears the bit as it bumps the count, so however many records move
 * before the sleepers run, only one of them pays for the system call.
 */
static void wake(_Atomic uint32_t *word) {
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t v = atomic_load_explicit(word, memory_order_relaxed);
    /* Relaxed CAS: the futex compares the value in the kernel, which orders it. */
    while (v & SLEEPING)
        if (atomic_compare_exchange_weak_explicit(word, &v, (v + 2) & ~SLEEPING,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            futex_wake(word, INT_MAX);
            return;
        }
}

/* ---- registries of producers and consumers (for the dead-thread policies) ---- */

static _Atomic uint64_t fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void after_fork_in_child(void) { atomic_fetch_add(&fork_generation, 1); }
static void install_atfork(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

/* Per-thread cache of this thread's entries in recently used queues. A forked child
 * starts with its parent thread's cache, so entries remember the fork generation. */
#define CACHE_WAYS 8
static _Thread_local struct {
    header_t *queue;
    uint64_t instance, generation;
    claimant_t *entry[2]; /* by role; NULL until the thread first pushes (pops) */
} cache[CACHE_WAYS];
static _Thread_local unsigned cache_next;

static uint64_t self_owner(void) {
    return (uint64_t)getpid() << 32 | (uint32_t)syscall(SYS_gettid);
}

/* Whether the thread of a registry entry's `owner` lives (common.h: a thread, not a
 * process, and how the check differs from rb.c's). */
static bool owner_alive(uint64_t owner) {
    return thread_alive((pid_t)(owner >> 32), (pid_t)(owner & 0xffffffffu));
}

/* True once no position in the entry's intent is both claimed and not yet handed on:
 * for a producer, below tail and unpublished (stamp 2p); for a consumer, below head and
 * unreleased (stamp 2p + 1, skip bit aside). */
static bool intent_resolved(header_t *h, claimant_t *e, int role) {
    uint64_t count = atomic_load_explicit(&e->intent_count, memory_order_acquire);
    uint64_t start = atomic_load_explicit(&e->intent_start, memory_order_acquire);
    uint64_t end = role == PRODUCER
        ? atomic_load_explicit(&h->tail, memory_order_acquire) & ~CLOSED_BIT
        : atomic_load_explicit(&h->head, memory_order_acquire);
    for (uint64_t p = start; p < start + count && p < end; p++) {
        uint64_t stamp = atomic_load_explicit(&slot_at(h, p)->stamp, memory_order_acquire);
        if (role == PRODUCER ? stamp == 2 * p : (stamp & ~SKIP_BIT) == 2 * p + 1) return false;
    }
    return true;
}

/* This thread's entry in the queue's registry for `role`, taken on first use; NULL if
 * RQ_MAX_PRODUCERS (RQ_MAX_CONSUMERS) live threads hold every entry. */
static claimant_t *register_thread(header_t *h, int role) {
    uint64_t gen = atomic_load_explicit(&fork_generation, memory_order_relaxed);
    int way = -1;
    for (int i = 0; i < CACHE_WAYS; i++)
        if (cache[i].queue == h && cache[i].instance == h->instance && cache[i].generation == gen) {
            if (cache[i].entry[role]) return cache[i].entry[role];
            way = i; /* the queue is cached, but this thread has not acted in this role yet */
            break;
        }
    pthread_once(&atfork_once, install_atfork);

    uint64_t me = self_owner();
    claimant_t *table = registry(h, role), *entry = NULL;
    /* An entry of ours from an evicted cache line, else a free one, else a dead one. */
    for (int i = 0; i < REGISTRY_SIZE(role) && !entry; i++)
        if (atomic_load(&table[i].owner) == me && intent_resolved(h, &table[i], role)) entry = &table[i];
    for (int i = 0; i < REGISTRY_SIZE(role) && !entry; i++) {
        uint64_t owner = atomic_load(&table[i].owner);
        bool reusable = owner == 0 ||
            (!owner_alive(owner) && intent_resolved(h, &table[i], role));
        if (reusable && atomic_compare_exchange_strong(&table[i].owner, &owner, me)) {
            atomic_store(&table[i].intent_count, 0);
            entry = &table[i];
        }
    }
    if (!entry) return NULL;
    if (way < 0) {
        way = (int)(cache_next++ % CACHE_WAYS);
        cache[way].queue = h;
        cache[way].instance = h->instance;
        cache[way].generation = gen;
        cache[way].entry[PRODUCER] = cache[way].entry[CONSUMER] = NULL;
    }
    cache[way].entry[role] = entry;
    return entry;
}

/* ---- dead producers and dead consumers ---- */

/*
 * True if at least one registered thread of `role` has an intent covering `pos`, and
 * every such thread is dead. The real owner of a claimed position wrote its intent
 * before its claim and clears it only after handing the slot on (publish or release),
 * so while it lives one covering entry is alive; entries covering `pos` by a stale
 * intent (a lost claim race) only make us wait longer.
 */
static bool only_dead_owners_cover(header_t *h, int role, uint64_t pos) {
    claimant_t *table = registry(h, role);
    bool dead_owner = false;
    for (int i = 0; i < REGISTRY_SIZE(role); i++) {
        uint64_t owner = atomic_load(&table[i].owner);
        if (!owner) continue;
        uint64_t start = atomic_load(&table[i].intent_start);
        uint64_t count = atomic_load(&table[i].intent_count);
        if (pos < start || pos >= start + count) continue;
        if (owner_alive(owner)) return false;
        dead_owner = true;
    }
    return dead_owner;
}

/* The slot at `pos` was claimed (pos < tail) but is still unpublished. Skip it if its
 * producer is dead. The CAS fails if the owner did publish after all. */
static bool skip_if_owner_dead(header_t *h, uint64_t pos) {
    if (!only_dead_owners_cover(h, PRODUCER, pos)) return false;
    uint64_t expected = 2 * pos;
    /* Release: a consumer that acquires the skipped stamp sees a consistent slot. */
    if (!atomic_compare_exchange_strong_explicit(&slot_at(h, pos)->stamp, &expected,
                                                 (2 * pos + 1) | SKIP_BIT,
                                                 memory_order_release, memory_order_relaxed))
        return false;
    atomic_fetch_add_explicit(&h->skipped, 1, memory_order_relaxed);
    return true;
}

/* The timer of both watches (stuck_pos and stuck_since_ns, held_pos and held_since_ns).
 * `seen_pos` holds the position + 1 of the slot being watched, `since_ns` when it was
 * first seen or last checked. A new slot restarts the timer. True once the slot at `pos`
 * has been watched for STUCK_NS, for the one caller whose CAS moves `since_ns` to now:
 * at most one liveness check per STUCK_NS. */
static bool watch_due(_Atomic uint64_t *seen_pos, _Atomic int64_t *since_ns, uint64_t pos) {
    int64_t now = now_ns();
    uint64_t seen = atomic_load_explicit(seen_pos, memory_order_relaxed);
    if (seen != pos + 1) {
        if (atomic_compare_exchange_strong(seen_pos, &seen, pos + 1))
            atomic_store(since_ns, now);
        return false;
    }
    int64_t since = atomic_load(since_ns);
    if (now - since < STUCK_NS) return false;
    return atomic_compare_exchange_strong(since_ns, &since, now); /* one checker */
}

/* A consumer found the slot at `pos` claimed and unpublished. Checking liveness costs
 * system calls, so only do it once the same slot has been stuck for STUCK_NS. */
static void watch_stuck(header_t *h, uint64_t pos) {
    if (!watch_due(&h->stuck_pos, &h->stuck_since_ns, pos)) return;
    /* A dead producer's batch covers consecutive positions: skip all of them now, not
     * one per check. Acquire on tail: see skip_if_owner_dead. */
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire) & ~CLOSED_BIT;
    while (pos < tail && skip_if_owner_dead(h, pos)) pos++;
}

/* The slot at `pos` was claimed by a consumer (pos < head) and still holds its record.
 * If that consumer is dead, release the slot for the next lap as it would have, and
 * count the record as lost (a skipped slot held no record). The CAS fails if the slot
 * was released after all; the stamp's exact value ties it to this lap. */
static bool release_if_holder_dead(header_t *h, uint64_t pos) {
    slot_t *s = slot_at(h, pos);
    /* Relaxed: a guess, checked by the CAS; we read nothing else of the slot. */
    uint64_t stamp = atomic_load_explicit(&s->stamp, memory_order_relaxed);
    if ((stamp & ~SKIP_BIT) != 2 * pos + 1) return false;
    if (!only_dead_owners_cover(h, CONSUMER, pos)) return false;
    /* Release, as the consumer's own release (pop step 6): pairs with the producer's
     * acquire of the stamp (push steps 2-3) before it overwrites the slot. */
    if (!atomic_compare_exchange_strong_explicit(&s->stamp, &stamp, 2 * (pos + h->capacity),
                                                 memory_order_release, memory_order_relaxed))
        return false;
    if (!(stamp & SKIP_BIT)) atomic_fetch_add_explicit(&h->lost, 1, memory_order_relaxed);
    return true;
}

/* A producer found the slot of `pos` (one lap behind its tail) still holding a record:
 * the queue is full there. That is normal while the record waits for a consumer or a
 * consumer copies it out; only once the same slot has been full for STUCK_NS, ask
 * whether the consumer that claimed it, if any, is alive. The watch lives on its own
 * line, and head is read only then, so that a full queue costs the consumers nothing.
 * Returns true if it released the slot of `pos`. */
static bool watch_held(header_t *h, uint64_t pos) {
    if (!watch_due(&h->held_pos, &h->held_since_ns, pos)) return false;
    /* Acquire on head pairs with the release CAS of the consumer that claimed pos (pop
     * step 5): its intent is visible to the registry reads. A dead consumer's claim
     * covers consecutive positions: release all of them now. */
    uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    uint64_t first = pos;
    while (pos < head && release_if_holder_dead(h, pos)) pos++;
    if (pos == first) return false;
    wake(&h->push_word); /* other producers may sleep on the full queue */
    return true;
}

/* ---- the queue ---- */

uint64_t rq_queue_bytes(uint64_t capacity, uint64_t record_size) {
    uint64_t slot = round_up(sizeof(uint64_t) + record_size, SLOT_ALIGN);
    return sizeof(header_t) + (RQ_MAX_PRODUCERS + RQ_MAX_CONSUMERS) * sizeof(claimant_t) +
           capacity * slot;
}

int rq_queue_init(void *mem, uint64_t capacity, uint64_t record_size) {
    if (capacity < 1 || capacity > RQ_MAX_CAPACITY || record_size < 1 ||
        record_size > RQ_MAX_RECORD_SIZE)
        return RQ_BAD_ARGUMENT;
    header_t *h = mem;
    memset(h, 0, sizeof *h);
    h->capacity = capacity;
    h->record_size = record_size;
    h->slot_size = round_up(sizeof(uint64_t) + record_size, SLOT_ALIGN);
    h->producers_offset = sizeof(header_t);
    h->consumers_offset = h->producers_offset + RQ_MAX_PRODUCERS * sizeof(claimant_t);
    h->slots_offset = h->consumers_offset + RQ_MAX_CONSUMERS * sizeof(claimant_t);
    h->total_bytes = rq_queue_bytes(capacity, record_size);
    h->instance = (uint64_t)now_ns() ^ ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)mem;
    memset(registry(h, PRODUCER), 0, RQ_MAX_PRODUCERS * sizeof(claimant_t));
    memset(registry(h, CONSUMER), 0, RQ_MAX_CONSUMERS * sizeof(claimant_t));
    /* Slot i starts free for position i. */
    for (uint64_t i = 0; i < capacity; i++) atomic_init(&slot_at(h, i)->stamp, 2 * i);
    h->version = VERSION;
    /* Release: whoever reads the magic sees the initialised region. */
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, MAGIC, memory_order_release);
    return RQ_OK;
}

int rq_queue_check(const void *mem, uint64_t mem_bytes, uint64_t capacity, uint64_t record_size) {
    const header_t *h = mem;
    if (mem_bytes < sizeof *h) return RQ_BAD_HEADER;
    if (atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != MAGIC ||
        h->version != VERSION || h->capacity != capacity || h->record_size != record_size ||
        h->total_bytes != rq_queue_bytes(capacity, record_size) || h->total_bytes > mem_bytes)
        return RQ_BAD_HEADER;
    return RQ_OK;
}

/* Claim and fill up to n free slots. Returns the count, 0 when full, or an error. */
static int64_t try_push(header_t *h, claimant_t *me, const char *records, uint64_t n) {
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    uint64_t k;
    for (;;) {
        if (tail & CLOSED_BIT) return RQ_CLOSED;
        /* 1. Count the free slots from tail on. Acquire pairs with the consumer's release
         *    of the slot, so its read of the old record happens before we overwrite it. */
        for (k = 0; k < n; k++) {
            uint64_t stamp = atomic_load_explicit(&slot_at(h, tail + k)->stamp, memory_order_acquire);
            if (stamp != 2 * (tail + k)) break;
        }
        if (k == 0) {
            uint64_t stamp = atomic_load_explicit(&slot_at(h, tail)->stamp, memory_order_acquire)
                             & ~SKIP_BIT;
            if (stamp < 2 * tail) { /* 2. the slot still holds last lap's record: full, */
                /* unless its consumer died holding it and the watch just released it */
                if (tail >= h->capacity && watch_held(h, tail - h->capacity)) continue;
                return 0;
            }
            /* 3. the slot is already claimed for this lap: our tail is stale */
            tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
            continue;
        }
        /* 4. Announce the claim before making it (relaxed: the release CAS below
         *    publishes these stores to whoever acquires tail; see skip_if_owner_dead). */
        atomic_store_explicit(&me->intent_start, tail, memory_order_relaxed);
        atomic_store_explicit(&me->intent_count, k, memory_order_relaxed);
        TEST_HOOK(RQ_HOOK_CLAIMING, tail);
        /* 5. Claim positions [tail, tail + k). Release: see step 4. On failure `tail`
         *    is reloaded and we start over. */
        if (atomic_compare_exchange_weak_explicit(&h->tail, &tail, tail + k,
                                                  memory_order_release, memory_order_relaxed))
            break;
        /* Lost the race: withdraw the intent, or it would cover the winner's positions
         * and keep them from being skipped should the winner die. */
        atomic_store_explicit(&me->intent_count, 0, memory_order_relaxed);
    }
    /* 6. Write each record, then publish it. Release: the record's bytes happen before a
     *    consumer's acquire load of the stamp. */
    for (uint64_t i = 0; i < k; i++) {
        slot_t *s = slot_at(h, tail + i);
        TEST_HOOK(RQ_HOOK_WRITING, tail + i);
        memcpy(record_of(s), records + i * h->record_size, h->record_size);
        atomic_store_explicit(&s->stamp, 2 * (tail + i) + 1, memory_order_release);
    }
    /* 7. Done: drop the intent. Release orders it after the publications. */
    atomic_store_explicit(&me->intent_count, 0, memory_order_release);
    return (int64_t)k;
}

/* Steps 1-5 of a pop: claim up to n ready slots from head on, announced by this thread's
 * intent. Returns the count claimed (*first: the first position), 0 when nothing is
 * ready, or RQ_CLOSED when closed and drained. With `in_place` (a borrow), the claim
 * stops at the ring's end, so that the slots lie at increasing addresses, and at the
 * first skipped slot, so that every slot lent holds a record; a skipped slot at head is
 * claimed alone, and the caller hands it back at once. */
static int64_t claim_ready(header_t *h, claimant_t *me, uint64_t n, bool in_place, uint64_t *first) {
    uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    uint64_t k;
    for (;;) {
        uint64_t limit = n;
        if (in_place && limit > h->capacity - head % h->capacity)
            limit = h->capacity - head % h->capacity;
        /* 1. Count ready slots from head on. Acquire pairs with the producer's publication. */
        for (k = 0; k < limit; k++) {
            uint64_t stamp = atomic_load_explicit(&slot_at(h, head + k)->stamp, memory_order_acquire);
            if ((stamp & ~SKIP_BIT) != 2 * (head + k) + 1) break;
            if (in_place && (stamp & SKIP_BIT)) {
                if (k == 0) k = 1; /* claimed alone, handed back unread */
                break;
            }
        }
        if (k == 0) {
            uint64_t stamp = atomic_load_explicit(&slot_at(h, head)->stamp, memory_order_acquire)
                             & ~SKIP_BIT;
            if (stamp > 2 * head + 1) { /* 2. consumed already: our head is stale */
                head = atomic_load_explicit(&h->head, memory_order_relaxed);
                continue;
            }
            /* 3. Free for this lap: empty, unless a producer claimed it and has not
             *    published yet. Acquire on tail: see skip_if_owner_dead. */
            uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
            if ((tail & ~CLOSED_BIT) <= head) return (tail & CLOSED_BIT) ? RQ_CLOSED : 0;
            watch_stuck(h, head);
            return 0;
        }
        /* 4. Announce the claim before making it (relaxed: the release CAS below
         *    publishes these stores to whoever acquires head; see watch_held). */
        atomic_store_explicit(&me->intent_start, head, memory_order_relaxed);
        atomic_store_explicit(&me->intent_count, k, memory_order_relaxed);
        TEST_HOOK(RQ_HOOK_TAKING, head);
        /* 5. Claim positions [head, head + k). The stamps were acquired in step 1, and
         *    nobody else writes them until we release (or die). Release: see step 4. */
        if (atomic_compare_exchange_weak_explicit(&h->head, &head, head + k,
                                                  memory_order_release, memory_order_relaxed))
            break;
        /* Lost the race: withdraw the intent (see try_push). */
        atomic_store_explicit(&me->intent_count, 0, memory_order_relaxed);
    }
    *first = head;
    return (int64_t)k;
}

/* Steps 6-7 of a pop: hand back the k slots claimed from `first` on, copying each
 * record to `out` first unless `out` is NULL (a borrow's records were read in place),
 * and wake producers waiting for room. Returns the count copied. */
static uint64_t release_claimed(header_t *h, claimant_t *me, uint64_t first, uint64_t k, char *out) {
    /* 6. Copy each record out, then free its slot for the next lap. Release: our read of
     *    the record happens before a producer's acquire of the stamp and overwrite. */
    uint64_t written = 0;
    for (uint64_t i = 0; i < k; i++) {
        slot_t *s = slot_at(h, first + i);
        TEST_HOOK(RQ_HOOK_READING, first + i);
        if (out && !(atomic_load_explicit(&s->stamp, memory_order_relaxed) & SKIP_BIT))
            memcpy(out + written++ * h->record_size, record_of(s), h->record_size);
        atomic_store_explicit(&s->stamp, 2 * (first + i + h->capacity), memory_order_release);
    }
    /* 7. Done: drop the intent. Release orders it after the releases of the slots. */
    atomic_store_explicit(&me->intent_count, 0, memory_order_release);
    wake(&h->push_word);
    return written;
}

/* Take up to n ready slots: into `out` (a pop), or in place (a borrow, `out` NULL: the
 * slots stay claimed, *first says where, until rq_release). Returns the count written
 * to out or lent, 0 when nothing is ready, or RQ_CLOSED when closed and drained.
 * *consumed counts the slots taken, skipped ones included (they are never lent). */
static int64_t try_pop(header_t *h, claimant_t *me, char *out, uint64_t n, uint64_t *first,
                       uint64_t *consumed) {
    *consumed = 0;
    int64_t k = claim_ready(h, me, n, out == NULL, first);
    if (k <= 0) return k;
    *consumed = (uint64_t)k;
    if (out) return (int64_t)release_claimed(h, me, *first, (uint64_t)k, out);
    if (atomic_load_explicit(&slot_at(h, *first)->stamp, memory_order_relaxed) & SKIP_BIT) {
        release_claimed(h, me, *first, 1, NULL); /* a skipped slot: nothing to lend */
        return 0;
    }
    return k;
}

/*
 * Set SLEEPING on `word` and return the value to sleep on. The caller re-checks the
 * queue between announce() and sleep_on(): the seq_cst fence here pairs with the one in
 * wake(). A sleeper that is not woken (timeout, signal) leaves the bit set; that only
 * costs the next waker one needless system call.
 */
static uint32_t announce(_Atomic uint32_t *word) {
    uint32_t v = atomic_load_explicit(word, memory_order_relaxed);
    while (!(v & SLEEPING) &&
           !atomic_compare_exchange_weak_explicit(word, &v, v | SLEEPING,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    atomic_thread_fence(memory_order_seq_cst);
    return v | SLEEPING;
}

/* Sleep until the word moves from `value` (a wake-up or close), or until `deadline`. */
static void sleep_on(_Atomic uint32_t *word, uint32_t value, int64_t deadline) {
    int64_t left = deadline < 0 ? -1 : deadline - now_ns();
    if (deadline < 0 || left > 0) futex_wait(word, value, left);
}

/* The end of one sleep: `deadline`, but never more than 2 * STUCK_NS away. A slot whose
 * owner dies while we sleep (a producer's claim for consumers, a consumer's claim for
 * producers) is then looked at again by the watches, even if nobody wakes us. */
static int64_t nap_end(int64_t deadline) {
    int64_t nap = now_ns() + 2 * STUCK_NS;
    return deadline >= 0 && deadline < nap ? deadline : nap;
}

int64_t rq_push(void *mem, const void *records, uint64_t n, int64_t timeout_ns) {
    header_t *h = mem;
    if (n == 0) return 0;
    claimant_t *me = register_thread(h, PRODUCER);
    if (!me) return RQ_TOO_MANY_PRODUCERS;
    int64_t deadline = -2, pushed;
    for (int round = 0;; round++) {
        pushed = try_push(h, me, records, n);
        if (pushed != 0 || timeout_ns == 0) break;
        if (deadline == -2) deadline = deadline_of(timeout_ns);
        if (expired(deadline)) break;
        if (keep_spinning(round)) continue;
        atomic_fetch_add_explicit(&h->full_waits, 1, memory_order_relaxed);
        uint32_t value = announce(&h->push_word);
        pushed = try_push(h, me, records, n);
        if (pushed != 0) break;
        sleep_on(&h->push_word, value, nap_end(deadline));
        /* Back to the caller after one sleep, so that it can handle signals. */
        pushed = try_push(h, me, records, n);
        break;
    }
    if (pushed > 0) wake(&h->pop_word);
    return pushed;
}

/* rq_pop and rq_borrow: try, spin, then sleep once, as rq_push. */
static int64_t take(header_t *h, char *out, uint64_t n, int64_t timeout_ns, uint64_t *first) {
    if (n == 0) return 0;
    claimant_t *me = register_thread(h, CONSUMER);
    if (!me) return RQ_TOO_MANY_CONSUMERS;
    /* A thread's intent covers one claim: while it holds a borrow, it takes nothing more.
     * Relaxed: only this thread writes its own entry while it lives. */
    if (atomic_load_explicit(&me->intent_count, memory_order_relaxed)) return RQ_BORROWING;
    int64_t deadline = -2, popped;
    uint64_t consumed;
    for (int round = 0;; round++) {
        popped = try_pop(h, me, out, n, first, &consumed);
        if (popped == 0 && consumed) continue; /* only skipped records: look again */
        if (popped != 0 || timeout_ns == 0) break;
        if (deadline == -2) deadline = deadline_of(timeout_ns);
        if (expired(deadline)) break;
        if (keep_spinning(round)) continue;
        atomic_fetch_add_explicit(&h->empty_waits, 1, memory_order_relaxed);
        uint32_t value = announce(&h->pop_word);
        popped = try_pop(h, me, out, n, first, &consumed);
        if (popped != 0) break;
        if (consumed) continue;
        sleep_on(&h->pop_word, value, nap_end(deadline));
        /* Back to the caller after one sleep, so that it can handle signals. */
        popped = try_pop(h, me, out, n, first, &consumed);
        break;
    }
    return popped;
}

int64_t rq_pop(void *mem, void *out, uint64_t n, int64_t timeout_ns) {
    uint64_t first;
    if (!out && n) return RQ_BAD_ARGUMENT; /* a NULL out is how take() tells a borrow */
    return take(mem, out, n, timeout_ns, &first);
}

int64_t rq_borrow(void *mem, uint64_t n, int64_t timeout_ns, uint64_t *slot) {
    header_t *h = mem;
    uint64_t first = 0;
    int64_t lent = take(h, NULL, n, timeout_ns, &first);
    if (lent > 0) *slot = first % h->capacity;
    return lent;
}

/* This thread's registry entry that holds a borrow, or NULL. Usually the cached entry;
 * if the cache dropped it (the thread used many queues meanwhile), found by its owner. */
static claimant_t *borrower(header_t *h) {
    claimant_t *me = register_thread(h, CONSUMER);
    if (me && atomic_load_explicit(&me->intent_count, memory_order_relaxed)) return me;
    uint64_t self = self_owner();
    claimant_t *table = registry(h, CONSUMER);
    for (int i = 0; i < RQ_MAX_CONSUMERS; i++)
        if (atomic_load(&table[i].owner) == self && atomic_load(&table[i].intent_count))
            return &table[i];
    return NULL;
}

int64_t rq_release(void *mem) {
    header_t *h = mem;
    claimant_t *me = borrower(h);
    if (!me) return RQ_NOT_BORROWING;
    /* Relaxed: this thread's own entry (see take). */
    uint64_t count = atomic_load_explicit(&me->intent_count, memory_order_relaxed);
    uint64_t first = atomic_load_explicit(&me->intent_start, memory_order_relaxed);
    release_claimed(h, me, first, count, NULL);
    return (int64_t)count;
}

uint64_t rq_slot_bytes(const void *mem) { return ((const header_t *)mem)->slot_size; }

uint64_t rq_records_offset(const void *mem) {
    return ((const header_t *)mem)->slots_offset + sizeof(uint64_t); /* past slot 0's stamp */
}

void rq_close(void *mem) {
    header_t *h = mem;
    /* seq_cst: the closed bit is ordered before the wake-ups below, and every claim
     * (a CAS on tail) after it fails and sees the bit. */
    atomic_fetch_or(&h->tail, CLOSED_BIT);
    atomic_fetch_add(&h->pop_word, 2);
    atomic_fetch_add(&h->push_word, 2);
    futex_wake(&h->pop_word, INT_MAX);
    futex_wake(&h->push_word, INT_MAX);
}

int rq_is_closed(const void *mem) {
    const header_t *h = mem;
    return (atomic_load_explicit((_Atomic uint64_t *)&h->tail, memory_order_acquire) & CLOSED_BIT) != 0;
}

uint64_t rq_size(const void *mem) {
    header_t *h = (header_t *)mem;
    /* The two loads are not one snapshot: head may pass the tail we read, so clamp. Any
     * answer is stale the moment it returns, as with queue.Queue.qsize(). */
    uint64_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire) & ~CLOSED_BIT;
    uint64_t size = tail > head ? tail - head : 0;
    return size > h->capacity ? h->capacity : size;
}

void rq_stats(const void *mem, rq_stats_t *out) {
    header_t *h = (header_t *)mem;
    out->full_waits = atomic_load_explicit(&h->full_waits, memory_order_relaxed);
    out->empty_waits = atomic_load_explicit(&h->empty_waits, memory_order_relaxed);
    out->skipped = atomic_load_explicit(&h->skipped, memory_order_relaxed);
    out->lost = atomic_load_explicit(&h->lost, memory_order_relaxed);
}

/* ---- counters: one 64-bit cell per LINE; relaxed, as each is a statistic on its own ---- */

typedef struct {
    uint64_t magic, version, n;
    char pad[LINE - 24];
} counters_header_t;
typedef struct {
    _Atomic uint64_t value;
    char pad[LINE - 8];
} cell_t;
_Static_assert(sizeof(cell_t) == LINE, "each counter on its own cache line");

static inline cell_t *cell(void *mem, uint64_t i) {
    return (cell_t *)((char *)mem + sizeof(counters_header_t)) + i;
}

uint64_t rq_counters_bytes(uint64_t n) { return sizeof(counters_header_t) + n * sizeof(cell_t); }

int rq_counters_init(void *mem, uint64_t n) {
    counters_header_t *h = mem;
    memset(mem, 0, rq_counters_bytes(n));
    h->version = VERSION;
    h->n = n;
    atomic_store_explicit((_Atomic uint64_t *)&h->magic, COUNTERS_MAGIC, memory_order_release);
    return RQ_OK;
}

int rq_counters_check(const void *mem, uint64_t mem_bytes, uint64_t n) {
    const counters_header_t *h = mem;
    if (mem_bytes < rq_counters_bytes(n) ||
        atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire) != COUNTERS_MAGIC ||
        h->version != VERSION || h->n != n)
        return RQ_BAD_HEADER;
    return RQ_OK;
}

void rq_counter_add_int(void *mem, uint64_t i, int64_t value) {
    atomic_fetch_add_explicit(&cell(mem, i)->value, (uint64_t)value, memory_order_relaxed);
}

void rq_counter_set_int(void *mem, uint64_t i, int64_t value) {
    atomic_store_explicit(&cell(mem, i)->value, (uint64_t)value, memory_order_relaxed);
}

/* The CAS loop of atomic64.h, which rb.c's sum tree shares. */
void rq_counter_add_float(void *mem, uint64_t i, double value) {
    atomic_add_f64(&cell(mem, i)->value, value);
}

void rq_counter_set_float(void *mem, uint64_t i, double value) {
    atomic_store_explicit(&cell(mem, i)->value, f64_to_bits(value), memory_order_relaxed);
}

uint64_t rq_counter_load(const void *mem, uint64_t i) {
    return atomic_load_explicit(&cell((void *)mem, i)->value, memory_order_relaxed);
}

void rq_counters_read(const void *mem, uint64_t *out, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        out[i] = atomic_load_explicit(&cell((void *)mem, i)->value, memory_order_relaxed);
}
