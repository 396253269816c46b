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
        if not line.startswith("#")
    )
    + """
    #define RQ_OK ...
    #define RQ_CLOSED ...
    #define RQ_TOO_MANY_PRODUCERS ...
    #define RQ_BAD_ARGUMENT ...
    #define RQ_BAD_HEADER ...
    #define RQ_MAX_PRODUCERS ...
    #define RQ_MAX_RECORD_SIZE ...
    #define RQ_MAX_CAPACITY ...
    """
)
ffibuilder.set_source(
    "replay._rq",
    '#include "rq.h"',
    # Relative to the project root, where the package build runs this script.
    sources=["native/rq.c"],
    include_dirs=["native"],
    extra_compile_args=["-std=c11", "-O2", "-Wall", "-Wextra"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
