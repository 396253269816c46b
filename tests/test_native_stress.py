"""The C stress tests of the queue (native/stress.c) and of the replay buffers
(native/stress_rb.c), built and run through native/Makefile: optimised builds with large
counts, and ThreadSanitizer builds with small ones.

Each run first plays the dead-producer and dead-consumer scenarios (threads that stop
or end inside a push or a pop), then rounds of producers and consumers over small
queues, and checks that every record arrives exactly once and in each producer's order.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[1] / "native"
RUN_S = 300

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                              reason="needs a C compiler (cc) and make: install gcc and make "
                                     "(Debian, Ubuntu: apt install build-essential)")

TSAN_OPTIONS = "halt_on_error=1 exitcode=66 second_deadlock_stack=1"
# What ThreadSanitizer prints when it cannot lay out its shadow memory in this address
# space (high-entropy ASLR, as with vm.mmap_rnd_bits above 28 on recent kernels, or a
# `ulimit -v`): nothing can run under it here. Anything else it prints is the program's.
CANNOT_MAP = re.compile(r"ThreadSanitizer: unexpected memory mapping"
                        r"|ThreadSanitizer can not (?:mmap|protect)"
                        r"|ThreadSanitizer failed to allocate"
                        r"|ThreadSanitizer: memory layout is incompatible"
                        r"|limited virtual address space, which wouldn't work with ThreadSanitizer")
# The header of a report (a data race, a lock-order inversion, a use after free, ...); a
# run re-executed without ASLR may warn about the layout first, which is not a report.
REPORT = re.compile(r"WARNING: ThreadSanitizer: (?!memory layout is incompatible)")


def rounds_ok(output):
    """The rounds a harness reported as passed ("round N...: ok")."""
    return len(re.findall(r"^round \d+\b.*: ok$", output, re.MULTILINE))


def build(target):
    result = subprocess.run(["make", "-C", str(NATIVE), target], capture_output=True, text=True,
                            timeout=RUN_S)
    assert result.returncode == 0, f"make {target} failed:\n{result.stdout}\n{result.stderr}"
    return NATIVE / {"stress": "stress", "tsan": "stress_tsan"}.get(target, target)


def run(binary, *args, env=None):
    result = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                            timeout=RUN_S, env=env)
    return result.returncode, result.stdout + result.stderr


def tsan_build(source, folder):
    """Build C `source` with -fsanitize=thread in `folder`; skip the test if cc cannot."""
    (folder / "program.c").write_text(source)
    result = subprocess.run(["cc", "-O1", "-g", "-fsanitize=thread", "-pthread", "program.c", "-o",
                             "program"], cwd=folder, capture_output=True, text=True, timeout=RUN_S)
    if result.returncode != 0:
        pytest.skip("cc cannot build with -fsanitize=thread: install the ThreadSanitizer runtime "
                    f"(Debian, Ubuntu: apt install libtsan2), or use clang: {result.stderr.strip()[:200]}")
    return folder / "program"


def tsan_cannot_run(code, output):
    """The line where ThreadSanitizer says it could not map its memory, if the program
    failed for that reason alone; else None, and the output is to be judged."""
    if code == 0 or REPORT.search(output):
        return None
    return next((line.strip() for line in output.splitlines() if CANNOT_MAP.search(line)), None)


def assert_no_tsan_report(code, output):
    """Skip where ThreadSanitizer cannot map its memory; fail on a report, on any other
    FATAL error, and on a non-zero exit."""
    reason = tsan_cannot_run(code, output)
    if reason is not None:
        pytest.skip(f"ThreadSanitizer cannot run on this kernel: {reason}")
    assert not REPORT.search(output), output
    assert "FATAL" not in output, output
    assert code == 0, output


def verdict(code, output):
    """What `assert_no_tsan_report` makes of a run: "skip", "fail" or "pass"."""
    try:
        assert_no_tsan_report(code, output)
    except pytest.skip.Exception:
        return "skip"
    except AssertionError:
        return "fail"
    return "pass"


@needs_cc
@pytest.mark.parametrize("items, rounds, producers, consumers", [(40000, 8, 4, 3), (20000, 8, 1, 1)],
                         ids=["4x3", "1x1"])
def test_native_stress_every_record_exactly_once_in_producer_order(items, rounds, producers, consumers):
    # With one producer and one consumer, a lost wake-up in a blocking round stalls the
    # run, and the harness's watchdog fails it, instead of another thread covering it.
    code, output = run(build("stress"), items, rounds, producers, consumers)
    assert code == 0, output
    assert "dead-producer scenarios: ok" in output
    assert "dead-consumer scenarios: ok" in output
    assert rounds_ok(output) == rounds, output
    assert output.rstrip().endswith("OK"), output


@needs_cc
@pytest.mark.parametrize("target, args, scenarios", [
    ("tsan", (3000, 8, 3, 3), ("dead-producer scenarios: ok", "dead-consumer scenarios: ok")),
    ("stress_rb_tsan", (3000, 8, 3, 2), ("dead- and slow-writer scenarios: ok",)),
], ids=["queue", "replay_buffer"])
def test_native_stress_under_thread_sanitizer_reports_no_race(target, args, scenarios, tmp_path):
    tsan_build("#include <pthread.h>\nint main(void) { return 0; }\n", tmp_path)
    code, output = run(build(target), *args, env=dict(os.environ, TSAN_OPTIONS=TSAN_OPTIONS))
    assert_no_tsan_report(code, output)
    for line in scenarios:
        assert line in output
    assert output.rstrip().endswith("OK"), output


@needs_cc
def test_native_replay_buffer_stress_draws_only_intact_records_at_their_positions():
    # Uniform and prioritized rounds over capacities 1, 3, 8 and 64; before them, a
    # forked writer that exits holding a slot, and a paused writer that is lapped.
    rounds = 8
    code, output = run(build("stress_rb"), 20000, rounds, 3, 2)
    assert code == 0, output
    assert "dead- and slow-writer scenarios: ok" in output
    for kind in ("uniform", "prioritized"):
        assert re.search(rf"^max_times_sampled race \({kind}, .*: ok$", output, re.MULTILINE), output
    assert rounds_ok(output) == rounds, output
    assert output.rstrip().endswith("OK"), output


# Two threads write `counter` with nothing ordering the writes. The main thread writes
# only once it has seen the other running, through a relaxed flag, which orders nothing,
# so the race stays. Without the flag ThreadSanitizer reported nothing in about one run
# of 50 on a loaded machine (7 of 2 000 idle); with it, in none of 2 000.
RACE = """#include <pthread.h>
int counter, started;
static void *add(void *arg) {
    (void)arg;
    __atomic_store_n(&started, 1, __ATOMIC_RELAXED);
    counter++;
    return 0;
}
int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, 0, add, 0)) return 1;
    while (!__atomic_load_n(&started, __ATOMIC_RELAXED)) {}
    counter++;
    pthread_join(thread, 0);
    return 0;
}
"""


@needs_cc
def test_a_data_race_fails_the_thread_sanitizer_check_instead_of_skipping_it(tmp_path):
    code, output = run(tsan_build(RACE, tmp_path), env=dict(os.environ, TSAN_OPTIONS=TSAN_OPTIONS))
    reason = tsan_cannot_run(code, output)
    if reason is not None:
        pytest.skip(f"ThreadSanitizer cannot run on this kernel: {reason}")
    assert "WARNING: ThreadSanitizer: data race" in output and code == 66, f"exit code {code}: {output}"
    assert verdict(code, output) == "fail"


MAPPING_FAILURES = {  # as ThreadSanitizer's runtimes print them
    "aslr": "FATAL: ThreadSanitizer: unexpected memory mapping 0x5d2a8e4c0000-0x5d2a8e4c1000",
    "shadow": "FATAL: ThreadSanitizer can not mmap the shadow memory (something is mapped at 0x7b0000000000)",
    "protect": "FATAL: ThreadSanitizer can not protect [7b8000000000,7fffffffffff]",
    "allocate": "==12==ERROR: ThreadSanitizer failed to allocate 0x1000 (4096) bytes of trace "
                "(error code: 12)",
    "layout": "FATAL: ThreadSanitizer: memory layout is incompatible, even though ASLR is disabled.",
    "ulimit-v": "WARNING: Program is run with limited virtual address space, which wouldn't work with "
                "ThreadSanitizer.",
}
OTHER_FAILURES = {
    "data-race": "WARNING: ThreadSanitizer: data race (pid=7)\n  Write of size 4 at 0x55 by thread T1:\n"
                 "SUMMARY: ThreadSanitizer: data race stress.c:120 in consume",
    "deadlock": "WARNING: ThreadSanitizer: lock-order-inversion (potential deadlock) (pid=7)",
    "check-failed": "FATAL: ThreadSanitizer CHECK failed: tsan_rtl.cpp:100 \"((x)) != (0)\" (0x0, 0x0)",
    "unreachable": "FATAL: ThreadSanitizer: unreachable called",
    "crash": "Segmentation fault",
    # a report, then the mapping message: the report decides
    "race-then-mapping": "WARNING: ThreadSanitizer: data race (pid=7)\n"
                         "FATAL: ThreadSanitizer: unexpected memory mapping 0x1-0x2",
}


@pytest.mark.parametrize("output", MAPPING_FAILURES.values(), ids=MAPPING_FAILURES.keys())
def test_only_a_failure_to_map_memory_skips_the_thread_sanitizer_check(output):
    assert tsan_cannot_run(66, f"stress: starting\n{output}\n") == output
    assert tsan_cannot_run(0, output) is None  # it ran after all (re-executed without ASLR)
    assert verdict(66, output) == "skip"


@pytest.mark.parametrize("output", OTHER_FAILURES.values(), ids=OTHER_FAILURES.keys())
def test_reports_and_other_fatal_errors_fail_the_thread_sanitizer_check(output):
    assert tsan_cannot_run(66, output) is None
    assert verdict(66, output) == "fail"
