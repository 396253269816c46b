/*
 * rqpy_glue.h: the C glue between Python and rq.c/rb.c in the cffi module replay._rq.
 *
 * Included only by the source string of build_rq.py's set_source, which cffi places at
 * the top of the module it generates, after Python.h and before its own wrappers; so
 * Python.h's Py_BEGIN_ALLOW_THREADS is in scope here, and what this file defines holds
 * for every wrapper after it. rqpy.cdef declares the functions below to Python.
 *
 * cffi releases the GIL around every call. For a call that takes ~100 ns that costs more
 * than the call: with two busy Python threads, each release hands the GIL to the other
 * thread, so every put and get becomes a thread switch. cffi has no per-function switch,
 * so this file keeps the GIL for every generated wrapper (the redefinition at its end),
 * and the calls that can wait (rq_push, rq_pop, rq_borrow, rb_sample) release it
 * themselves, only once they have to wait: Python reaches them only through the rqpy_
 * and rbpy_ functions here, which first try with the GIL held and a timeout of 0, then
 * release the GIL, with the real macros, only to wait (native/README.md, "Signals and
 * the GIL").
 */
#ifndef RQPY_GLUE_H
#define RQPY_GLUE_H

#include "rb.h"
#include "rq.h"

/* ---- the replay buffers: first a try with the GIL held, then the GIL is released only
 * to wait ---- */

static int64_t rbpy_sample(void *mem, uint64_t *rng, void *out, uint64_t *positions,
                           double *probabilities, uint64_t n, uint64_t recent, int64_t timeout_ns) {
    int64_t got = rb_sample(mem, rng, out, positions, probabilities, n, recent, 0);
    if (got != 0 || timeout_ns == 0) return got;
    Py_BEGIN_ALLOW_THREADS
    got = rb_sample(mem, rng, out, positions, probabilities, n, recent, timeout_ns);
    Py_END_ALLOW_THREADS
    return got;
}

/* ---- the queue: the same for push, pop and borrow ---- */

#define RQPY_MOVE(name, op, buffer_type)                                          \
    static int64_t name(void *mem, buffer_type records, uint64_t n, int64_t timeout_ns) { \
        int64_t moved = op(mem, records, n, 0); /* GIL held: no switch */         \
        if (moved != 0 || timeout_ns == 0) return moved;                          \
        Py_BEGIN_ALLOW_THREADS                                                    \
        moved = op(mem, records, n, timeout_ns);                                  \
        Py_END_ALLOW_THREADS                                                      \
        return moved;                                                             \
    }
RQPY_MOVE(rqpy_push, rq_push, const void *)
RQPY_MOVE(rqpy_pop, rq_pop, void *)

static int64_t rqpy_borrow(void *mem, uint64_t n, int64_t timeout_ns, uint64_t *slot) {
    int64_t lent = rq_borrow(mem, n, 0, slot); /* GIL held: no switch */
    if (lent != 0 || timeout_ns == 0) return lent;
    Py_BEGIN_ALLOW_THREADS
    lent = rq_borrow(mem, n, timeout_ns, slot);
    Py_END_ALLOW_THREADS
    return lent;
}

/* From here on, the wrappers cffi generates keep the GIL. This must stay the last thing
 * in the file: the functions above need the real macros. */
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }

#endif
