"""MuJoCo locomotion through configs/mujoco.yaml: a short Hopper-v5 run goes through
actors, learner, checkpoint and evaluation (default suite); and the config learns Hopper
(slow: python -m pytest -m slow tests/test_mujoco.py)."""
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mujoco", reason='MuJoCo is not installed: pip install -e ".[mujoco]"')

from a3c import A3C  # noqa: E402
from a3c.api import evaluate  # noqa: E402
from a3c.config import load_config  # noqa: E402
from a3c.metrics import MemorySink  # noqa: E402
from conftest import means  # noqa: E402

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "mujoco.yaml"


def test_a_short_hopper_run_trains_checkpoints_and_evaluates(tmp_path):
    sink = MemorySink()
    agent = A3C(str(CONFIG), total_timesteps=3000, logging__run_root=str(tmp_path),
                logging__progress=False, checkpoint__interval_s=0).learn(sink=sink)
    assert agent.num_timesteps >= 3000 and agent.counters["updates"] > 0
    assert sink.scalars["charts/episodic_return"], "no Hopper episode ended"
    loaded = A3C.load(agent.run_dir)
    assert loaded.num_timesteps == agent.num_timesteps
    returns = evaluate(loaded.model, loaded.config, episodes=2)
    assert returns.shape == (2,) and np.isfinite(returns).all()
    action, _ = loaded.predict(np.zeros(11, np.float32))
    assert action.shape == (3,) and np.isfinite(action).all()


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_mujoco_config_teaches_hopper_to_hop(seed, tmp_path):
    """Hopper-v5 reaches the config's solved_return (a last-100 mean of 1000) within its budget."""
    sink = MemorySink()
    solved = load_config(CONFIG).solved_return
    A3C(str(CONFIG), seed=seed, target_return=solved, logging__run_root=str(tmp_path),
        logging__progress=False, checkpoint__interval_s=0).learn(sink=sink)
    best = max((mean for _, mean in means(sink.scalars["charts/episodic_return"])), default=float("-inf"))
    assert best >= solved, f"seed {seed}: best last-100 mean {best:.1f}"
