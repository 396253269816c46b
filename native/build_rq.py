"""cffi build script for the native core: declarations and sources only.

Compiled by `pip install .` through `cffi_modules` in setup.py, into `replay._rq`. The C
lives in files beside this one: rq.h and rb.h (the API, also what cdef parses),
rqpy.cdef (the constants and the glue's declarations), rqpy_glue.h (the glue that keeps
the GIL, and why), rq.c and rb.c (with the headers they include).
"""
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

# The calls that may sleep. The wrappers cffi generates keep the GIL (rqpy_glue.h), so
# Python reaches these only through their rqpy_/rbpy_ glue, and cdef leaves them out.
# Each is declared on one line of its header, so that leaving out the line leaves out
# the whole declaration.
WAITING = ("int64_t rq_push(", "int64_t rq_pop(", "int64_t rq_borrow(", "int64_t rb_sample(")


def declarations(header):
    """rq.h and rb.h use only plain C types, so each is also the declaration cffi parses,
    less its preprocessor lines, which cdef does not accept (rqpy.cdef declares the
    constants), and less the calls that may sleep."""
    lines = (HERE / header).read_text().splitlines()
    for line in lines:
        if line.startswith(WAITING) and not line.rstrip().endswith(");"):
            raise SystemExit(f"{header}: keep this declaration on one line: {line}")
    return "\n".join(line for line in lines if not line.startswith(("#",) + WAITING))


ffibuilder = FFI()
ffibuilder.cdef(declarations("rq.h"))
ffibuilder.cdef(declarations("rb.h"))
ffibuilder.cdef((HERE / "rqpy.cdef").read_text())
ffibuilder.set_source(
    "replay._rq",
    '#include "rqpy_glue.h"',
    # Relative to the project root, where the package build runs this script.
    sources=["native/rq.c", "native/rb.c"],
    include_dirs=["native"],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
