"""The training benchmark (scripts/bench_train.py) stopped as `kill` or a job scheduler
stops it, with SIGTERM: the run in progress unwinds, and no process or shared memory
outlives it."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import children, own_process_group, running, segments_of

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_train.py"
WAIT_S = 60.0


def test_sigterm_during_a_run_leaves_no_process_or_shared_memory():
    args = [sys.executable, str(SCRIPT), "--tasks", "cartpole", "--only", "a3c", "--seeds", "1"]
    with own_process_group(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        deadline = time.monotonic() + WAIT_S
        while not (segments_of([proc.pid]) and children(proc.pid)):  # a run with its actors
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no run started"
            time.sleep(0.05)
        workers = children(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)  # to the benchmark alone, as `kill PID` sends it
        output, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output, output
    assert segments_of([proc.pid]) == []
    deadline = time.monotonic() + 5
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in workers)
