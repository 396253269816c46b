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


def sitting(run_dir, start, episodes, wall, marked=True):
    """One sitting's event file as the trainer writes it: the step it starts from
    (perf/start_step, unless `marked` is false, as in runs from before it was written),
    then the episodes as (env step, return)."""
    writer = SummaryWriter(str(run_dir), filename_suffix=f".{start}")
    if marked:
        writer.add_scalar("perf/start_step", start, start, walltime=wall)
    for n, (step, ret) in enumerate(episodes):
        writer.add_scalar("charts/episodic_return", ret, step, walltime=wall + n + 1)
        writer.add_scalar("charts/episode_length", 500, step, walltime=wall + n + 1)
    writer.close()


def held(run_dir, *args):
    """What scripts/held.py prints for `run_dir`."""
    result = subprocess.run([sys.executable, str(SCRIPT), str(run_dir), *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_resumed_run_drops_the_episodes_its_interrupted_sitting_played_past_the_checkpoint(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}}))
    # The second sitting's file is made first: sittings are ordered by when they ran. The
    # first sitting: 100 episodes of 100, then 100 of 500 (first reaching 475 at step
    # 19 400), then a fall to 0 from step 30 000 on, which its kill cut off: the run
    # resumed from the checkpoint at step 30 000, and played 500 from there, its first
    # episode ending at 38 000.
    sitting(tmp_path, 30_000, [(38_000 + 100 * n, 500.0) for n in range(100)], wall=5000.0)
    sitting(tmp_path, 0, [(100 * n, 100.0) for n in range(1, 101)]
            + [(10_000 + 100 * n, 500.0) for n in range(1, 101)]
            + [(30_000 + 100 * n, 0.0) for n in range(50)], wall=1000.0)
    out = held(tmp_path)
    assert "300 episodes to 47900 env steps in 2 sitting(s); threshold 475 (the benchmark's cartpole task)" in out
    assert "first reached at 19400 env steps" in out, out  # the 94th episode of 500 lifts the mean to 476
    assert "lowest after 476.0 at 19400 (held; std of its 100 returns 95.0); 0.00% of the 106 episodes" in out
    assert out.rstrip().endswith("final 500.0"), out


def test_a_run_from_before_sittings_marked_their_start_is_joined_at_the_next_sittings_first_step(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}}))
    sitting(tmp_path, 0, [(100 * n, 500.0) for n in range(1, 101)] + [(20_000, 0.0)], wall=1000.0, marked=False)
    sitting(tmp_path, 15_000, [(20_000, 500.0)], wall=5000.0, marked=False)
    out = held(tmp_path)
    assert "101 episodes to 20000 env steps in 2 sitting(s)" in out and "(held;" in out, out


def test_a_threshold_given_on_the_command_line_replaces_the_benchmarks(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}}))
    sitting(tmp_path, 0, [(100 * n, 400.0 if n % 2 else 200.0) for n in range(1, 201)], wall=1000.0)
    out = held(tmp_path, "--threshold", "290")
    assert "threshold 290 (given)" in out and "first reached at 10000 env steps" in out, out
    assert "50.00% of the" in out and "(held;" in out, out
