"""The training benchmark (scripts/bench_train.py) stopped as `kill` or a job scheduler
stops it, with SIGTERM: the run in progress unwinds, and no process or shared memory
outlives it."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import children, own_process_group, running, segments_of
from waiting import wait_until

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_train.py"
WAIT_S = 60.0


def test_sigterm_during_a_run_leaves_no_process_or_shared_memory():
    args = [sys.executable, str(SCRIPT), "--tasks", "cartpole", "--only", "a3c", "--seeds", "1"]
    with own_process_group(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        def run_started():
            assert proc.poll() is None, proc.communicate()[0]
            return bool(segments_of([proc.pid]) and children(proc.pid))

        wait_until(run_started, WAIT_S, "a run with its actors")
        workers = children(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)  # to the benchmark alone, as `kill PID` sends it
        output, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output, output
    assert segments_of([proc.pid]) == []
    wait_until(lambda: not any(running(pid) for pid in workers), 5, "the workers to exit")
