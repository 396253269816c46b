/*
 * rq: a bounded multi-producer multi-consumer queue of fixed-size records, and a
 * block of atomic counters, both living in a caller-provided memory region.
 *
 * The region holds no pointers, only offsets, so the same queue works between the
 * threads of one process and between processes that map the same shared memory at
 * different addresses. The algorithm is described step by step in native/README.md.
 *
 * This header is also what the cffi build script declares to Python, so it uses
 * only plain C types: the atomic layout lives in rq.c.
 */
#ifndef RQ_H
#define RQ_H

#include <stddef.h>
#include <stdint.h>

/* Return codes. Non-negative results of rq_push/rq_pop are record counts. */
#define RQ_OK 0
#define RQ_CLOSED -1            /* push: the queue is closed; pop: closed and drained */
#define RQ_TOO_MANY_PRODUCERS -2 /* more producer threads than RQ_MAX_PRODUCERS at once */
#define RQ_BAD_ARGUMENT -3       /* capacity or record size out of range */
#define RQ_BAD_HEADER -4         /* the region does not hold a queue of this version */
#define RQ_TOO_MANY_CONSUMERS -5 /* more consumer threads than RQ_MAX_CONSUMERS at once */
#define RQ_BORROWING -6          /* pop/borrow: this thread holds borrowed records */
#define RQ_NOT_BORROWING -7      /* release: this thread holds no borrowed records */

#define RQ_MAX_PRODUCERS 256               /* producer threads registered at once */
#define RQ_MAX_CONSUMERS 256               /* consumer threads registered at once */
#define RQ_MAX_RECORD_SIZE (16u << 20)     /* 16 MiB per record */
#define RQ_MAX_CAPACITY (1ull << 32)       /* records per queue */

/* Queue. `mem` is a region of at least rq_queue_bytes(...) bytes, aligned to 128. */
uint64_t rq_queue_bytes(uint64_t capacity, uint64_t record_size);
int rq_queue_init(void *mem, uint64_t capacity, uint64_t record_size);
int rq_queue_check(const void *mem, uint64_t mem_bytes, uint64_t capacity, uint64_t record_size);

/*
 * Move up to n records. timeout_ns: 0 never waits, < 0 waits without limit, > 0 waits
 * at most that long for the first record to fit (push) or arrive (pop).
 * Returns the number of records moved (0: none before the timeout, or the wait was
 * interrupted by a signal), or RQ_CLOSED, or RQ_TOO_MANY_PRODUCERS (push) or
 * RQ_TOO_MANY_CONSUMERS (pop).
 * rq_pop writes the records it returns contiguously to `out`; records skipped because
 * their producer died (see rq_stats) are not written and not counted.
 */
int64_t rq_push(void *mem, const void *records, uint64_t n, int64_t timeout_ns);
int64_t rq_pop(void *mem, void *out, uint64_t n, int64_t timeout_ns);

/*
 * Two-phase pop: lend up to n ready records in place instead of copying them out.
 * rq_borrow claims them as rq_pop does and returns their count, or 0, RQ_CLOSED,
 * RQ_TOO_MANY_CONSUMERS or RQ_BORROWING, as rq_pop. *slot is the first record's slot:
 * record i of the loan lies at mem + rq_records_offset(mem) + (*slot + i) *
 * rq_slot_bytes(mem) (a borrow never wraps around the ring, so it may lend fewer than
 * are ready). The records stay claimed, and producers cannot reuse their slots, until
 * the same thread calls rq_release, which returns the count released or
 * RQ_NOT_BORROWING. A thread holds one borrow at a time: meanwhile its pops and borrows
 * return RQ_BORROWING. A thread that dies holding a borrow is a consumer that died
 * holding claimed slots (native/README.md, "Dead consumers").
 */
int64_t rq_borrow(void *mem, uint64_t n, int64_t timeout_ns, uint64_t *slot);
int64_t rq_release(void *mem);
uint64_t rq_records_offset(const void *mem);
uint64_t rq_slot_bytes(const void *mem);

/* Close: later pushes return RQ_CLOSED, pops drain what is left. Wakes every waiter. */
void rq_close(void *mem);
int rq_is_closed(const void *mem);

/* Approximate number of records in the queue (exact when nothing is in flight). */
uint64_t rq_size(const void *mem);

/* Statistics: waits on full, waits on empty, slots skipped because their producer died
 * before publishing, and records lost because their consumer died after claiming them
 * and before releasing their slots (the queue released the slots for it). */
typedef struct {
    uint64_t full_waits;
    uint64_t empty_waits;
    uint64_t skipped;
    uint64_t lost;
} rq_stats_t;
void rq_stats(const void *mem, rq_stats_t *out);

/* Counters: n 64-bit cells, each on its own cache line. */
uint64_t rq_counters_bytes(uint64_t n);
int rq_counters_init(void *mem, uint64_t n);
int rq_counters_check(const void *mem, uint64_t mem_bytes, uint64_t n);
void rq_counter_add_int(void *mem, uint64_t index, int64_t value);
void rq_counter_add_float(void *mem, uint64_t index, double value);
void rq_counter_set_int(void *mem, uint64_t index, int64_t value);
void rq_counter_set_float(void *mem, uint64_t index, double value);
/* One cell's raw 64-bit value (a float cell holds the bits of a double). */
uint64_t rq_counter_load(const void *mem, uint64_t index);
/* Copies the raw 64-bit cells; float cells hold the bits of a double. */
void rq_counters_read(const void *mem, uint64_t *out, uint64_t n);

#endif
