/*
 * Stress test for rb (the replay buffers): W writer threads add records to a small
 * ring, uniform and prioritized, while S sampler threads draw from it (with and without
 * `recent`), update priorities and use the limits.
 *
 * Checked:
 *   - every record drawn is intact (a checksum of its fields, and a payload filled from
 *     it), so a copy mixed from two records is caught;
 *   - every position drawn holds the record written there (records carry their writer
 *     and sequence, the test keeps which position each add returned);
 *   - the counters add up once the writers are done: claimed = added + dropped;
 *   - the sum tree's root equals the sum of its leaves up to float rounding;
 *   - with max_times_sampled, samplers racing for the last draws of every record
 *     (uniform and prioritized): a batch comes back whole or not at all, and no draw is
 *     lost, so once they stop, draining one record at a time finds exactly the draws
 *     they did not take.
 *
 * Before the rounds, scenarios of writers that stop inside an add (through the
 * RB_TEST_HOOKS point of rb.c): a forked child that exits after taking a slot stands
 * for a writer process killed there; a thread paused there stands for a slow writer
 * that is lapped.
 *
 * rb.c is included directly, so its static functions are compiled with the same flags
 * (the `tsan-rb` target builds this file with -fsanitize=thread).
 *
 *   usage: stress_rb [items_per_writer [rounds [writers [samplers]]]]
 */
#define RB_TEST_HOOKS
#include "rb.c"

#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define MAX_THREADS 64
#define MAX_BATCH 7
#define MAX_ITEMS (1u << 20)

#define STRESS_PAYLOAD 104 /* a record of several words, to catch torn copies */
#include "stress_record.h"

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

/* ---- hooks ---- */

enum { HOOK_NONE, HOOK_EXIT, HOOK_PAUSE };
static _Atomic int hook_mode;
static _Atomic int hook_paused, hook_release;

void rb_test_hook(uint64_t pos) {
    (void)pos;
    int mode = atomic_load(&hook_mode);
    if (mode == HOOK_EXIT) _exit(0); /* a writer process killed after taking its slot */
    if (mode == HOOK_PAUSE && atomic_exchange(&hook_paused, 1) == 0)
        while (!atomic_load(&hook_release)) sched_yield();
}

/* A region shared with forked children, as /dev/shm is between processes. */
static void *new_buffer(uint64_t capacity, int prioritized, uint64_t max_times_sampled) {
    rb_config_t c = {capacity, sizeof(record_t), prioritized, 0.6, max_times_sampled, 0, 0, 1};
    uint64_t bytes = rb_bytes(&c);
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED || rb_init(mem, &c) != RB_OK) FAIL("cannot make a buffer");
    return mem;
}
static void free_buffer(void *mem) { munmap(mem, ((header_t *)mem)->total_bytes); }

static uint64_t stamp_at(void *mem, uint64_t index) {
    return atomic_load(&slot_of(mem, index)->stamp);
}

/* A writer process that exits between taking slot `pos % capacity` and publishing. */
static int dead_writer_is_skipped_then_reclaimed(int prioritized) {
    void *mem = new_buffer(4, prioritized, 0);
    record_t r[4], out[64];
    uint64_t rng[4], positions[64];
    double probabilities[64];
    rb_seed(rng, 1);
    for (int i = 0; i < 4; i++) fill(&r[i], 9, (uint64_t)i);
    rb_add(mem, r, 4); /* positions 0..3 */
    pid_t child = fork();
    if (child == 0) {
        atomic_store(&hook_mode, HOOK_EXIT);
        rb_add(mem, &r[0], 1); /* position 4, slot 0: exits inside */
        _exit(1);
    }
    int status;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) FAIL("child did not exit in the hook");
    if (!is_writing(stamp_at(mem, 0))) FAIL("slot 0 should be left being written");
    /* Samplers skip the dead slot and still draw the other three. */
    int64_t got = rb_sample(mem, rng, out, positions, probabilities, 64, 0, 0);
    if (got != 64) FAIL("sampling around a dead slot drew %" PRId64, got);
    for (int i = 0; i < 64; i++)
        if (positions[i] == 0 || positions[i] == 4 || !intact(&out[i]) || out[i].seq != positions[i])
            FAIL("drew position %" PRIu64 " next to a dead slot", positions[i]);
    /* The next writer to reach slot 0 takes it back (position 8: one lap later). */
    fill(&r[0], 9, 100);
    for (int i = 0; i < 4; i++) rb_add(mem, &r[0], 1); /* positions 5..8 */
    rb_stats_t s;
    rb_stats(mem, &s);
    if (s.reclaimed != 1 || stamp_at(mem, 0) != published(8))
        FAIL("the dead writer's slot was not reclaimed (reclaimed %" PRIu64 ")", s.reclaimed);
    if (prioritized && fabs(s.total_priority - rb_leaf_sum(mem)) > 1e-12)
        FAIL("tree sum %g != leaves %g", s.total_priority, rb_leaf_sum(mem));
    free_buffer(mem);
    return 0;
}

static void *slow_writer_main(void *mem) {
    record_t r;
    fill(&r, 7, 4); /* position 4, slot 0 */
    rb_add(mem, &r, 1);
    return NULL;
}

/* A live writer lapped while it writes: the lapping writer drops its record, and the
 * slow one publishes a record that samplers never return (its position left the window). */
static int lapped_live_writer_drops_and_never_tears(void) {
    void *mem = new_buffer(4, 0, 0);
    record_t r[8], out[64];
    uint64_t rng[4], positions[64];
    rb_seed(rng, 2);
    for (int i = 0; i < 8; i++) fill(&r[i], 1, (uint64_t)i);
    rb_add(mem, r, 4);
    atomic_store(&hook_paused, 0);
    atomic_store(&hook_release, 0);
    atomic_store(&hook_mode, HOOK_PAUSE);
    pthread_t t;
    pthread_create(&t, NULL, slow_writer_main, mem);
    while (!atomic_load(&hook_paused)) sched_yield();
    atomic_store(&hook_mode, HOOK_NONE);
    for (int i = 5; i < 9; i++) {
        fill(&r[0], 1, (uint64_t)i);
        rb_add(mem, &r[0], 1); /* positions 5..8: position 8 laps the slow writer's slot 0 */
    }
    rb_stats_t s;
    rb_stats(mem, &s);
    if (s.dropped != 1) FAIL("the lapping writer should drop its record (dropped %" PRIu64 ")", s.dropped);
    atomic_store(&hook_release, 1);
    pthread_join(t, NULL);
    if (stamp_at(mem, 0) != published(4)) FAIL("the slow writer should publish position 4");
    int64_t got = rb_sample(mem, rng, out, positions, NULL, 64, 0, 0);
    if (got != 64) FAIL("drew %" PRId64, got);
    for (int i = 0; i < 64; i++)
        if (positions[i] < 5 || positions[i] > 7 || !intact(&out[i]) || out[i].seq != positions[i])
            FAIL("drew position %" PRIu64 " after a lap", positions[i]);
    free_buffer(mem);
    return 0;
}

static int hook_scenarios(void) {
    dead_writer_is_skipped_then_reclaimed(0);
    dead_writer_is_skipped_then_reclaimed(1);
    lapped_live_writer_drops_and_never_tears();
    printf("dead- and slow-writer scenarios: ok\n");
    return 0;
}

/* ---- rounds ---- */

typedef struct {
    void *mem;
    uint64_t id, items, seed;
    /* writers: the (writer, seq) each position got, so samplers can check positions */
    _Atomic uint64_t *owner_of; /* position -> writer << 32 | seq, + 1; 0: unknown yet */
    uint64_t draws, updates;
    _Atomic int *writers_done;
    int prioritized;
} worker_t;

static void *writer_main(void *arg) {
    worker_t *w = arg;
    record_t batch[MAX_BATCH];
    uint64_t state = w->seed, seq = 0;
    while (seq < w->items) {
        uint64_t k = 1 + next_random(&state) % MAX_BATCH;
        if (k > w->items - seq) k = w->items - seq;
        for (uint64_t i = 0; i < k; i++) fill(&batch[i], w->id, seq + i);
        uint64_t first = rb_add(w->mem, batch, k);
        for (uint64_t i = 0; i < k; i++)
            if (first + i < MAX_ITEMS)
                atomic_store_explicit(&w->owner_of[first + i], (w->id << 32 | (seq + i)) + 1,
                                      memory_order_relaxed);
        seq += k;
        if (seq % 256 < k) sched_yield(); /* let samplers run on a busy machine too */
    }
    atomic_fetch_add(w->writers_done, 1);
    return NULL;
}

static void *sampler_main(void *arg) {
    worker_t *w = arg;
    record_t out[16];
    uint64_t positions[16], rng[4], state = w->seed;
    double probabilities[16], priorities[16];
    rb_seed(rng, w->seed);
    for (;;) {
        bool last = atomic_load(w->writers_done) == (int)w->items; /* items: the writer count here */
        uint64_t n = 1 + next_random(&state) % 16;
        uint64_t recent = next_random(&state) % 3 == 0 ? 1 + next_random(&state) % 8 : 0;
        int64_t got = rb_sample(w->mem, rng, out, positions, w->prioritized ? probabilities : NULL,
                                n, recent, 0);
        if (got < 0) FAIL("rb_sample returned %" PRId64, got);
        for (int64_t i = 0; i < got; i++) {
            if (!intact(&out[i])) FAIL("torn record at position %" PRIu64, positions[i]);
            uint64_t owner = positions[i] < MAX_ITEMS
                ? atomic_load_explicit(&w->owner_of[positions[i]], memory_order_relaxed) : 0;
            /* The writer records its positions after rb_add returns: known, or not yet. */
            if (owner && owner - 1 != (out[i].source << 32 | out[i].seq))
                FAIL("position %" PRIu64 " returned another position's record", positions[i]);
            if (w->prioritized && !(probabilities[i] > 0 && probabilities[i] <= 1))
                FAIL("probability %g", probabilities[i]);
            priorities[i] = (double)(next_random(&state) % 1000) / 100.0;
        }
        w->draws += (uint64_t)got;
        if (w->prioritized && got > 0) w->updates += rb_update_priorities(w->mem, positions, priorities, (uint64_t)got);
        if (last) return NULL;
    }
}

static _Atomic int watchdog_done;
static void *watchdog_main(void *arg) {
    int64_t limit = (int64_t)(uintptr_t)arg * 1000000000ll, start = now_ns();
    while (!atomic_load(&watchdog_done)) {
        if (now_ns() - start > limit) {
            fprintf(stderr, "FAIL: not done after %lld s: something wedged\n",
                    (long long)(limit / 1000000000ll));
            _exit(2);
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static int run_round(int round, uint64_t capacity, int prioritized, uint64_t items, int writers,
                     int samplers) {
    void *mem = new_buffer(capacity, prioritized, 0);
    _Atomic uint64_t *owner_of = calloc(MAX_ITEMS, sizeof *owner_of);
    _Atomic int writers_done = 0;
    worker_t w[MAX_THREADS];
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < writers + samplers; i++) {
        bool writer = i < writers;
        w[i] = (worker_t){mem, (uint64_t)i, writer ? items : (uint64_t)writers,
                          0x1234567ull * (uint64_t)(i + 1) + (uint64_t)round, owner_of, 0, 0,
                          &writers_done, prioritized};
        pthread_create(&t[i], NULL, writer ? writer_main : sampler_main, &w[i]);
    }
    uint64_t draws = 0, updates = 0;
    for (int i = 0; i < writers + samplers; i++) {
        pthread_join(t[i], NULL);
        draws += w[i].draws;
        updates += w[i].updates;
    }
    rb_stats_t s;
    rb_stats(mem, &s);
    if (s.claimed != (uint64_t)writers * items) FAIL("claimed %" PRIu64, s.claimed);
    if (s.added + s.dropped != s.claimed)
        FAIL("added %" PRIu64 " + dropped %" PRIu64 " != claimed %" PRIu64, s.added, s.dropped, s.claimed);
    if (s.size == 0 || s.size > capacity) FAIL("size %" PRIu64, s.size);
    if (s.sampled != draws) FAIL("sampled %" PRIu64 " != draws %" PRIu64, s.sampled, draws);
    if (prioritized) {
        double leaves = rb_leaf_sum(mem);
        if (fabs(s.total_priority - leaves) > 1e-9 * (leaves > 1 ? leaves : 1))
            FAIL("tree root %.17g != sum of leaves %.17g", s.total_priority, leaves);
    }
    printf("round %d (capacity %" PRIu64 ", %s): %" PRIu64 " added, %" PRIu64 " dropped, %" PRIu64
           " drawn, %" PRIu64 " priority updates: ok\n", round, capacity,
           prioritized ? "prioritized" : "uniform", s.added, s.dropped, draws, updates);
    free((void *)owner_of);
    free_buffer(mem);
    return 0;
}

/* ---- samplers racing near max_times_sampled ---- */

#define LIMIT_RECORDS 48
#define LIMIT_TIMES 3

typedef struct {
    void *mem;
    uint64_t seed;
    uint64_t returned[LIMIT_RECORDS]; /* draws of each position returned to this sampler */
} limit_worker_t;

static void *limit_sampler_main(void *arg) {
    limit_worker_t *w = arg;
    record_t out[12];
    uint64_t positions[12], rng[4], state = w->seed;
    double probabilities[12];
    rb_seed(rng, w->seed);
    for (int misses = 0; misses < 200;) {
        uint64_t n = 1 + next_random(&state) % 12;
        int64_t got = rb_sample(w->mem, rng, out, positions, probabilities, n, 0, 0);
        if (got != 0 && got != (int64_t)n) FAIL("a batch of %" PRIu64 " returned %" PRId64, n, got);
        misses += got == 0;
        for (int64_t i = 0; i < got; i++) {
            if (!intact(&out[i]) || positions[i] >= LIMIT_RECORDS) FAIL("bad draw");
            w->returned[positions[i]]++;
        }
    }
    return NULL;
}

static void limit_round(int prioritized, int samplers) {
    void *mem = new_buffer(LIMIT_RECORDS, prioritized, LIMIT_TIMES);
    record_t batch[LIMIT_RECORDS];
    for (uint64_t i = 0; i < LIMIT_RECORDS; i++) fill(&batch[i], 0, i);
    rb_add(mem, batch, LIMIT_RECORDS);
    limit_worker_t w[MAX_THREADS] = {0};
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < samplers; i++) {
        w[i].mem = mem;
        w[i].seed = 0x9876543ull * (uint64_t)(i + 1) + (uint64_t)prioritized;
        pthread_create(&t[i], NULL, limit_sampler_main, &w[i]);
    }
    uint64_t returned[LIMIT_RECORDS] = {0}, total = 0;
    for (int i = 0; i < samplers; i++) {
        pthread_join(t[i], NULL);
        for (int p = 0; p < LIMIT_RECORDS; p++) returned[p] += w[i].returned[p];
    }
    for (int p = 0; p < LIMIT_RECORDS; p++) total += returned[p];
    rb_stats_t s;
    rb_stats(mem, &s);
    if (s.sampled != total) FAIL("sampled %" PRIu64 " != draws returned %" PRIu64, s.sampled, total);
    /* Drain: every draw not returned is still there, and nothing more. */
    record_t one;
    uint64_t position, rng[4];
    double probability;
    rb_seed(rng, 7);
    while (rb_sample(mem, rng, &one, &position, &probability, 1, 0, 0) == 1) returned[position]++;
    for (int p = 0; p < LIMIT_RECORDS; p++)
        if (returned[p] != LIMIT_TIMES)
            FAIL("record %d was drawn %" PRIu64 " times, not max_times_sampled = %d", p,
                 returned[p], LIMIT_TIMES);
    if (prioritized && s.total_priority < 0) FAIL("negative tree");
    if (prioritized) {
        rb_stats(mem, &s);
        if (fabs(s.total_priority) > 1e-9) FAIL("retired records left %g in the tree", s.total_priority);
    }
    printf("max_times_sampled race (%s, %d samplers): %" PRIu64 " draws returned while racing: ok\n",
           prioritized ? "prioritized" : "uniform", samplers, total);
    free_buffer(mem);
}

static uint64_t arg(int argc, char **argv, int i, uint64_t fallback) {
    return argc > i ? strtoull(argv[i], NULL, 10) : fallback;
}

int main(int argc, char **argv) {
    uint64_t items = arg(argc, argv, 1, 20000), rounds = arg(argc, argv, 2, 6);
    int writers = (int)arg(argc, argv, 3, 3), samplers = (int)arg(argc, argv, 4, 2);
    if (writers < 1 || samplers < 1 || writers + samplers > MAX_THREADS || items * writers > MAX_ITEMS)
        FAIL("usage: stress_rb [items_per_writer [rounds [writers [samplers]]]] within limits");
    hook_scenarios();
    limit_round(0, samplers + 1);
    limit_round(1, samplers + 1);
    pthread_t watchdog;
    pthread_create(&watchdog, NULL, watchdog_main, (void *)(uintptr_t)120);
    static const uint64_t capacities[] = {1, 3, 8, 64};
    for (uint64_t r = 0; r < rounds; r++)
        run_round((int)r, capacities[r % 4], (int)(r / 4 + r) % 2, items, writers, samplers);
    atomic_store(&watchdog_done, 1);
    pthread_join(watchdog, NULL);
    printf("OK\n");
    return 0;
}
