"""The command line end to end: a tiny training run and its run folder, resuming, evaluating,
one-line errors, Ctrl-C, and the restart of a killed actor process."""
import glob
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from a3c.config import load_config
from a3c.metrics import MemorySink
from a3c.runner import Trainer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole.yaml"
_SCRIPT = Path(sys.executable).with_name("a3c")
A3C = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "a3c.cli"]

TINY = ["actors.num=2", "actors.envs_per_actor=2", "actors.unroll_length=5", "learners.batch_size=4", "learners.minibatches=1",
        "actors.queue_capacity=16", "logging.progress=false", "logging.interval_s=0.5",
        "checkpoint.interval_s=0"]

TAGS = ["charts/episodic_return", "charts/episode_length", "perf/sps", "perf/updates_per_s",
        "queue/depth", "queue/full_waits", "queue/empty_waits", "losses/policy", "losses/value",
        "losses/entropy", "losses/clip_fraction", "policy_lag/mean", "policy_lag/max",
        "charts/learning_rate", "replay/ratio"]


def a3c(*args, timeout=120):
    """Run the command line; also check that it left no shared memory behind."""
    with subprocess.Popen([*A3C, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert segments([proc.pid]) == [], stderr
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def train(run_root, *overrides, timeout=120):
    return a3c("train", CONFIG, *TINY, f"logging.run_root={run_root}", *overrides, timeout=timeout)


def the_run_dir(run_root):
    (run_dir,) = [p for p in Path(run_root).iterdir() if p.is_dir()]
    return run_dir


def counters(run_dir):
    return torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True)["counters"]


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def children(pid):
    """Pids whose parent is `pid`, read from /proc."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def running(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def segments(pids):
    return [p for pid in pids for p in glob.glob(f"/dev/shm/rq-{pid}-*")]


@pytest.fixture(scope="module", autouse=True)
def stop_the_fork_server():
    """The in-process trainer starts actor processes from multiprocessing's fork server;
    stop it when the module is done so that no child of the test process remains."""
    yield
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny process-mode training run through the CLI: (result, run folder)."""
    root = tmp_path_factory.mktemp("runs")
    result = train(root, "actors.mode=process", "total_timesteps=3000")
    assert result.returncode == 0, result.stderr
    return result, the_run_dir(root)


def copy_of(run_dir, tmp_path):
    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


# ------------------------------------------------------------------------------ a training run
def test_train_writes_config_checkpoint_and_tensorboard_events(trained):
    result, run_dir = trained
    assert f"run folder: {run_dir}" in result.stderr
    assert re.search(r"done: \d+ steps, \d+ updates, mean return", result.stdout)
    assert load_config(run_dir / "config.yaml").total_timesteps == 3000
    state = counters(run_dir)
    assert state["env_steps"] >= 3000 and state["updates"] > 0 and state["episodes"] > 0
    assert glob.glob(str(run_dir / "events.out.tfevents.*"))


def test_tensorboard_events_hold_every_chart_and_the_config_text(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir = trained
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    missing = [tag for tag in TAGS if tag not in tags["scalars"]]
    assert not missing, f"missing {missing}; found {sorted(tags['scalars'])}"
    assert all(0 < e.value <= 500 for e in events.Scalars("charts/episodic_return"))
    lr = load_config(run_dir / "config.yaml").optim.lr
    assert all(0 <= e.value <= lr * (1 + 1e-6) for e in events.Scalars("charts/learning_rate"))
    assert max(e.step for e in events.Scalars("perf/sps")) >= 3000
    (text,) = events.Tensors("config/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert "| total_timesteps | 3000 |" in table and "| env.id | CartPole-v1 |" in table


def test_thread_mode_runs_end_to_end(tmp_path):
    result = train(tmp_path, "actors.mode=thread", "total_timesteps=2000")
    assert result.returncode == 0, result.stderr
    state = counters(the_run_dir(tmp_path))
    assert state["env_steps"] >= 2000 and state["updates"] > 0


def test_resume_continues_the_counters(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    before = counters(run_dir)
    result = a3c("train", "--resume", run_dir, "total_timesteps=6000")
    assert result.returncode == 0, result.stderr
    after = counters(run_dir)
    assert after["env_steps"] >= 6000 > before["env_steps"]
    for name in ("episodes", "updates", "policy_version", "queue_puts", "queue_gets"):
        assert after[name] > before[name], name
    assert load_config(run_dir / "config.yaml").total_timesteps == 6000
    assert list(tmp_path.iterdir()) == [run_dir]  # no new run folder


def test_eval_prints_the_mean_and_spread_of_the_returns(trained):
    result = a3c("eval", trained[1], "--episodes", "3")
    assert result.returncode == 0, result.stderr
    match = re.search(r"3 episodes: mean return ([\d.]+) \+- ([\d.]+) \(min ([\d.]+), max ([\d.]+)\)",
                      result.stdout)
    assert match, result.stdout
    mean, spread, low, high = map(float, match.groups())
    assert low <= mean <= high and spread >= 0 and 0 < low


# ----------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("where", ["override", "file"])
def test_misspelled_config_key_is_a_short_error_without_traceback(where, tmp_path):
    if where == "file":
        config = tmp_path / "typo.yaml"
        data = yaml.safe_load(CONFIG.read_text())
        data["actors"]["unroll_lenght"] = data["actors"].pop("unroll_length", 5)
        config.write_text(yaml.safe_dump(data))
        result = a3c("train", config, f"logging.run_root={tmp_path}")
        key, suggestion = "actors.unroll_lenght", "actors.unroll_length"
    else:
        result = train(tmp_path, "actors.nmu=2")
        key, suggestion = "actors.nmu", "actors.num"
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # A header line, then one line per problem (the format of ConfigError).
    header, problem = result.stderr.strip().splitlines()
    assert header.startswith("error: ") and "invalid config (1 problem)" in header
    assert problem.strip() == f"{key}: unknown key; did you mean '{suggestion}'?"
    assert [p.name for p in tmp_path.iterdir()] in ([], ["typo.yaml"])  # no run folder


def test_unknown_env_id_is_a_short_error_without_traceback(tmp_path):
    result = train(tmp_path, "env.id=CartPol-v1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    header, problem = result.stderr.strip().splitlines()
    assert header.startswith("error: ")
    assert "env.id: 'CartPol-v1' is not a registered gymnasium environment" in problem
    assert "CartPole-v1" in problem.split(";", 1)[1]  # a suggestion
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("missing", ["tqdm", "tensorboard", "torch"])
def test_train_without_the_train_extra_names_the_extra_to_install(missing, tmp_path):
    """As if `pip install -e .` had been run without `[train]`: the module is unimportable."""
    code = (f"import sys; sys.modules[{missing!r}] = None; from a3c.cli import main; "
            f"main(['train', {str(CONFIG)!r}, 'logging.run_root={tmp_path}'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"error: a3c train needs {missing!r}, which is not installed; install the 'train' extra: "
        f'pip install "a3c-replay[train]" (from a clone: pip install -e ".[train]")')
    assert list(tmp_path.iterdir()) == []


def test_images_too_small_for_the_cnn_are_a_one_line_error(tmp_path):
    code = ("import gymnasium as gym, numpy as np, sys\n"
            "class Tiny(gym.Env):\n"
            "    observation_space = gym.spaces.Box(0, 255, (3, 20, 20), np.uint8)\n"
            "    action_space = gym.spaces.Discrete(2)\n"
            "    def __init__(self, render_mode=None): pass\n"
            "gym.register('TinyImage-v0', entry_point=Tiny)\n"
            "from a3c.cli import main\n"
            f"main(['train', {str(CONFIG)!r}, 'env.id=TinyImage-v0', 'logging.run_root={tmp_path}'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "too small for the CNN torso" in result.stderr and "model.cnn" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_resume_from_a_corrupt_checkpoint_is_a_one_line_error(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(b"\x00garbage, not a checkpoint" * 10)
    result = a3c("train", "--resume", run_dir)
    assert_one_line_error(result, "is not a readable checkpoint", "checkpoint.pt")
    assert (run_dir / "config.yaml").read_bytes() == config_before


def test_resume_with_another_config_is_a_one_line_error_and_leaves_the_run_alone(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    checkpoint_before = (run_dir / "checkpoint.pt").read_bytes()
    result = a3c("train", "--resume", run_dir, "env.id=Acrobot-v1")
    assert_one_line_error(result, "the checkpoint was trained with env", "Acrobot-v1")
    # The run is unchanged, so that a plain resume still works.
    assert (run_dir / "config.yaml").read_bytes() == config_before
    assert (run_dir / "checkpoint.pt").read_bytes() == checkpoint_before


def test_resume_with_another_optimizer_is_a_one_line_error(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    result = a3c("train", "--resume", run_dir, "optim.name=rmsprop")
    assert_one_line_error(result, "the checkpoint was trained with optim.name", "rmsprop")


def test_eval_of_a_folder_without_checkpoint_is_a_one_line_error(tmp_path):
    assert_one_line_error(a3c("eval", tmp_path, "--episodes", "1"), "no checkpoint at")


# ------------------------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_stops_the_run_writes_a_checkpoint_and_leaves_nothing_behind(tmp_path):
    proc = subprocess.Popen(
        [*A3C, "train", str(CONFIG), *TINY, "actors.mode=process", "total_timesteps=100000000",
         "checkpoint.interval_s=0.5", f"logging.run_root={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # Training has started once a periodic checkpoint counts env steps.
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "training did not start"
            dirs = [p for p in tmp_path.iterdir() if (p / "checkpoint.pt").exists()]
            if dirs and counters(dirs[0])["env_steps"] > 0:
                break
            time.sleep(0.1)
        run_dir = dirs[0]
        workers = descendants(proc.pid)
        assert len(workers) >= 2  # the actor processes (and multiprocessing's fork server)
        interrupted_at = time.time()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert f"interrupted; checkpoint written to {run_dir / 'checkpoint.pt'}" in stderr
    assert (run_dir / "checkpoint.pt").stat().st_mtime >= interrupted_at
    assert counters(run_dir)["env_steps"] > 0
    deadline = time.monotonic() + 10  # orphans are reaped by init
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if running(pid)]
    assert segments([proc.pid, *workers]) == []
    assert not list(run_dir.glob(".checkpoint.pt.tmp-*"))


# ------------------------------------------------------------------------- a killed actor
def test_a_killed_actor_process_is_restarted_and_the_run_finishes(tmp_path):
    cfg = load_config(CONFIG, [*TINY, "actors.mode=process", "actors.num=1", "total_timesteps=6000",
                               f"logging.run_root={tmp_path}"])
    sink = MemorySink()
    trainer = Trainer(cfg, tmp_path / "run", sink=sink)
    result, errors = {}, []

    def train_in_thread():
        try:
            result.update(trainer.train())
        except BaseException as error:  # reported by the test below
            errors.append(error)

    thread = threading.Thread(target=train_in_thread)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while trainer.counters["env_steps"] == 0:  # the only actor is acting
            assert thread.is_alive() and time.monotonic() < deadline, errors
            time.sleep(0.01)
        (actor,) = [p for p in mp.active_children() if p.name.startswith("a3c-actor-")]
        killed = actor.pid
        os.kill(killed, signal.SIGKILL)
    finally:
        thread.join(120)
    assert not thread.is_alive() and not errors, errors
    # With one actor, the run could only finish if the killed one was replaced.
    assert result["actor_restarts"] >= 1
    assert result["env_steps"] >= 6000
    assert counters(tmp_path / "run")["actor_restarts"] >= 1
    assert sink.scalars["perf/actor_restarts"][-1][1] >= 1
    assert not running(killed)
    assert not [p for p in mp.active_children() if p.name.startswith("a3c-actor-")]
