"""The Atari path: an ALE id with Atari preprocessing and a frame stack gives 4x84x84
bytes that shift by one frame per step, and configs/pong.yaml trains end to end."""
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from a3c.config import load_config
from a3c.envs import make_env

from conftest import A3C_CLI, segments_of

pytest.importorskip("ale_py", reason="the Atari tests need ale-py: install the 'atari' extra, "
                                     'pip install -e ".[atari]"')
pytest.importorskip("cv2", reason="Atari preprocessing resizes with OpenCV: install the 'atari' extra, "
                                  'pip install -e ".[atari]"')

ROOT = Path(__file__).resolve().parents[1]
PONG = ROOT / "configs" / "pong.yaml"


def test_atari_observations_are_four_stacked_84x84_gray_frames_that_shift_each_step():
    cfg = load_config(PONG)
    assert cfg.env.id.startswith("ALE/") and cfg.env.atari and cfg.env.frame_stack == 4
    env = make_env(cfg.env)
    try:
        assert env.observation_space.shape == (4, 84, 84)
        assert env.observation_space.dtype == np.uint8
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert obs.max() > obs.min()  # a picture, not a blank frame
        env.action_space.seed(0)
        for _ in range(20):
            previous = obs
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs in env.observation_space
            np.testing.assert_array_equal(obs[:-1], previous[1:])  # oldest frame out, newest in
            assert not (terminated or truncated)
        assert (obs[-1] != obs[0]).any()  # the game moved over the last frames
    finally:
        env.close()


def test_pong_config_trains_end_to_end_for_a_few_hundred_steps(tmp_path):
    """The shipped config with one actor of two envs and batches of two fragments."""
    with subprocess.Popen(
            [*A3C_CLI, "train", str(PONG), "actors.num=1", "actors.envs_per_actor=2",
             "actors.unroll_length=5", "learners.batch_size=2", "actors.queue_capacity=4",
             "total_timesteps=400", "logging.progress=false", "checkpoint.interval_s=0",
             f"logging.run_root={tmp_path}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            _, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert segments_of([proc.pid]) == []
    (run_dir,) = tmp_path.iterdir()
    assert load_config(run_dir / "config.yaml").env.id == "ALE/Pong-v5"
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["counters"]["env_steps"] >= 400 and state["counters"]["updates"] > 0
    assert state["counters"]["nonfinite_losses"] == 0
    first_conv = next(t for t in state["model"].values() if t.dim() == 4)
    assert first_conv.shape[1] == 4  # the CNN reads the four stacked frames
