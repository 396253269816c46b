"""The C stress tests of the queue (native/stress.c) and of the replay buffers
(native/stress_rb.c), built and run through native/Makefile: optimised builds with large
counts, and ThreadSanitizer builds with small ones.

Each run first plays the dead-producer and dead-consumer scenarios (threads that stop
or end inside a push or a pop), then rounds of producers and consumers over small
queues, and checks that every record arrives exactly once and in each producer's order.
"""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[1] / "native"
RUN_S = 300

needs_cc = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                              reason="needs a C compiler (cc) and make")


def build(target):
    result = subprocess.run(["make", "-C", str(NATIVE), target], capture_output=True, text=True,
                            timeout=RUN_S)
    assert result.returncode == 0, f"make {target} failed:\n{result.stdout}\n{result.stderr}"
    return NATIVE / {"stress": "stress", "tsan": "stress_tsan"}.get(target, target)


def run(binary, *args, env=None):
    result = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True,
                            timeout=RUN_S, env=env)
    return result.returncode, result.stdout + result.stderr


def tsan_links():
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text("#include <pthread.h>\nint main(void) { return 0; }\n")
        probe = subprocess.run(["cc", "-fsanitize=thread", "-pthread", str(source), "-o",
                                str(Path(tmp) / "probe")], capture_output=True, text=True)
        if probe.returncode != 0:
            return False
        return subprocess.run([str(Path(tmp) / "probe")], capture_output=True).returncode == 0


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
    assert output.count(": ok") == rounds + 2, output
    assert output.rstrip().endswith("OK"), output


@needs_cc
@pytest.mark.parametrize("target, args, scenarios", [
    ("tsan", (3000, 8, 3, 3), ("dead-producer scenarios: ok", "dead-consumer scenarios: ok")),
    ("stress_rb_tsan", (3000, 8, 3, 2), ("dead- and slow-writer scenarios: ok",)),
], ids=["queue", "replay_buffer"])
def test_native_stress_under_thread_sanitizer_reports_no_race(target, args, scenarios):
    if not tsan_links():
        pytest.skip("ThreadSanitizer cannot build or run a program here")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1")
    code, output = run(build(target), *args, env=env)
    if "unexpected memory mapping" in output or "FATAL: ThreadSanitizer" in output:
        pytest.skip(f"ThreadSanitizer cannot run on this kernel: {output.strip().splitlines()[0]}")
    assert "WARNING: ThreadSanitizer" not in output, output
    assert code == 0, output
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
    assert output.count(": ok") == rounds + 1, output
    assert output.rstrip().endswith("OK"), output
