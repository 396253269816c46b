/*
 * The 64-bit float atomic add, shared by rq.c's float counters and rb.c's sum tree.
 *
 * C11 has no atomic add for doubles, so a double lives in an _Atomic uint64_t as its bit
 * pattern and an add is a compare-and-swap loop on that word. Only header-private
 * (static inline) functions here: this file is not part of the cffi declarations.
 */
#ifndef ATOMIC64_H
#define ATOMIC64_H

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t f64_to_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double f64_from_bits(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

/*
 * Add `value` to the double held in `cell`; no concurrent add is lost. Relaxed: the
 * callers use the sum as a statistic or as a guide that is validated elsewhere, never to
 * hand over other data. Retry until nobody changed the cell between our read and our
 * write; a failed CAS reloads `old`.
 */
static inline void atomic_add_f64(_Atomic uint64_t *cell, double value) {
    uint64_t old = atomic_load_explicit(cell, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(cell, &old,
                                                  f64_to_bits(f64_from_bits(old) + value),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

#endif
