"""`a3c eval RUN --video out.mp4`: the file holds every frame of the episodes evaluate plays,
at the environment's size and frame rate; what cannot be recorded is a one-line error that
leaves no file behind."""
import functools
import re
import sys
from importlib.util import find_spec
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from a3c import A3C
from a3c.api import evaluate
from a3c.envs.video import record_video

from conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole.yaml"
EXTRA = 'needs the video extra: pip install -e ".[video]"'
needs_video = pytest.mark.skipif(find_spec("av") is None or find_spec("pygame") is None, reason=EXTRA)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained CartPole agent's checkpoint: its greedy policy plays short episodes."""
    path = tmp_path_factory.mktemp("agent") / "cartpole.pt"
    A3C(CONFIG).save(path)
    return path


@pytest.fixture
def a3c_eval(monkeypatch, a3c_in_process):
    """`a3c eval ...` run in this process: (exit code, stdout, stderr), with the SDL
    driver that the command sets put back afterwards."""
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    return lambda *args: a3c_in_process("eval", *args)


def read_video(path):
    """(frames as [N, H, W, 3] uint8, frame rate) decoded with the library that wrote them."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
        return np.stack(frames), stream.average_rate


@needs_video
@pytest.mark.parametrize("episodes", [1, 2])
def test_video_holds_a_frame_per_state_of_the_episodes_at_the_env_size_and_rate(
        episodes, checkpoint, a3c_eval, tmp_path):
    out = tmp_path / "out.mp4"
    code, stdout, stderr = a3c_eval(checkpoint, "--video", out, "--episodes", episodes)
    assert code == 0, stderr
    match = re.search(rf"{episodes} episodes: mean return ([\d.]+) \+- [\d.]+ \(min ([\d.]+), max ([\d.]+)\)",
                      stdout)
    assert match, stdout
    assert f"video written to {out}" in stderr
    # CartPole pays 1 per step, so the returns are the episode lengths; each episode has a
    # frame at its reset and one after every step.
    mean, low, high = map(float, match.groups())
    lengths = round(mean * episodes)
    assert episodes == 1 or lengths == low + high
    frames, rate = read_video(out)
    assert frames.shape == (lengths + episodes, 400, 600, 3)  # CartPole renders 600x400
    assert rate == 50  # CartPole's metadata["render_fps"]
    assert frames.std() > 0  # a picture, not a blank
    assert [p.name for p in tmp_path.iterdir()] == ["out.mp4"]  # no temporary file left


@needs_video
def test_video_plays_the_episodes_evaluate_plays(checkpoint, tmp_path):
    agent = A3C.load(checkpoint)
    recorded = record_video(agent.model, agent.config, tmp_path / "out.mp4", episodes=3, seed=7)
    played = evaluate(agent.model, agent.config, 3, seed=7)
    np.testing.assert_array_equal(recorded, played)


@needs_video
def test_video_of_an_environment_made_by_a_factory(tmp_path):
    factory = functools.partial(gym.make, "CartPole-v1", max_episode_steps=3)
    agent = A3C(CONFIG, env=factory)
    out = tmp_path / "out.mp4"
    returns = record_video(agent.model, agent.config, out, env=agent.env_factory)
    assert returns.tolist() == [3.0]  # the factory's time limit, not CartPole's 500
    frames, _ = read_video(out)
    assert frames.shape == (4, 400, 600, 3)


class SkipFrames(gym.Wrapper):
    """Each step plays `frame_skip` steps of the environment, as Atari's preprocessing does."""

    def __init__(self, env, frame_skip):
        super().__init__(env)
        self.frame_skip = frame_skip

    def step(self, action):
        total = 0.0
        for _ in range(self.frame_skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += reward
            if terminated or truncated:
                break
        return obs, total, terminated, truncated, info


def cartpole_skipping_2_frames(render_mode=None):
    return SkipFrames(gym.make("CartPole-v1", render_mode=render_mode), frame_skip=2)


@needs_video
def test_a_video_of_an_env_that_skips_frames_plays_at_the_matching_fraction_of_its_rate(tmp_path):
    agent = A3C(CONFIG, env=cartpole_skipping_2_frames)
    out = tmp_path / "out.mp4"
    record_video(agent.model, agent.config, out, env=agent.env_factory)
    _, rate = read_video(out)
    assert rate == 25  # CartPole's 50 frames a second, 2 of them per step


@needs_video
def test_a_recording_that_fails_leaves_no_file_under_the_name(checkpoint, tmp_path):
    agent = A3C.load(checkpoint)
    act, calls = agent.model.act, []

    def act_then_fail(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("the policy failed mid-episode")
        return act(*args, **kwargs)

    agent.model.act = act_then_fail
    with pytest.raises(RuntimeError, match="mid-episode"):
        record_video(agent.model, agent.config, tmp_path / "out.mp4")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------- errors
def test_without_the_video_library_the_error_names_the_extra(checkpoint, a3c_eval, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "av", None)  # as if the extra was not installed
    code, _, err = a3c_eval(checkpoint, "--video", tmp_path / "out.mp4", "--episodes", 1)
    assert_one_line_error(code, err)
    assert err.strip() == (
        "error: a3c eval needs 'av', which is not installed; install the 'video' extra: "
        'pip install "a3c-replay[video]" (from a clone: pip install -e ".[video]")')
    assert list(tmp_path.iterdir()) == []


class NoFrames(gym.Env):
    """An environment that renders nothing but text."""
    metadata = {"render_modes": ["ansi"]}
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode


@pytest.fixture
def no_frames_checkpoint(tmp_path):
    gym.register("NoFrames-v0", entry_point=NoFrames)
    try:
        path = tmp_path / "agent" / "no-frames.pt"
        A3C({"env": {"id": "NoFrames-v0"}}).save(path)
        yield path
    finally:
        gym.registry.pop("NoFrames-v0")


@needs_video
def test_an_env_without_rgb_array_rendering_is_a_one_line_error(no_frames_checkpoint, a3c_eval, tmp_path):
    out = tmp_path / "out.mp4"
    code, _, err = a3c_eval(no_frames_checkpoint, "--video", out, "--episodes", 1)
    assert_one_line_error(code, err, "env.id 'NoFrames-v0' cannot render rgb_array frames", "['ansi']")
    assert not out.exists()


@needs_video
def test_an_env_missing_its_drawing_library_is_a_one_line_error(checkpoint, a3c_eval, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pygame", None)  # as if gymnasium[classic-control] was not installed
    out = tmp_path / "out.mp4"
    code, _, err = a3c_eval(checkpoint, "--video", out, "--episodes", 1)
    assert_one_line_error(code, err, "env.id 'CartPole-v1' cannot render frames", "pygame")
    assert not out.exists()


def test_a_name_that_is_not_mp4_is_a_one_line_error(checkpoint, a3c_eval, tmp_path):
    code, _, err = a3c_eval(checkpoint, "--video", tmp_path / "out.gif", "--episodes", 1)
    assert_one_line_error(code, err, "out.gif", ".mp4")
    assert list(tmp_path.iterdir()) == []
