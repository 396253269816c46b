"""LunarLander-v3 through configs/lunarlander.yaml, SB3 PPO's recipe for it as this trainer
runs it, with the clip centred on an average of the policy: the config is the setting
whose runs docs/results.md reports, and a short run goes through actors, learner,
checkpoint and evaluation (default suite); at its constant rate the config lands and
keeps landing to the end of its budget (slow: python -m pytest -m slow
tests/test_lunarlander.py)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from a3c import A3C
from a3c.api import evaluate
from a3c.config import config_to_dict, load_config
from a3c.metrics import MemorySink
from conftest import WINDOW, hold

needs_box2d = pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                                 reason='Box2D is not installed: pip install -e ".[box2d]"')

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "lunarlander.yaml"
# scripts/bench_train.py's name for the setting: the dataclass defaults with the variant's
# changes (should the defaults change, the variant no longer names this config, and this test says so).
MEASURED = "constant-lr-zoo-settings-step-minibatches-sync-zoo-rollout-1024-fixed-targets-prox-0.999"


def test_the_config_is_the_setting_the_benchmark_measured(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from bench_train import VARIANTS

    changes = {key.replace("__", "."): value for key, value in VARIANTS[MEASURED].items()}
    measured = config_to_dict(load_config({"env": {"id": "LunarLander-v3"}}, changes))
    shipped = config_to_dict(load_config(CONFIG))
    # The run's name, its threshold (a bar runs are judged by, not a setting), and its
    # budget: at a constant rate a shorter run is the first part of a longer one, and the
    # benchmark's runs went up to 20 M steps.
    assert shipped.pop("total_timesteps") <= 3_000_000
    del measured["total_timesteps"], measured["name"], shipped["name"]
    del measured["solved_return"], shipped["solved_return"]
    assert shipped == measured


@needs_box2d
@pytest.mark.usefixtures("stop_the_fork_server")
def test_a_short_run_trains_checkpoints_and_evaluates(tmp_path):
    sink = MemorySink()
    cfg = load_config(CONFIG)
    batch = cfg.learners.batch_size * cfg.actors.unroll_length  # 16 environments x 1 024 steps
    # One step past the first batch: synchronous actors act the second only after its update.
    agent = A3C(str(CONFIG), total_timesteps=batch + 1, logging__run_root=str(tmp_path),
                logging__progress=False, checkpoint__interval_s=0).learn(sink=sink)
    assert agent.num_timesteps > batch and agent.counters["updates"] >= 1
    assert sink.scalars.get("charts/episodic_return"), "no LunarLander episode ended"
    loaded = A3C.load(agent.run_dir)
    assert loaded.num_timesteps == agent.num_timesteps
    returns = evaluate(loaded.model, loaded.config, episodes=2)
    assert returns.shape == (2,) and np.isfinite(returns).all()
    action, _ = loaded.predict(np.zeros(8, np.float32))
    assert int(action) in range(4)


@pytest.mark.slow
@pytest.mark.learning
@needs_box2d
@pytest.mark.usefixtures("stop_the_fork_server")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_config_lands_and_keeps_landing_to_the_end_of_its_budget(seed, tmp_path):
    """At the config's constant rate for its whole budget, the last-100 mean reaches 200,
    never falls below 190 after, and ends at 200 or more."""
    sink = MemorySink()
    agent = A3C(str(CONFIG), seed=seed, logging__run_root=str(tmp_path), logging__progress=False,
                checkpoint__interval_s=0).learn(sink=sink)
    solved = agent.config.solved_return  # 200
    held = hold(sink.scalars.get("charts/episodic_return", []), solved)
    assert held is not None, f"seed {seed}: never reached {solved} in {agent.num_timesteps} env steps"
    print(f"\nlunarlander seed {seed}, {agent.num_timesteps} env steps: {held}")
    assert held.lowest >= 190, \
        f"seed {seed}: fell to a last-{WINDOW} mean of {held.lowest:.1f} at step {held.lowest_at}"
    assert held.final >= solved, f"seed {seed}: ended at {held.final:.1f}"
