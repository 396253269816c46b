/*
 * Stress test for rq: P producer threads and C consumer threads move records through a
 * small queue with single and batch operations, blocking and non-blocking, and the
 * queue is closed either after the producers finish or while they are still pushing.
 *
 * Checked after every round:
 *   - every record a producer was told it pushed is popped exactly once, and nothing else;
 *   - each consumer sees each producer's records in increasing order;
 *   - no record is torn (each carries a checksum of its own fields);
 *   - the queue is empty and nothing was skipped or lost.
 *
 * Before the rounds, a few scenarios of the dead-producer and dead-consumer policies run
 * with threads that stop or end inside rq_push or rq_pop (through the RQ_TEST_HOOKS
 * points of rq.c): a producer thread that ends between its claim and its publication
 * stands for a producer process killed there, and a consumer thread that ends between
 * its claim and the release of its slots for a consumer process killed there.
 *
 * rq.c is included directly, so its static functions are compiled with the same flags
 * (the `tsan` target builds this file with -fsanitize=thread).
 *
 *   usage: stress [items_per_producer [rounds [producers [consumers]]]]
 */
#define RQ_TEST_HOOKS
#include "rq.c"

#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>

#define MAX_THREADS 64
#define MAX_BATCH 17

#define STRESS_PAYLOAD 40 /* a record larger than one word, to catch torn copies */
#include "stress_record.h"

/* A timeout for one call: mostly non-blocking or short, sometimes unlimited; always
 * unlimited in a blocking round, where a lost wake-up would leave a thread asleep for
 * good (the watchdog in run_round reports it). */
static int64_t pick_timeout(uint64_t *rng, bool blocking) {
    if (blocking) return -1;
    switch (next_random(rng) % 4) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 100000;   /* 0.1 ms */
    default: return 2000000; /* 2 ms */
    }
}

typedef struct {
    void *queue;
    uint64_t id, items, producers;
    uint64_t pushed;      /* records this producer was told it pushed (a prefix) */
    uint64_t closed_seen; /* rq_push returned RQ_CLOSED */
    uint64_t *counts;     /* consumers: counts[producer * items + seq] */
    uint64_t *last;       /* consumers: last seq + 1 seen from each producer */
    uint64_t popped;
    bool failed, blocking;
    _Atomic uint64_t *total_popped;
    uint64_t rng;
} worker_t;

static void *producer_main(void *arg) {
    worker_t *w = arg;
    record_t batch[MAX_BATCH];
    uint64_t seq = 0;
    while (seq < w->items) {
        uint64_t n = next_random(&w->rng) % 3 == 0 ? 1 : 1 + next_random(&w->rng) % MAX_BATCH;
        if (n > w->items - seq) n = w->items - seq;
        for (uint64_t i = 0; i < n; i++) fill(&batch[i], w->id, seq + i);
        int64_t r = rq_push(w->queue, batch, n, pick_timeout(&w->rng, w->blocking));
        if (r == RQ_CLOSED) {
            w->closed_seen = 1;
            break;
        }
        if (r < 0 || (uint64_t)r > n) {
            fprintf(stderr, "producer %" PRIu64 ": rq_push returned %" PRId64 " for %" PRIu64 "\n",
                    w->id, r, n);
            w->failed = true;
            break;
        }
        seq += (uint64_t)r;
        if (r == 0) sched_yield();
    }
    w->pushed = seq;
    return NULL;
}

/* Record i of a loan that starts at `slot` (rq.h, rq_borrow). */
static const record_t *lent_record(const char *records, uint64_t stride, uint64_t slot, int64_t i) {
    return (const record_t *)(records + (slot + (uint64_t)i) * stride);
}

/* Half of a consumer's calls pop records into `out`, half borrow them and read them in
 * their slots (rq_borrow), releasing them once checked. */
static void *consumer_main(void *arg) {
    worker_t *w = arg;
    record_t out[MAX_BATCH];
    uint64_t stride = rq_slot_bytes(w->queue);
    const char *records = (const char *)w->queue + rq_records_offset(w->queue);
    for (;;) {
        uint64_t n = 1 + next_random(&w->rng) % MAX_BATCH, slot = 0;
        bool borrow = next_random(&w->rng) % 2;
        int64_t timeout = pick_timeout(&w->rng, w->blocking);
        int64_t r = borrow ? rq_borrow(w->queue, n, timeout, &slot) : rq_pop(w->queue, out, n, timeout);
        if (r == RQ_CLOSED) break;
        if (r < 0 || (uint64_t)r > n) {
            fprintf(stderr, "consumer %" PRIu64 ": %s returned %" PRId64 " for %" PRIu64 "\n",
                    w->id, borrow ? "rq_borrow" : "rq_pop", r, n);
            w->failed = true;
            return NULL;
        }
        for (int64_t i = 0; i < r; i++) {
            const record_t *rec = borrow ? lent_record(records, stride, slot, i) : &out[i];
            if (!intact(rec) || rec->source >= w->producers || rec->seq >= w->items) {
                fprintf(stderr, "consumer %" PRIu64 ": torn or foreign record (%" PRIu64 ", %" PRIu64 ")\n",
                        w->id, rec->source, rec->seq);
                w->failed = true;
                return NULL;
            }
            if (rec->seq < w->last[rec->source]) {
                fprintf(stderr, "consumer %" PRIu64 ": producer %" PRIu64 "'s record %" PRIu64
                        " after %" PRIu64 "\n", w->id, rec->source, rec->seq, w->last[rec->source] - 1);
                w->failed = true;
                return NULL;
            }
            w->last[rec->source] = rec->seq + 1;
            w->counts[rec->source * w->items + rec->seq]++;
        }
        /* Lent records are still intact after they were read: no producer wrote into a
         * slot before its release. */
        for (int64_t i = 0; borrow && i < r; i++)
            if (!intact(lent_record(records, stride, slot, i))) {
                fprintf(stderr, "consumer %" PRIu64 ": a lent record changed before its release\n", w->id);
                w->failed = true;
                return NULL;
            }
        if (borrow && r > 0 && rq_release(w->queue) != r) {
            fprintf(stderr, "consumer %" PRIu64 ": rq_release did not release %" PRId64 "\n", w->id, r);
            w->failed = true;
            return NULL;
        }
        w->popped += (uint64_t)r;
        /* Relaxed: only a progress hint for the thread that closes the queue early. */
        atomic_fetch_add_explicit(w->total_popped, (uint64_t)r, memory_order_relaxed);
    }
    return NULL;
}

/* ---- dead-producer and dead-consumer scenarios ---- */

/* What a thread does at the hook points of rq_push (claim: CAS on tail; copy: write a
 * record) or rq_pop (claim: CAS on head; copy: read a record out); set per thread. */
typedef struct {
    int die_after_copies;   /* >= 0: end the thread once it has copied this many records */
    int copies;             /* records this thread started copying so far */
    _Atomic int *at_claim;  /* pause before the first claim: set this, ... */
    _Atomic int *go_claim;  /* ... then wait for this */
    _Atomic int *at_copy;   /* pause before copying the first record: set this, ... */
    _Atomic int *go_copy;   /* ... then wait for this */
} plan_t;

static _Thread_local plan_t *plan;

static void wait_flag(_Atomic int *flag) {
    while (!atomic_load(flag)) sched_yield();
}

void rq_test_hook(int point, uint64_t pos) {
    (void)pos;
    if (!plan) return;
    if ((point == RQ_HOOK_CLAIMING || point == RQ_HOOK_TAKING) && plan->at_claim) {
        _Atomic int *at = plan->at_claim;
        plan->at_claim = NULL; /* only the first claim */
        atomic_store(at, 1);
        wait_flag(plan->go_claim);
    }
    if (point == RQ_HOOK_WRITING || point == RQ_HOOK_READING) {
        if (plan->at_copy) {
            _Atomic int *at = plan->at_copy;
            plan->at_copy = NULL;
            atomic_store(at, 1);
            wait_flag(plan->go_copy);
        }
        if (plan->copies++ == plan->die_after_copies) pthread_exit(NULL); /* dies holding its claim */
    }
}

typedef struct {
    void *queue;
    plan_t plan;
    uint64_t first, n;     /* push records (0, first) .. (0, first + n - 1) in one call */
    int64_t timeout_ns;
    int64_t result;
    _Atomic int *finish;   /* if set, stay alive (after pushing) until it is set */
} pusher_t;

static void *pusher_main(void *arg) {
    pusher_t *p = arg;
    record_t batch[MAX_BATCH];
    for (uint64_t i = 0; i < p->n; i++) fill(&batch[i], 0, p->first + i);
    plan = &p->plan;
    p->result = rq_push(p->queue, batch, p->n, p->timeout_ns);
    plan = NULL;
    if (p->finish) wait_flag(p->finish);
    return NULL;
}

static pusher_t pusher(void *q, uint64_t first, uint64_t n, int64_t timeout_ns) {
    return (pusher_t){.queue = q, .first = first, .n = n, .timeout_ns = timeout_ns,
                      .plan = {.die_after_copies = -1}};
}

typedef struct {
    void *queue;
    plan_t plan;
    uint64_t n;            /* pop up to n records, calling again while none came ... */
    int64_t timeout_ns;    /* ... until this has passed (one call when it is 0) */
    int64_t result;
    _Atomic int returned;  /* set once rq_pop has returned */
    record_t out[MAX_BATCH];
    _Atomic int *finish;   /* if set, stay alive (after popping) until it is set */
} popper_t;

static void *popper_main(void *arg) {
    popper_t *p = arg;
    plan = &p->plan;
    int64_t deadline = now_ns() + p->timeout_ns;
    do p->result = rq_pop(p->queue, p->out, p->n, p->timeout_ns);
    while (p->result == 0 && now_ns() < deadline);
    atomic_store(&p->returned, 1);
    plan = NULL;
    if (p->finish) wait_flag(p->finish);
    return NULL;
}

static popper_t popper(void *q, uint64_t n, int64_t timeout_ns) {
    return (popper_t){.queue = q, .n = n, .timeout_ns = timeout_ns, .plan = {.die_after_copies = -1}};
}

/* Push records (0, first) .. (0, first + n - 1) from this thread, calling again while
 * nothing moved and `limit_ns` has not passed (one call when it is 0). */
static int64_t push_records(void *q, uint64_t first, uint64_t n, int64_t limit_ns) {
    record_t batch[MAX_BATCH];
    for (uint64_t i = 0; i < n; i++) fill(&batch[i], 0, first + i);
    int64_t deadline = now_ns() + limit_ns, pushed;
    do pushed = rq_push(q, batch, n, limit_ns);
    while (pushed == 0 && now_ns() < deadline);
    return pushed;
}

/* Pop with short waits until a record arrives, RQ_CLOSED, or `limit_ns` passes.
 * Returns the pop's result; *seq is the record's sequence number. */
static int64_t pop_within(void *q, int64_t limit_ns, uint64_t *seq) {
    int64_t deadline = now_ns() + limit_ns;
    record_t r;
    for (;;) {
        int64_t got = rq_pop(q, &r, 1, 5000000);
        if (got == 1) {
            if (!intact(&r)) return -100;
            *seq = r.seq;
        }
        if (got != 0 || now_ns() > deadline) return got;
    }
}

#define EXPECT(cond, ...)                                                          \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s: ", name);                                         \
            fprintf(stderr, __VA_ARGS__);                                          \
            fprintf(stderr, "\n");                                                 \
            errors++;                                                              \
            goto done;                                                             \
        }                                                                          \
    } while (0)

static void *new_queue(uint64_t capacity) {
    void *q = aligned_alloc(LINE, round_up(rq_queue_bytes(capacity, sizeof(record_t)), LINE));
    if (!q || rq_queue_init(q, capacity, sizeof(record_t)) != RQ_OK) {
        fprintf(stderr, "cannot set up a queue of capacity %" PRIu64 "\n", capacity);
        exit(1);
    }
    return q;
}

/* A producer that ends after publishing the first record of a claim of three: the first
 * comes out, the other two are skipped, and the queue goes on. */
static int dead_in_batch(void) {
    const char *name = "a producer dying inside a batch";
    int errors = 0;
    void *q = new_queue(4);
    pusher_t b = pusher(q, 0, 3, 0);
    b.plan.die_after_copies = 1;
    pthread_t t;
    pthread_create(&t, NULL, pusher_main, &b);
    pthread_join(t, NULL);
    uint64_t seq = 99;
    EXPECT(pop_within(q, 2000000000, &seq) == 1 && seq == 0, "the published record did not come out");
    EXPECT(rq_size(q) == 2, "size %" PRIu64 ", expected the 2 claimed slots", rq_size(q));
    pusher_t c = pusher(q, 3, 1, 0);
    pthread_create(&t, NULL, pusher_main, &c);
    pthread_join(t, NULL);
    EXPECT(c.result == 1, "a new producer could not push: %" PRId64, c.result);
    EXPECT(pop_within(q, 2000000000, &seq) == 1 && seq == 3,
           "the record after the dead claim did not come out (skipped %" PRIu64 ")", atomic_load(&((header_t *)q)->skipped));
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.skipped == 2, "skipped %" PRIu64 ", expected 2", st.skipped);
    rq_close(q);
    EXPECT(pop_within(q, 1000000000, &seq) == RQ_CLOSED, "closed and drained, but pop did not say so");
done:
    free(q);
    return errors;
}

/* A producer that is alive but slow between its claim and its publication is waited
 * for, however long it takes: its record is never skipped. */
static int live_slow_producer(void) {
    const char *name = "a live producer slow to publish";
    int errors = 0;
    void *q = new_queue(2);
    _Atomic int at_write = 0, go_write = 0;
    pusher_t b = pusher(q, 0, 1, 0);
    b.plan.at_copy = &at_write;
    b.plan.go_copy = &go_write;
    pthread_t t;
    pthread_create(&t, NULL, pusher_main, &b);
    wait_flag(&at_write);
    uint64_t seq = 99;
    int64_t got = pop_within(q, 10 * STUCK_NS, &seq);
    atomic_store(&go_write, 1);
    pthread_join(t, NULL);
    EXPECT(got == 0, "pop returned %" PRId64 " while the only record was being written", got);
    EXPECT(pop_within(q, 2000000000, &seq) == 1 && seq == 0, "the slow record did not come out");
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.skipped == 0, "a live producer's record was skipped");
done:
    free(q);
    return errors;
}

/*
 * Producer A announces its intent for position p, then loses the claim to producer B,
 * which ends before publishing p. A finds the queue full (or closed) and returns without
 * a claim; it stays alive. The slot at p must still be skipped: A owns nothing there.
 */
static int lost_race_then_owner_died(bool close_queue) {
    const char *name = close_queue ? "a producer that lost a claim and found the queue closed"
                                   : "a producer that lost a claim and found the queue full";
    int errors = 0;
    void *q = new_queue(1);
    _Atomic int at_claim = 0, go_claim = 0, finish = 0;
    pusher_t a = pusher(q, 100, 1, 0), b = pusher(q, 0, 1, 0);
    a.plan.at_claim = &at_claim;
    a.plan.go_claim = &go_claim;
    a.finish = &finish;
    b.plan.die_after_copies = 0;
    pthread_t ta, tb;
    pthread_create(&ta, NULL, pusher_main, &a);
    wait_flag(&at_claim);               /* A has announced position 0 and not claimed it */
    pthread_create(&tb, NULL, pusher_main, &b);
    pthread_join(tb, NULL);             /* B claimed position 0 and ended there */
    if (close_queue) rq_close(q);
    atomic_store(&go_claim, 1);         /* A's claim fails: full, or closed */
    uint64_t seq = 99;
    int64_t got;
    if (close_queue) {
        got = pop_within(q, 2000000000, &seq);
        EXPECT(got == RQ_CLOSED, "pop returned %" PRId64 " instead of RQ_CLOSED: the dead claim "
               "was not skipped", got);
    } else {
        /* Nothing comes out (the skipped slot holds no record): pop until it is gone. */
        int64_t deadline = now_ns() + 2000000000;
        record_t r;
        got = 0;
        while (got == 0 && rq_size(q) != 0 && now_ns() < deadline) got = rq_pop(q, &r, 1, 5000000);
        EXPECT(got == 0 && rq_size(q) == 0, "the dead claim was not skipped (pop %" PRId64 ", size %"
               PRIu64 ")", got, rq_size(q));
        pusher_t c = pusher(q, 7, 1, 1000000000);
        pthread_t tc;
        pthread_create(&tc, NULL, pusher_main, &c);
        pthread_join(tc, NULL);
        EXPECT(c.result == 1, "push after the skip returned %" PRId64, c.result);
        EXPECT(pop_within(q, 2000000000, &seq) == 1 && seq == 7, "the record after the skip did not come out");
    }
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.skipped == 1, "skipped %" PRIu64 ", expected 1", st.skipped);
done:
    atomic_store(&go_claim, 1);
    atomic_store(&finish, 1);
    pthread_join(ta, NULL);
    if (!errors && a.result != (close_queue ? RQ_CLOSED : 0)) {
        fprintf(stderr, "%s: A's push returned %" PRId64 "\n", name, a.result);
        errors++;
    }
    free(q);
    return errors;
}

static int dead_producer_scenarios(void) {
    int errors = dead_in_batch() + live_slow_producer() + lost_race_then_owner_died(false) +
                 lost_race_then_owner_died(true);
    printf("dead-producer scenarios: %s\n", errors ? "FAILED" : "ok");
    return errors;
}

/* Pop exactly `n` records from this thread within two seconds and check that they are
 * (0, first) .. (0, first + n - 1). */
static bool pop_exactly(void *q, uint64_t first, uint64_t n) {
    uint64_t seq;
    for (uint64_t i = 0; i < n; i++)
        if (pop_within(q, 2000000000, &seq) != 1 || seq != first + i) return false;
    return true;
}

/* A consumer that ends after reading the first record of a claim of three: the first
 * record is its own (gone with it), the other two slots stay held until a producer that
 * finds the queue full there releases them and counts those two records as lost. */
static int dead_consumer_in_batch(void) {
    const char *name = "a consumer dying inside a batch";
    int errors = 0;
    void *q = new_queue(4);
    EXPECT(push_records(q, 0, 3, 0) == 3, "could not fill the queue");
    popper_t c = popper(q, 3, 0);
    c.plan.die_after_copies = 1;
    pthread_t t;
    pthread_create(&t, NULL, popper_main, &c);
    pthread_join(t, NULL);
    EXPECT(push_records(q, 3, 2, 0) == 2, "the slots before the held ones were not free");
    int64_t started = now_ns();
    int64_t pushed = push_records(q, 5, 1, 2000000000);
    EXPECT(pushed == 1, "a producer stayed wedged behind the dead consumer's slots (%" PRId64 ")", pushed);
    EXPECT(now_ns() - started >= STUCK_NS, "the held slot was released before its owner was checked");
    EXPECT(push_records(q, 6, 1, 0) == 1, "the second held slot was not released with the first");
    EXPECT(pop_exactly(q, 3, 4), "the records after the dead claim did not come out in order");
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.lost == 2 && st.skipped == 0, "lost %" PRIu64 ", skipped %" PRIu64 ", expected 2 and 0",
           st.lost, st.skipped);
done:
    free(q);
    return errors;
}

/* A consumer that is alive but slow to copy its record out is waited for, however long
 * it takes: its slot is never released under it. */
static int live_slow_consumer(void) {
    const char *name = "a live consumer slow to release";
    int errors = 0;
    void *q = new_queue(1);
    _Atomic int at_read = 0, go_read = 0;
    EXPECT(push_records(q, 0, 1, 0) == 1, "could not fill the queue");
    popper_t c = popper(q, 1, 0);
    c.plan.at_copy = &at_read;
    c.plan.go_copy = &go_read;
    pthread_t t;
    pthread_create(&t, NULL, popper_main, &c);
    wait_flag(&at_read);
    int64_t pushed = push_records(q, 1, 1, 10 * STUCK_NS);
    atomic_store(&go_read, 1);
    pthread_join(t, NULL);
    EXPECT(pushed == 0, "push returned %" PRId64 " while the only slot was being read", pushed);
    EXPECT(c.result == 1 && c.out[0].seq == 0 && intact(&c.out[0]), "the slow consumer lost its record");
    EXPECT(push_records(q, 1, 1, 1000000000) == 1, "push after the slow read did not go through");
    EXPECT(pop_exactly(q, 1, 1), "the next record did not come out");
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.lost == 0, "a live consumer's record was counted lost");
done:
    atomic_store(&go_read, 1);
    free(q);
    return errors;
}

/*
 * Consumer A announces its intent for position 0, then loses the claim to consumer B,
 * which ends before reading it. A finds the queue empty and returns; it stays alive. The
 * slot must still be released for the next lap: A owns nothing there.
 */
static int consumer_lost_race_then_owner_died(void) {
    const char *name = "a consumer that lost a claim to one that died";
    int errors = 0;
    void *q = new_queue(1);
    _Atomic int at_claim = 0, go_claim = 0, finish = 0;
    popper_t a = popper(q, 1, 0), b = popper(q, 1, 0);
    a.plan.at_claim = &at_claim;
    a.plan.go_claim = &go_claim;
    a.finish = &finish;
    b.plan.die_after_copies = 0;
    pthread_t ta, tb;
    EXPECT(push_records(q, 0, 1, 0) == 1, "could not fill the queue");
    pthread_create(&ta, NULL, popper_main, &a);
    wait_flag(&at_claim);               /* A has announced position 0 and not claimed it */
    pthread_create(&tb, NULL, popper_main, &b);
    pthread_join(tb, NULL);             /* B claimed position 0 and ended there */
    atomic_store(&go_claim, 1);         /* A's claim fails; it finds the queue empty */
    wait_flag(&a.returned);
    EXPECT(push_records(q, 1, 1, 2000000000) == 1, "the dead consumer's slot was not released");
    EXPECT(pop_exactly(q, 1, 1), "the record after the release did not come out");
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.lost == 1, "lost %" PRIu64 ", expected 1", st.lost);
done:
    atomic_store(&go_claim, 1);
    atomic_store(&finish, 1);
    pthread_join(ta, NULL);
    if (!errors && a.result != 0) {
        fprintf(stderr, "%s: A's pop returned %" PRId64 "\n", name, a.result);
        errors++;
    }
    free(q);
    return errors;
}

/* A consumer that dies holding a slot skipped after its producer died: the slot is
 * released, and counted as skipped, not lost (it held no record). */
static int dead_consumer_holding_a_skipped_slot(void) {
    const char *name = "a consumer dying on a skipped slot";
    int errors = 0;
    void *q = new_queue(2);
    pusher_t p = pusher(q, 0, 2, 0);
    p.plan.die_after_copies = 1;        /* publishes position 0, dies holding position 1 */
    popper_t c = popper(q, 1, 2000000000);
    c.plan.die_after_copies = 0;        /* claims the skipped position 1, dies there */
    pthread_t t;
    pthread_create(&t, NULL, pusher_main, &p);
    pthread_join(t, NULL);
    EXPECT(pop_exactly(q, 0, 1), "the published record did not come out");
    pthread_create(&t, NULL, popper_main, &c);
    pthread_join(t, NULL);
    rq_stats_t st;
    rq_stats(q, &st);
    EXPECT(st.skipped == 1 && rq_size(q) == 0, "the dead producer's slot was not skipped and "
           "claimed (skipped %" PRIu64 ", size %" PRIu64 ")", st.skipped, rq_size(q));
    EXPECT(push_records(q, 2, 1, 0) == 1, "the slot before the held one was not free");
    EXPECT(push_records(q, 3, 1, 2000000000) == 1, "the slot held by the dead consumer was not released");
    EXPECT(pop_exactly(q, 2, 2), "the records after the release did not come out");
    rq_stats(q, &st);
    EXPECT(st.lost == 0 && st.skipped == 1, "lost %" PRIu64 ", skipped %" PRIu64 ", expected 0 and 1",
           st.lost, st.skipped);
done:
    free(q);
    return errors;
}

static int dead_consumer_scenarios(void) {
    int errors = dead_consumer_in_batch() + live_slow_consumer() +
                 consumer_lost_race_then_owner_died() + dead_consumer_holding_a_skipped_slot();
    printf("dead-consumer scenarios: %s\n", errors ? "FAILED" : "ok");
    return errors;
}

/* Watchdog: fails the run if no record moves for this long during a round. */
#ifndef STALL_S
#define STALL_S 30
#endif

typedef struct {
    _Atomic uint64_t *total_popped;
    _Atomic int done;
    int round;
} watchdog_t;

static void *watchdog_main(void *arg) {
    watchdog_t *w = arg;
    uint64_t last = atomic_load(w->total_popped);
    int still = 0;
    while (!atomic_load(&w->done)) {
        struct timespec tick = {0, 100000000}; /* 0.1 s */
        nanosleep(&tick, NULL);
        uint64_t now = atomic_load(w->total_popped);
        still = now == last ? still + 1 : 0;
        last = now;
        if (still >= STALL_S * 10) {
            fprintf(stderr, "round %d: no record moved for %d s: a thread sleeps that should "
                    "have been woken\n", w->round, STALL_S);
            abort();
        }
    }
    return NULL;
}

typedef struct {
    uint64_t capacity;
    bool close_early; /* close while the producers push, not after */
    bool blocking;    /* every call waits without a time limit */
} round_t;

static int run_round(int round, round_t config, uint64_t producers, uint64_t consumers,
                     uint64_t items) {
    uint64_t capacity = config.capacity;
    bool close_early = config.close_early;
    int64_t started = now_ns();
    uint64_t bytes = rq_queue_bytes(capacity, sizeof(record_t));
    void *q = aligned_alloc(LINE, round_up(bytes, LINE));
    if (!q || rq_queue_init(q, capacity, sizeof(record_t)) != RQ_OK) {
        fprintf(stderr, "round %d: cannot set up a queue of capacity %" PRIu64 "\n", round, capacity);
        return 1;
    }
    _Atomic uint64_t total_popped = 0;
    worker_t prod[MAX_THREADS], cons[MAX_THREADS];
    pthread_t prod_t[MAX_THREADS], cons_t[MAX_THREADS];
    watchdog_t watchdog = {.total_popped = &total_popped, .round = round};
    pthread_t watchdog_t_;
    pthread_create(&watchdog_t_, NULL, watchdog_main, &watchdog);
    for (uint64_t i = 0; i < consumers; i++) {
        cons[i] = (worker_t){.queue = q, .id = i, .items = items, .producers = producers,
                             .total_popped = &total_popped, .blocking = config.blocking,
                             .rng = 0x1234567ull * (i + 1) + (uint64_t)round};
        cons[i].counts = calloc(producers * items, sizeof(uint64_t));
        cons[i].last = calloc(producers, sizeof(uint64_t));
        if (!cons[i].counts || !cons[i].last) { fprintf(stderr, "out of memory\n"); return 1; }
        pthread_create(&cons_t[i], NULL, consumer_main, &cons[i]);
    }
    for (uint64_t i = 0; i < producers; i++) {
        prod[i] = (worker_t){.queue = q, .id = i, .items = items, .producers = producers,
                             .blocking = config.blocking, .rng = 0x9876543ull * (i + 1) + (uint64_t)round};
        pthread_create(&prod_t[i], NULL, producer_main, &prod[i]);
    }
    if (close_early) {
        /* Close while the producers are still pushing: once about a third has moved. */
        while (atomic_load_explicit(&total_popped, memory_order_relaxed) < producers * items / 3)
            sched_yield();
        rq_close(q);
    }
    for (uint64_t i = 0; i < producers; i++) pthread_join(prod_t[i], NULL);
    if (!close_early) rq_close(q);
    for (uint64_t i = 0; i < consumers; i++) pthread_join(cons_t[i], NULL);
    double seconds = (double)(now_ns() - started) / 1e9;
    atomic_store(&watchdog.done, 1);
    pthread_join(watchdog_t_, NULL);

    int errors = 0;
    uint64_t expected = 0, popped = 0;
    for (uint64_t i = 0; i < producers; i++) {
        errors += prod[i].failed;
        expected += prod[i].pushed;
        if (!close_early && prod[i].pushed != items) {
            fprintf(stderr, "round %d: producer %" PRIu64 " pushed %" PRIu64 " of %" PRIu64 " before close\n",
                    round, i, prod[i].pushed, items);
            errors++;
        }
    }
    for (uint64_t i = 0; i < consumers; i++) errors += cons[i].failed, popped += cons[i].popped;
    for (uint64_t p = 0; p < producers && !errors; p++) {
        for (uint64_t s = 0; s < items; s++) {
            uint64_t seen = 0;
            for (uint64_t c = 0; c < consumers; c++) seen += cons[c].counts[p * items + s];
            uint64_t want = s < prod[p].pushed ? 1 : 0;
            if (seen != want) {
                fprintf(stderr, "round %d: producer %" PRIu64 "'s record %" PRIu64 " seen %" PRIu64
                        " times, expected %" PRIu64 "\n", round, p, s, seen, want);
                errors++;
                break;
            }
        }
    }
    rq_stats_t stats;
    rq_stats(q, &stats);
    if (rq_size(q) != 0 || stats.skipped != 0 || stats.lost != 0 || popped != expected) {
        fprintf(stderr, "round %d: size %" PRIu64 ", skipped %" PRIu64 ", lost %" PRIu64 ", popped %"
                PRIu64 " of %" PRIu64 "\n", round, rq_size(q), stats.skipped, stats.lost, popped, expected);
        errors++;
    }
    /* Closed and drained: both sides say so. */
    record_t r;
    fill(&r, 0, 0);
    if (rq_push(q, &r, 1, 0) != RQ_CLOSED || rq_pop(q, &r, 1, 0) != RQ_CLOSED ||
        rq_pop(q, &r, 1, 1000000) != RQ_CLOSED || !rq_is_closed(q)) {
        fprintf(stderr, "round %d: a closed, drained queue does not report RQ_CLOSED\n", round);
        errors++;
    }
    printf("round %d: capacity %" PRIu64 ", %" PRIu64 "x%" PRIu64 ", %s close, %" PRIu64
           " records, full waits %" PRIu64 ", empty waits %" PRIu64 ", %.2f s: %s\n",
           round, capacity, producers, consumers,
           close_early ? (config.blocking ? "blocking, early" : "early")
                       : (config.blocking ? "blocking, final" : "final"), popped,
           stats.full_waits, stats.empty_waits, seconds,
           errors ? "FAILED" : "ok");
    for (uint64_t i = 0; i < consumers; i++) free(cons[i].counts), free(cons[i].last);
    free(q);
    return errors;
}

static uint64_t arg(int argc, char **argv, int i, uint64_t fallback) {
    if (argc <= i) return fallback;
    char *end;
    unsigned long long v = strtoull(argv[i], &end, 10);
    if (*end || v == 0) {
        fprintf(stderr, "usage: %s [items_per_producer [rounds [producers [consumers]]]]\n", argv[0]);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines appear as rounds finish */
    uint64_t items = arg(argc, argv, 1, 200000);
    uint64_t rounds = arg(argc, argv, 2, 8);
    uint64_t producers = arg(argc, argv, 3, 4);
    uint64_t consumers = arg(argc, argv, 4, 3);
    if (producers > MAX_THREADS || consumers > MAX_THREADS) {
        fprintf(stderr, "at most %d producers and %d consumers\n", MAX_THREADS, MAX_THREADS);
        return 2;
    }
    static const round_t rounds_table[] = {
        {1, false, false}, {2, true, false}, {1, false, true}, {8, true, false},
        {3, false, false}, {2, true, true}, {64, false, false}, {5, false, true},
    };
    const uint64_t kinds = sizeof rounds_table / sizeof *rounds_table;
    int errors = dead_producer_scenarios() + dead_consumer_scenarios();
    for (uint64_t round = 0; round < rounds; round++)
        errors += run_round((int)round, rounds_table[round % kinds], producers, consumers, items);
    if (errors) {
        fprintf(stderr, "FAILED: %d errors\n", errors);
        return 1;
    }
    printf("OK\n");
    return 0;
}
