/*
 * rb: a replay buffer of fixed-size records in a caller-provided memory region: a ring
 * that writers add to without waiting and samplers draw from at random, uniformly or
 * in proportion to priorities kept in a lock-free sum tree.
 *
 * Like rq.h, the region holds offsets, not pointers, so it works between threads and
 * between processes that map it at different addresses; and this header is also the
 * declaration cffi parses, so it uses only plain C types. The algorithm is described
 * step by step in native/README.md ("Replay buffers").
 */
#ifndef RB_H
#define RB_H

#include <stddef.h>
#include <stdint.h>

/* Return codes (negative); non-negative results are counts. */
#define RB_OK 0
#define RB_BAD_ARGUMENT -3 /* capacity, record size or a setting out of range */
#define RB_BAD_HEADER -4   /* the region does not hold a buffer of this version and shape */
#define RB_BAD_PRIORITY -5 /* rb_update_priorities_checked: a priority < 0, NaN or infinite */
#define RB_BAD_POSITION -6 /* rb_update_priorities_checked: a position not claimed yet */

#define RB_MAX_CAPACITY (1ull << 32)         /* records per buffer */
#define RB_MAX_RECORD_SIZE (16u << 20)       /* 16 MiB per record */
#define RB_MAX_TIMES_SAMPLED 65535           /* largest finite max_times_sampled */

/* Settings fixed when the buffer is made. 0 for max_times_sampled and samples_per_insert
 * means "no limit"; alpha is used only when prioritized is 1. */
typedef struct {
    uint64_t capacity;
    uint64_t record_size;
    int prioritized;
    double alpha;
    uint64_t max_times_sampled;
    double samples_per_insert;
    double error_buffer;
    uint64_t min_size_to_sample;
} rb_config_t;

uint64_t rb_bytes(const rb_config_t *config);
int rb_init(void *mem, const rb_config_t *config);
int rb_check(const void *mem, uint64_t mem_bytes, const rb_config_t *config);

/*
 * Add n records. One fetch-add on the write cursor claims positions [first, first + n);
 * then each slot is taken with a compare-and-swap of its stamp (which fails only against
 * a writer lapped in that slot), written and published, and the counters are bumped once
 * per call. The call never waits. Returns `first`. Of a batch longer than the capacity only the
 * last `capacity` records are written (the others would be overwritten by the batch
 * itself). New records of a prioritized buffer get the largest priority seen so far.
 */
uint64_t rb_add(void *mem, const void *records, uint64_t n);

/*
 * A handle's random state (xoshiro256**): 4 words, seeded from one 64-bit seed.
 */
void rb_seed(uint64_t *rng, uint64_t seed);

/*
 * Draw up to n records at random, with replacement, into out (n * record_size bytes),
 * and the position of each into positions. Uniform buffers draw from the `recent` most
 * recent positions (0: all of them); prioritized ones in proportion to priority^alpha,
 * and write each record's probability to probabilities (required for prioritized
 * buffers, unused by uniform ones, where it may be NULL).
 * All or nothing: a call returns n with every draw counted (the rate limiter's
 * `sampled`, each record's draws against max_times_sampled), or 0 with nothing counted
 * and no record retired, as if it had not been made.
 * timeout_ns: 0 never waits, < 0 waits without limit, > 0 waits at most that long while
 * a whole batch cannot be drawn (rate limiter, min_size_to_sample, too few records with
 * draws left). Returns n, 0 if no whole batch before the timeout, or RB_BAD_ARGUMENT.
 */
int64_t rb_sample(void *mem, uint64_t *rng, void *out, uint64_t *positions, double *probabilities, uint64_t n, uint64_t recent, int64_t timeout_ns);

/*
 * Set the priorities of the records at `positions` (each >= 0 and finite: the caller
 * checks). A position whose slot holds another record by now is ignored. Returns the
 * count applied.
 */
uint64_t rb_update_priorities(void *mem, const uint64_t *positions, const double *priorities,
                              uint64_t n);

/*
 * rb_update_priorities with its arguments checked first, in one pass over each array:
 * returns RB_BAD_PRIORITY with detail[0] = i for the first priorities[i] that is not
 * finite and >= 0, else RB_BAD_POSITION with detail[0] = i and detail[1] = the write
 * cursor for the first positions[i] at or past the cursor (never claimed; a negative
 * int64 reads as one), and writes nothing then; else the count applied.
 */
int64_t rb_update_priorities_checked(void *mem, const uint64_t *positions,
                                     const double *priorities, uint64_t n, uint64_t *detail);

/*
 * Importance-sampling weights of a batch from its probabilities (Schaul et al. 2016):
 * w_i = (N * P_i)^-beta / max_j (N * P_j)^-beta, computed as (min_j P_j / P_i)^beta, in
 * which N cancels; the largest weight of the batch is exactly 1. beta >= 0.
 */
void rb_weights(const double *probabilities, uint64_t n, double beta, float *weights);

/* Counters and the state of the sum tree. */
typedef struct {
    uint64_t claimed;        /* positions claimed so far (the write cursor) */
    uint64_t added;          /* records published so far */
    uint64_t size;           /* records held now, published and not overwritten */
    uint64_t sampled;        /* records returned by rb_sample so far */
    uint64_t dropped;        /* records not written because a live writer still held their slot */
    uint64_t reclaimed;      /* slots taken back from writers that died before publishing */
    uint64_t tree_passes;    /* drift-correction passes over the sum tree */
    double max_priority;     /* largest priority seen (before ^alpha) */
    double total_priority;   /* the root of the sum tree */
} rb_stats_t;
void rb_stats(const void *mem, rb_stats_t *out);

/* The exact sum of the leaves (a slow O(capacity) scan, for tests and checks). */
double rb_leaf_sum(const void *mem);

/*
 * Save and load. rb_export copies every record held now, oldest first, with its position,
 * its priority^alpha leaf (prioritized) and its draw count; returns the count. rb_import
 * resets the buffer (nothing else may use it meanwhile), then writes records at their
 * positions and restores the counters.
 */
uint64_t rb_export(const void *mem, void *records, uint64_t *positions, double *leaves,
                   uint64_t *uses, uint64_t max_n);
void rb_import(void *mem, const void *records, const uint64_t *positions, const double *leaves,
               const uint64_t *uses, uint64_t n, uint64_t claimed, uint64_t added,
               uint64_t sampled, double max_priority);

#endif
