"""scripts/held.py: the stability figures of a run folder, read from its TensorBoard
events, with a resumed run's sittings joined as the run went on."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("tensorboard")
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "held.py"


def sitting(run_dir, start, episodes, wall):
    """One sitting's event file: the monitor's first write at the checkpoint's step, then
    the episodes as (env step, return)."""
    writer = SummaryWriter(str(run_dir), filename_suffix=f".{start}")
    writer.add_scalar("perf/sps", 1000.0, start, walltime=wall)
    for n, (step, ret) in enumerate(episodes):
        writer.add_scalar("charts/episodic_return", ret, step, walltime=wall + n + 1)
        writer.add_scalar("charts/episode_length", 500, step, walltime=wall + n + 1)
    writer.close()


def held(run_dir, *args):
    result = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_resumed_run_drops_the_episodes_its_interrupted_sitting_played_past_the_checkpoint(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}}))
    # The first sitting: 100 episodes of 100, then 100 of 500 (first reaching 475 at step
    # 20 000), then a fall to 0 from step 30 000 on that its kill cut off: it resumed from
    # the checkpoint at step 30 000, and the second sitting played 500 again from there.
    sitting(tmp_path, 0, [(100 * n, 100.0) for n in range(1, 101)]
            + [(10_000 + 100 * n, 500.0) for n in range(1, 101)]
            + [(30_000 + 100 * n, 0.0) for n in range(1, 51)], wall=1000.0)
    sitting(tmp_path, 30_000, [(30_000 + 100 * n, 500.0) for n in range(1, 101)], wall=5000.0)
    out = held(tmp_path)
    assert "300 episodes to 40000 env steps in 2 sitting(s), threshold 475" in out, out
    assert "first reached at 19400 env steps" in out, out  # the 94th episode of 500 lifts the mean to 476
    assert "lowest after 476.0 at 19400 (held); 0.00% of the 106 episodes after below 475" in out, out
    assert out.rstrip().endswith("final 500.0"), out


def test_a_threshold_given_on_the_command_line_replaces_the_benchmarks(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}}))
    sitting(tmp_path, 0, [(100 * n, 400.0 if n % 2 else 200.0) for n in range(1, 201)], wall=1000.0)
    out = held(tmp_path, "--threshold", "290")
    assert "first reached at 10000 env steps" in out and "50.00% of the" in out and "(held)" in out, out
