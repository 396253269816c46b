"""cffi build script for the native queue: declarations and sources only.

Compiled by `pip install .` through `cffi_modules` in setup.py, into `replay._rq`.
"""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
# rq.h uses only plain C types, so it is also the declaration cffi parses; strip the
# preprocessor lines, which cdef does not accept (it gets the constants below).
ffibuilder.cdef(
    "\n".join(
        line
        for line in (HERE / "rq.h").read_text().splitlines()
        # rq_push/rq_pop/rq_borrow may sleep, and the wrappers cffi generates keep the
        # GIL (see GLUE below): Python reaches them only through their rqpy_ glue.
        if not line.startswith(("#", "int64_t rq_push(", "int64_t rq_pop(", "int64_t rq_borrow("))
    )
    + """
    #define RQ_OK ...
    #define RQ_CLOSED ...
    #define RQ_TOO_MANY_PRODUCERS ...
    #define RQ_TOO_MANY_CONSUMERS ...
    #define RQ_BORROWING ...
    #define RQ_NOT_BORROWING ...
    #define RQ_BAD_ARGUMENT ...
    #define RQ_BAD_HEADER ...
    #define RQ_MAX_PRODUCERS ...
    #define RQ_MAX_CONSUMERS ...
    #define RQ_MAX_RECORD_SIZE ...
    #define RQ_MAX_CAPACITY ...
    int64_t rqpy_push(void *mem, const void *records, uint64_t n, int64_t timeout_ns);
    int64_t rqpy_pop(void *mem, void *out, uint64_t n, int64_t timeout_ns);
    int64_t rqpy_borrow(void *mem, uint64_t n, int64_t timeout_ns, uint64_t *slot);
    """
)

# cffi releases the GIL around every call. For a call that takes ~100 ns that costs more
# than the call: with two busy Python threads, each release hands the GIL to the other
# thread, so every put and get becomes a thread switch. cffi has no per-function switch,
# so the glue below keeps the GIL for every generated wrapper, and the three calls that
# can wait release it themselves, only once they have to wait.
GLUE = """
#include "rq.h"

#define RQPY_MOVE(name, op, buffer_type)                                          \\
    static int64_t name(void *mem, buffer_type records, uint64_t n, int64_t timeout_ns) { \\
        int64_t moved = op(mem, records, n, 0); /* GIL held: no switch */         \\
        if (moved != 0 || timeout_ns == 0) return moved;                          \\
        Py_BEGIN_ALLOW_THREADS                                                    \\
        moved = op(mem, records, n, timeout_ns);                                  \\
        Py_END_ALLOW_THREADS                                                      \\
        return moved;                                                             \\
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

/* From here on, the wrappers cffi generates keep the GIL. */
#undef Py_BEGIN_ALLOW_THREADS
#undef Py_END_ALLOW_THREADS
#define Py_BEGIN_ALLOW_THREADS {
#define Py_END_ALLOW_THREADS }
"""

# The replay buffers (rb.h, rb.c), declared the same way. rb_sample may wait, so Python
# reaches it only through rbpy_sample (RB_GLUE), like rq_push and rq_pop.
ffibuilder.cdef(
    "\n".join(
        line
        for line in (HERE / "rb.h").read_text().splitlines()
        # (rb_sample's declaration is kept on one line for this filter)
        if not line.startswith(("#", "int64_t rb_sample("))
    )
    + """
    #define RB_OK ...
    #define RB_BAD_ARGUMENT ...
    #define RB_BAD_HEADER ...
    #define RB_BAD_PRIORITY ...
    #define RB_BAD_POSITION ...
    #define RB_MAX_CAPACITY ...
    #define RB_MAX_RECORD_SIZE ...
    #define RB_MAX_TIMES_SAMPLED ...
    int64_t rbpy_sample(void *mem, uint64_t *rng, void *out, uint64_t *positions,
                        double *probabilities, uint64_t n, uint64_t recent, int64_t timeout_ns);
    """
)

# Placed before GLUE, which redefines the GIL macros: first a try with the GIL held, then
# the GIL is released only to wait.
RB_GLUE = """
#include "rb.h"

static int64_t rbpy_sample(void *mem, uint64_t *rng, void *out, uint64_t *positions,
                           double *probabilities, uint64_t n, uint64_t recent, int64_t timeout_ns) {
    int64_t got = rb_sample(mem, rng, out, positions, probabilities, n, recent, 0);
    if (got != 0 || timeout_ns == 0) return got;
    Py_BEGIN_ALLOW_THREADS
    got = rb_sample(mem, rng, out, positions, probabilities, n, recent, timeout_ns);
    Py_END_ALLOW_THREADS
    return got;
}
"""

ffibuilder.set_source(
    "replay._rq",
    RB_GLUE + GLUE,
    # Relative to the project root, where the package build runs this script.
    sources=["native/rq.c", "native/rb.c"],
    include_dirs=["native"],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
