"""The ALE backend of env.atari (env.atari_backend): one ale_py AtariVectorEnv per actor
gives the gymnasium path's frames, rewards and episode ends step for step (with no
no-ops and no sticky actions, which each draws from its own generator) and unclipped
rewards; `auto` takes it where nothing in the config keeps it out, and an `ale` that
cannot be honoured, or ale-py without it, is one problem line; runs through actor
processes, threads and Ray train with it, and stop, die and restart without leaving a
process, a thread or a shared-memory segment behind."""
import dataclasses
import functools
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c.config import ConfigError, load_config
from a3c.envs import sources, vector
from a3c.envs.sources import EnvError
from a3c.envs.vector import atari_backend, make_vector_env
from a3c.metrics import MemorySink
from a3c.trainer import Trainer

from conftest import (A3C_CLI, descendants, own_process_group, run_killing_its_actor, running,
                      segments_of)
from waiting import wait_until

pytest.importorskip("ale_py", reason="the Atari tests need ale-py: install the 'atari' extra, "
                                     'pip install -e ".[atari]"')
pytest.importorskip("cv2", reason="Atari preprocessing resizes with OpenCV: install the 'atari' extra, "
                                  'pip install -e ".[atari]"')
if vector.ale_vector_env() is None:
    pytest.skip("this ale-py has no AtariVectorEnv with same-step autoreset", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")

ROOT = Path(__file__).resolve().parents[1]
PONG = ROOT / "configs" / "pong.yaml"
# One actor of two environments, batches of two fragments of 5 steps: a few seconds of Pong.
SMALL = {"actors.num": 1, "actors.envs_per_actor": 2, "actors.unroll_length": 5, "learners.batch_size": 2,
         "actors.queue_capacity": 4, "logging.progress": False, "checkpoint.interval_s": 0,
         "env.atari_backend": "ale"}


def pong(**overrides):
    """configs/pong.yaml's env section with `overrides` (dotted keys under env, `__` for `.`)."""
    return load_config(PONG, {f"env.{key.replace('__', '.')}": value for key, value in overrides.items()}).env


def assert_one_problem(code, stderr, *fragments):
    """The command line refused the config: a header line, then one problem (ConfigError's
    format) holding every fragment; no traceback."""
    assert code == 2 and "Traceback" not in stderr, stderr
    header, problem = stderr.strip().splitlines()
    assert header.startswith("error: ") and "invalid config (1 problem)" in header, stderr
    for fragment in fragments:
        assert fragment in problem, problem


def threads_of_this_process() -> set[str]:
    return set(os.listdir("/proc/self/task"))


# ------------------------------------------------------------------- the same frames
def no_noops(monkeypatch):
    """No no-op actions at reset in either backend: each draws their count from its own
    generator."""
    monkeypatch.setattr(sources, "NOOP_MAX", 0)
    monkeypatch.setattr(vector, "NOOP_MAX", 0)


def step_both(env_cfg, steps, E=2, seed=5):
    """Step the ALE backend and the gymnasium path side by side with the same actions (a
    fixed generator's) and compare every observation, reward and end; the steps at which
    episodes ended."""
    ale = make_vector_env(dataclasses.replace(env_cfg, atari_backend="ale"), E)
    gym_envs = make_vector_env(dataclasses.replace(env_cfg, atari_backend="gymnasium"), E)
    ends = []
    try:
        assert type(gym_envs).__name__ == "SyncVectorEnv" and isinstance(ale, vector.ale_vector_env())
        assert ale.single_observation_space == gym_envs.single_observation_space
        assert ale.single_action_space == gym_envs.single_action_space
        obs, _ = ale.reset(seed=seed)
        expected, _ = gym_envs.reset(seed=seed)
        S = env_cfg.frame_stack
        assert obs.shape == (E, S, 84, 84) and obs.dtype == np.uint8
        np.testing.assert_array_equal(obs, expected)
        assert not obs[:, :-1].any() and obs[:, -1].any(axis=(1, 2)).all()  # zero frames, then the first
        rng = np.random.default_rng(0)
        for t in range(1, steps + 1):
            actions = rng.integers(0, ale.single_action_space.n, E)
            previous = obs
            obs, reward, terminated, truncated, info = ale.step(actions)
            expected, g_reward, g_terminated, g_truncated, g_info = gym_envs.step(actions)
            np.testing.assert_array_equal(obs, expected, err_msg=f"step {t}")
            np.testing.assert_array_equal(reward, g_reward, err_msg=f"step {t}")
            np.testing.assert_array_equal(terminated, g_terminated, err_msg=f"step {t}")
            np.testing.assert_array_equal(truncated, g_truncated, err_msg=f"step {t}")
            done = terminated | truncated
            for i in np.flatnonzero(done):
                ends.append((t, i, bool(terminated[i])))
                final = info["final_obs"][i]
                np.testing.assert_array_equal(final, g_info["final_obs"][i], err_msg=f"final obs, step {t}")
                np.testing.assert_array_equal(final[:-1], previous[i, 1:])  # the last step's frame in
                assert not obs[i, :-1].any() and obs[i, -1].any()  # the new episode's first
            for i in np.flatnonzero(~done):
                np.testing.assert_array_equal(obs[i, :-1], previous[i, 1:])  # oldest out, newest in
    finally:
        ale.close()
        gym_envs.close()
    return ends


def test_the_ale_backend_gives_the_gymnasium_paths_frames_rewards_and_game_ends_step_for_step(monkeypatch):
    """Random play loses a game of Pong 21-0 in about 800 steps: both environments end a
    game (terminated) within 1000 steps, at the same step in both backends."""
    no_noops(monkeypatch)
    ends = step_both(pong(), 1000)
    assert {i for _, i, terminated in ends if terminated} == {0, 1}, ends


def test_the_ale_backend_truncates_at_the_frame_limit_as_the_gymnasium_path_does(monkeypatch):
    """env.kwargs.max_num_frames_per_episode (frames: 4 a step), 202: truncated at step 51,
    reset in the same step, then again."""
    no_noops(monkeypatch)
    ends = step_both(pong(kwargs__max_num_frames_per_episode=202, frame_stack=3), 110)
    assert ends == [(51, 0, False), (51, 1, False), (102, 0, False), (102, 1, False)]


def test_rewards_are_the_games_own_unclipped():
    """Space Invaders scores 5 to 30 an invader, within a few hundred random steps."""
    envs = make_vector_env(pong(id="ALE/SpaceInvaders-v5"), 2)
    try:
        envs.reset(seed=0)
        rng, rewards = np.random.default_rng(0), set()
        for _ in range(400):
            _, reward, *_ = envs.step(rng.integers(0, envs.single_action_space.n, 2))
            rewards.update(reward.tolist())
            if max(rewards) > 1:
                break
    finally:
        envs.close()
    assert max(rewards) > 1 and all(r % 5 == 0 for r in rewards), rewards


def test_the_vector_env_is_made_from_the_ids_spec_and_env_kwargs_as_the_gymnasium_path_is(monkeypatch):
    base = vector.ale_vector_env()
    made, init = [], base.__init__

    @functools.wraps(init)  # its signature, which vector.ale_vector_env reads
    def recorded(self, *args, **kwargs):
        made.append((args, kwargs))
        init(self, *args, **kwargs)

    monkeypatch.setattr(base, "__init__", recorded)
    for env_cfg in (pong(), pong(kwargs={"frameskip": 1, "full_action_space": True,
                                         "max_num_frames_per_episode": None}, frame_stack=2)):
        make_vector_env(env_cfg, 3).close()
    (args, pong_kwargs), (_, other) = made
    assert args == ("pong", 3)
    assert pong_kwargs == dict(
        batch_size=0, num_threads=min(3, len(os.sched_getaffinity(0))), thread_affinity_offset=-1,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, max_num_frames_per_episode=108000,
        repeat_action_probability=0.0, full_action_space=False, img_height=84, img_width=84, grayscale=True,
        stack_num=4, frameskip=4, maxpool=True, noop_max=30, episodic_life=False, life_loss_info=False,
        reward_clipping=False, use_fire_reset=False)
    # Sticky actions from ALE/Pong-v5's spec (0.25), where env.kwargs say nothing of them; no frame limit.
    assert other["repeat_action_probability"] == 0.25 and other["full_action_space"] is True
    assert other["max_num_frames_per_episode"] == 2**31 - 1 and other["stack_num"] == 2


def test_closing_the_vector_env_ends_its_threads():
    """ale_py's own close leaves them to the garbage collector."""
    before = threads_of_this_process()
    envs = make_vector_env(pong(), 2)
    started = threads_of_this_process() - before
    assert len(started) == min(2, len(os.sched_getaffinity(0)))
    envs.reset(seed=0)
    envs.close()
    assert envs.closed and not started & threads_of_this_process()


def test_seeds_past_the_ales_32_bit_range_are_folded_into_it():
    """Each of 8 environments draws its no-ops at reset from its seed: 2**31 + 7 on plays 7 on."""
    envs = make_vector_env(pong(), 8)
    try:
        far, far_info = envs.reset(seed=2**31 + 7)
        near, near_info = envs.reset(seed=7)
        _, other_info = envs.reset(seed=8)
    finally:
        envs.close()
    np.testing.assert_array_equal(far, near)
    np.testing.assert_array_equal(far_info["episode_frame_number"], near_info["episode_frame_number"])
    assert (near_info["episode_frame_number"] != other_info["episode_frame_number"]).any()


# ------------------------------------------------------------------------ choosing it
def test_auto_takes_ale_for_the_pong_config():
    assert load_config(PONG).env.atari_backend == "auto"
    assert atari_backend(pong()) == "ale"
    assert atari_backend(pong(id="ale_py:ALE/Breakout-v5")) == "ale"  # gymnasium's module:EnvId


@pytest.mark.parametrize("overrides", [
    {"atari_backend": "gymnasium"},
    {"atari": False},
    {"wrappers": ["gymnasium.wrappers:RecordEpisodeStatistics"]},
    {"entry_point": "ale_py.env:AtariEnv", "kwargs": {"game": "pong", "frameskip": 1}},
    {"id": "PongNoFrameskip-v4"},
    {"max_episode_steps": 1000},
    {"action_mask": "info"},
    {"kwargs": {"frameskip": 1, "mode": 1}},
], ids=lambda overrides: "-".join(overrides))
def test_auto_takes_gymnasium_where_the_ale_cannot_make_the_environment(overrides):
    assert atari_backend(pong(**overrides)) == "gymnasium"


@pytest.mark.parametrize("missing", ["ale_py", "ale_py.vector_env"])
def test_auto_takes_gymnasium_where_ale_py_has_no_vector_env(missing, monkeypatch):
    monkeypatch.setitem(sys.modules, missing, None)  # makes its import fail
    monkeypatch.setitem(sys.modules, "ale_py.vector_env", None)
    assert vector.ale_vector_env() is None
    assert atari_backend(pong()) == "gymnasium"


@pytest.mark.parametrize("overrides, names", [
    ({"wrappers": ["gymnasium.wrappers:RecordEpisodeStatistics"]}, "env.wrappers"),
    ({"entry_point": "ale_py.env:AtariEnv"}, "env.entry_point"),
    ({"id": "CartPole-v1"}, "env.id is 'CartPole-v1'"),
    ({"atari": False}, "env.atari is false"),
    ({"max_episode_steps": 1000}, "env.kwargs.max_num_frames_per_episode"),
    ({"kwargs": {"frameskip": 1, "mode": 1}}, "env.kwargs.mode"),
    ({"action_mask": "info"}, "env.action_mask is info"),
], ids=lambda value: "-".join(value) if isinstance(value, dict) else None)
def test_an_ale_that_cannot_be_honoured_is_one_problem_naming_the_field_and_the_fix(overrides, names):
    with pytest.raises(ConfigError) as refused:
        pong(atari_backend="ale", **overrides)
    (problem,) = refused.value.problems
    assert problem.startswith("env.atari_backend: ale ") and names in problem and "\n" not in problem
    assert "set env.atari_backend: gymnasium" in problem or "env.atari_backend: auto" in problem


def test_an_ale_that_cannot_be_honoured_is_refused_by_make_vector_env_too():
    """A config made without the checks (a dataclass, not load_config)."""
    env = dataclasses.replace(pong(), atari_backend="ale", wrappers=["gymnasium.wrappers:RecordEpisodeStatistics"])
    with pytest.raises(EnvError, match="^env.atari_backend: ale .*env.wrappers"):
        make_vector_env(env, 2)


def test_an_ale_with_wrappers_is_one_problem_from_the_command_line_before_any_run_folder(a3c_in_process, tmp_path):
    code, _, err = a3c_in_process("train", PONG, "env.atari_backend=ale",
                                  "env.wrappers=[gymnasium.wrappers:RecordEpisodeStatistics]",
                                  f"logging.run_root={tmp_path}")
    assert_one_problem(code, err, "env.atari_backend: ale", "env.wrappers", "env.atari_backend: gymnasium")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("missing, says", [
    ("ale_py", ("needs ale-py, which is not installed", 'pip install -e ".[atari]"')),
    ("ale_py.vector_env", ("needs ale_py.vector_env", 'pip install -U -e ".[atari]"', "gymnasium")),
])
def test_an_ale_without_its_vector_env_installed_is_one_problem_naming_the_extra(missing, says, a3c_in_process,
                                                                               monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, missing, None)  # makes its import fail
    monkeypatch.setitem(sys.modules, "ale_py.vector_env", None)
    code, _, err = a3c_in_process("train", PONG, "env.atari_backend=ale", f"logging.run_root={tmp_path}")
    assert_one_problem(code, err, "env.atari_backend: ale", *says)
    assert not list(tmp_path.iterdir())


# ------------------------------------------------------------------------- training
def record_vector_envs(monkeypatch) -> list:
    """The vector envs that local actors make in this process (thread actors'), as made."""
    import a3c.actors.local

    made, make = [], a3c.actors.local.make_vector_env

    def recorded(*args, **kwargs):
        made.append(make(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(a3c.actors.local, "make_vector_env", recorded)
    return made


def small_run(tmp_path, mode, total=400):
    """A Trainer of a small Pong run through the ALE backend, in this process."""
    cfg = load_config(PONG, {**SMALL, "actors.mode": mode, "total_timesteps": total,
                             "logging.run_root": str(tmp_path)})
    return Trainer(cfg, tmp_path / "run", sink=MemorySink())


def no_actor_left(trainer, made):
    """Every actor ended by itself, and every vector env made here was closed, its threads ended."""
    assert not [t for t in threading.enumerate() if t.name.startswith("a3c-actor-")]
    assert not [p for p in mp.active_children() if p.name.startswith("a3c-actor-")]
    if trainer.cfg.actors.mode == "process":
        assert [actor.exitcode for actor in trainer._actors] == [0] * trainer.cfg.actors.num  # not killed
    else:
        assert made and all(envs.closed and not hasattr(envs, "ale") for envs in made)
        assert all(isinstance(envs, vector.ale_vector_env()) for envs in made)


@pytest.mark.system
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_pong_trains_through_the_ale_backend_and_its_actors_leave_nothing_running(mode, tmp_path, monkeypatch):
    made = record_vector_envs(monkeypatch)
    trainer = small_run(tmp_path, mode)
    counters = trainer.train()
    assert counters["env_steps"] >= 400 and counters["updates"] > 0 and counters["nonfinite_losses"] == 0
    assert counters["actor_restarts"] == 0 and trainer.saved
    no_actor_left(trainer, made)
    first_conv = next(t for t in trainer.model.state_dict().values() if t.dim() == 4)
    assert first_conv.shape[1] == 4  # the CNN reads the four stacked frames


@pytest.mark.system
def test_a_killed_ale_actor_process_is_restarted_and_the_run_finishes(tmp_path, monkeypatch):
    trainer = small_run(tmp_path, "process", total=1500)
    result, killed = run_killing_its_actor(trainer)
    assert result["actor_restarts"] >= 1 and result["env_steps"] >= 1500
    assert not running(killed)
    no_actor_left(trainer, [])


class Breaks:
    """A vector env's step that raises at its `at`-th call, as an actor's death."""

    def __init__(self, envs, at):
        self.envs, self.at, self.calls = envs, at, 0
        self.step = envs.step

    def __call__(self, actions):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("an actor dies")
        return self.step(actions)


@pytest.mark.system
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_actor_that_dies_closes_its_ale_env_and_its_restart_finishes_the_run(tmp_path, monkeypatch):
    made = record_vector_envs(monkeypatch)
    import a3c.actors.local

    make = a3c.actors.local.make_vector_env

    def first_breaks(*args, **kwargs):
        envs = make(*args, **kwargs)
        if len(made) == 1:
            envs.step = Breaks(envs, at=30)
        return envs

    monkeypatch.setattr(a3c.actors.local, "make_vector_env", first_breaks)
    trainer = small_run(tmp_path, "thread", total=600)
    counters = trainer.train()
    assert counters["actor_restarts"] == 1 and counters["env_steps"] >= 600
    assert len(made) == 2
    no_actor_left(trainer, made)


# -------------------------------------------------------------------- SIGTERM, and Ray
def counters_of(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["counters"]


@pytest.mark.system
@pytest.mark.parametrize("mode", ["process", "thread"])
def test_sigterm_to_a_run_with_ale_actors_leaves_no_process_and_no_segment(mode, tmp_path):
    """The command line with a budget of hours, stopped once its checkpoint counts steps;
    with thread actors, the trainer's process holds the ALE's threads until it ends."""
    with own_process_group(
            [*A3C_CLI, "train", str(PONG), *(f"{key}={value}" for key, value in SMALL.items()),
             f"actors.mode={mode}", "total_timesteps=100000000", "checkpoint.interval_s=0.5",
             f"logging.run_root={tmp_path}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        def trains():
            assert proc.poll() is None, proc.communicate()[1]
            return any((run / "checkpoint.pt").exists() and counters_of(run)["env_steps"] > 0
                       for run in tmp_path.iterdir())

        wait_until(trains, timeout=60, what="the run to train")
        pids = [proc.pid, *descendants(proc.pid)]
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted; checkpoint written to" in stderr
    wait_until(lambda: not [pid for pid in pids if running(pid)], timeout=10, what="the run's processes to end")
    assert segments_of(pids) == []


def cmdline(pid) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.system
def test_pong_trains_through_the_ale_backend_in_ray_actors_and_leaves_no_process(tmp_path):
    """The command line starts a Ray instance of its own (ray.address null) and stops it
    with the run (about 15 s on 2 cores)."""
    pytest.importorskip("ray", reason='Ray is not installed: pip install -e ".[ray]"')
    # Ray takes this machine's address to be 127.0.0.1 (as tests/test_ray.py has it).
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    with own_process_group(
            [*A3C_CLI, "train", str(PONG), *(f"{key}={value}" for key, value in SMALL.items()),
             "actors.mode=ray", "ray.fragments_per_call=2", "total_timesteps=400",
             f"logging.run_root={tmp_path}"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        seen = {}  # pid -> command line, of every process of the run seen while it ran

        def ended():
            for pid in descendants(proc.pid):
                seen[pid] = cmdline(pid) or seen.get(pid, "")  # a Ray worker's changes as it takes a task
            return proc.poll() is not None

        wait_until(ended, timeout=240, what="the Ray run to end")
        _, stderr = proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert any("RemoteActor" in line for line in seen.values()), sorted(seen.values())
    (run_dir,) = tmp_path.iterdir()
    counters = counters_of(run_dir)
    assert counters["env_steps"] >= 400 and counters["updates"] > 0 and counters["actor_restarts"] == 0
    wait_until(lambda: not [pid for pid in seen if running(pid)], timeout=20,
               what="the run's processes and its Ray instance's to end")
