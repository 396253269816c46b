"""The Ape-X DQN example (scripts/example_apex_dqn.py): it runs end to end and cleans up,
Ctrl-C leaves nothing behind, and it learns CartPole-v1 within its step budget."""
import importlib.util
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import own_process_group, running, segments_of

pytest.importorskip("torch")
pytest.importorskip("gymnasium")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "example_apex_dqn.py"
spec = importlib.util.spec_from_file_location("example_apex_dqn", SCRIPT)
example = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = example  # dataclasses look their module up there
spec.loader.exec_module(example)


def processes_running(marker: str) -> list[int]:
    """Pids of live processes whose command line holds `marker` (forked actors keep it)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline and running(entry):
                pids.append(int(entry))
    return pids


def test_runs_end_to_end_and_cleans_up():
    args = example.Args(steps=800, actors=2, envs_per_actor=2, learning_starts=200, slack=100,
                        batch_size=32, verbose=False)
    mean, steps = example.train(args)
    assert steps >= 800
    assert mean > 0  # some episodes finished and were counted
    assert multiprocessing.active_children() == []
    # the shared memory check is conftest's (every test)


def test_ctrl_c_leaves_no_process_or_shared_memory():
    marker = "--seed 918273"
    with own_process_group([sys.executable, str(SCRIPT), "--steps", "1000000", "--actors", "2",
                            *marker.split()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True) as proc:
        for line in proc.stdout:  # warnings may come first
            if "actors" in line and "started" in line:
                break
        else:
            raise AssertionError(f"the example exited before starting: {proc.wait()}")
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, output
    assert "Traceback" not in output, output
    deadline = time.monotonic() + 5
    while processes_running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_running(marker) == []
    assert segments_of([proc.pid]) == []


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_learns_cartpole_400_within_200k_steps(seed):
    start = time.perf_counter()
    mean, steps = example.train(example.Args(seed=seed, steps=200_000, target_return=400.0,
                                             verbose=False))
    print(f"\nseed {seed}: mean return of the last 100 episodes {mean:.1f} after {steps} env steps, "
          f"{time.perf_counter() - start:.0f} s")
    assert mean >= 400.0 and steps <= 200_000
