"""The command line end to end: a tiny training run and its run folder, resuming, evaluating,
one-line errors, Ctrl-C and SIGTERM, and the restart of a killed actor process."""
import errno
import fnmatch
import functools
import glob
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from a3c import A3C as Agent, cli, trainer as training
from a3c.checkpoint import CheckpointError
from a3c.config import load_config
from a3c.files import write_atomically
from a3c.metrics import MemorySink
from a3c.trainer import Trainer
from replay import SharedMemoryFull

from conftest import (A3C_CLI, assert_one_line_error, descendants, fail_to_start, own_process_group,
                      own_segments, run_killing_its_actor, running, segments_of)

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")  # the in-process trainer's actors

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole.yaml"
A3C = A3C_CLI

TINY = ["actors.num=2", "actors.envs_per_actor=2", "actors.unroll_length=5", "learners.batch_size=4", "learners.minibatches=1",
        "actors.queue_capacity=16", "logging.progress=false", "logging.interval_s=0.5",
        "checkpoint.interval_s=0"]

TAGS = ["charts/episodic_return", "charts/episode_length", "perf/sps", "perf/updates_per_s",
        "queue/depth", "queue/full_waits", "queue/empty_waits", "losses/policy", "losses/value",
        "losses/entropy", "losses/clip_fraction", "losses/explained_variance", "losses/grad_norm",
        "losses/approx_kl", "policy_lag/mean", "policy_lag/max", "charts/learning_rate", "replay/ratio",
        "perf/start_step"]


def a3c(*args, timeout=120):
    """Run the command line; also check that it left no shared memory behind."""
    with subprocess.Popen([*A3C, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert segments_of([proc.pid]) == [], stderr
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def train(run_root, *overrides, timeout=120):
    return a3c("train", CONFIG, *TINY, f"logging.run_root={run_root}", *overrides, timeout=timeout)


def the_run_dir(run_root):
    (run_dir,) = [p for p in Path(run_root).iterdir() if p.is_dir()]
    return run_dir


def counters(run_dir):
    return torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True)["counters"]


@functools.cache
def temporary_file_pattern(name):
    """The shell pattern of the temporary files `write_atomically` makes for a file called
    `name`, read off the writer itself: the parts that stay the same over several writes."""
    seen = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(8):  # eight random parts agree on a first or last character by chance
            write_atomically(Path(folder) / name,  # about once in 36**7 tries
                             lambda file: seen.extend(n for n in os.listdir(folder) if n != name))
    head = os.path.commonprefix(seen)
    tail = os.path.commonprefix([n[::-1] for n in seen])[::-1]
    assert len(set(seen)) == 8 and len(head) + len(tail) < min(map(len, seen)), seen
    return glob.escape(head) + "*" + glob.escape(tail)


def leftover_temporary_files(run_dir):
    """Temporary files of the checkpoint and config writes still in `run_dir`."""
    patterns = [temporary_file_pattern(name) for name in ("checkpoint.pt", "config.yaml")]
    return [n for n in os.listdir(run_dir) if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


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
    assert not leftover_temporary_files(run_dir)


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


@pytest.mark.parametrize("named", ["folder", "checkpoint file"])
def test_resume_from_the_run_folder_or_its_checkpoint_file_continues_the_counters(trained, tmp_path, named):
    run_dir = copy_of(trained[1], tmp_path)
    before = counters(run_dir)
    where = run_dir if named == "folder" else run_dir / "checkpoint.pt"
    result = a3c("train", "--resume", where, "total_timesteps=6000")
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
            "    observation_space = gym.spaces.Box(0, 255, (2, 2, 3), np.uint8)\n"
            "    action_space = gym.spaces.Discrete(2)\n"
            "    def __init__(self, render_mode=None): pass\n"
            "gym.register('TinyImage-v0', entry_point=Tiny)\n"
            "from a3c.cli import main\n"
            f"main(['train', {str(CONFIG)!r}, 'env.id=TinyImage-v0', 'logging.run_root={tmp_path}'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "too small for the small CNN torso" in result.stderr and "model.cnn" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_resume_from_a_corrupt_checkpoint_is_a_one_line_error(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(b"\x00garbage, not a checkpoint" * 10)
    result = a3c("train", "--resume", run_dir)
    assert_one_line_error(result.returncode, result.stderr, "is not a readable checkpoint", "checkpoint.pt")
    assert (run_dir / "config.yaml").read_bytes() == config_before


def test_resume_from_a_checkpoint_whose_average_is_corrupt_is_a_one_line_error(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["proximal"] is not None  # configs/cartpole.yaml sets learners.proximal_decay
    torch.save({**state, "proximal": {"torso.0.weight": torch.zeros(3)}}, run_dir / "checkpoint.pt")
    result = a3c("train", "--resume", run_dir)
    assert_one_line_error(result.returncode, result.stderr, "its proximal average", "checkpoint.pt")
    assert (run_dir / "config.yaml").read_bytes() == config_before


def test_resume_with_another_config_is_a_one_line_error_and_leaves_the_run_alone(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    checkpoint_before = (run_dir / "checkpoint.pt").read_bytes()
    result = a3c("train", "--resume", run_dir, "env.id=Acrobot-v1")
    assert_one_line_error(result.returncode, result.stderr, "the checkpoint was trained with env", "Acrobot-v1")
    # The run is unchanged, so that a plain resume still works.
    assert (run_dir / "config.yaml").read_bytes() == config_before
    assert (run_dir / "checkpoint.pt").read_bytes() == checkpoint_before


def test_a_resume_interrupted_before_it_learns_names_its_last_checkpoint(trained, tmp_path, monkeypatch, capsys):
    run_dir = copy_of(trained[1], tmp_path)
    checkpoint_before = (run_dir / "checkpoint.pt").read_bytes()

    def interrupted(*_):  # Ctrl-C after the actors started, before the learners
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "start_learners", interrupted)
    monkeypatch.setattr(cli, "stop_on_sigterm", lambda: None)  # this process's handlers stay as they are
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", "--resume", str(run_dir), "total_timesteps=6000"])  # the run had trained 3000
    assert stopped.value.code == 130
    assert f"interrupted; no final checkpoint; {run_dir / 'checkpoint.pt'} is the last one written" in \
        capsys.readouterr().err
    assert (run_dir / "checkpoint.pt").read_bytes() == checkpoint_before


def assert_one_config_problem(result, *fragments):
    """The command line failed with exit code 2 and the format of ConfigError: a header
    line, then the one problem, holding every fragment; no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    header, problem = result.stderr.strip().splitlines()
    assert header.startswith("error: ") and "invalid config (1 problem)" in header
    for fragment in fragments:
        assert fragment in problem, problem


def test_a_setting_the_model_cannot_take_is_a_short_error_before_any_file_is_written(trained, tmp_path):
    """learners.bound_coef needs a Gaussian policy, which only the model built from the
    environment shows: checked before a new run's folder is made, and before a resumed
    run's config.yaml is rewritten, so that a plain resume still works."""
    result = train(tmp_path / "new", "learners.bound_coef=0.1")
    assert_one_config_problem(result, "learners.bound_coef: 0.1", "set it to 0")
    assert not (tmp_path / "new").exists()
    run_dir = copy_of(trained[1], tmp_path)
    config_before = (run_dir / "config.yaml").read_bytes()
    result = a3c("train", "--resume", run_dir, "learners.bound_coef=0.1")
    assert_one_config_problem(result, "learners.bound_coef: 0.1", "set it to 0")
    assert (run_dir / "config.yaml").read_bytes() == config_before


def test_resume_with_a_config_file_or_another_file_in_place_of_the_run_is_a_short_error(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    result = a3c("train", CONFIG, "--resume", run_dir)
    assert_one_config_problem(result, "its own config.yaml", "give only overrides")
    other = shutil.copy(run_dir / "checkpoint.pt", run_dir / "older.pt")
    result = a3c("train", "--resume", other)
    assert_one_config_problem(result, "older.pt", "give the run folder")


def test_a_run_trained_on_a_gpu_resumes_on_a_host_without_it_with_its_learner_on_the_cpu(trained, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a host without CUDA")
    run_dir = copy_of(trained[1], tmp_path)
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    state["config"]["learners"]["device"] = "cuda"
    torch.save(state, run_dir / "checkpoint.pt")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["learners"]["device"] = "cuda"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    result = a3c("train", "--resume", run_dir, "learners.device=cpu", "total_timesteps=3500")
    assert result.returncode == 0, result.stderr
    assert counters(run_dir)["env_steps"] >= 3500


@pytest.mark.parametrize(("option", "value", "why"), [("--episodes", "0", "0 is less than 1"),
                                                      ("--episodes", "many", "'many' is not a whole number"),
                                                      ("--seed", "-1", "-1 is less than 0")])
def test_eval_with_a_count_that_is_not_a_whole_number_in_range_is_a_usage_error(trained, capsys, option, value,
                                                                                  why):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["eval", str(trained[1]), option, value])
    assert stopped.value.code == 2
    assert f"argument {option}: {why}" in capsys.readouterr().err


def test_resume_with_another_optimizer_is_a_one_line_error(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    result = a3c("train", "--resume", run_dir, "optim.name=rmsprop")
    assert_one_line_error(result.returncode, result.stderr,
                          "the checkpoint was trained with optim.name", "rmsprop")


def test_eval_of_a_folder_without_checkpoint_is_a_one_line_error(tmp_path):
    result = a3c("eval", tmp_path, "--episodes", "1")
    assert_one_line_error(result.returncode, result.stderr, "no checkpoint at")


# --------------------------------------------------------------------------- Ctrl-C, SIGTERM
STOP_S = 30  # a stopped run writes its checkpoint and is gone within this


def a_long_run(run_root, *overrides):
    """A process-mode run with a budget of hours, in a process group of its own, that
    writes a checkpoint every 0.5 s (a context manager: killed if it still runs at the end)."""
    return own_process_group(
        [*A3C, "train", str(CONFIG), *TINY, "actors.mode=process", "total_timesteps=100000000",
         "checkpoint.interval_s=0.5", f"logging.run_root={run_root}", *overrides],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until_it_trains(proc, run_root):
    """The run folder, once a periodic checkpoint there counts env steps."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "training did not start"
        dirs = [p for p in Path(run_root).iterdir() if (p / "checkpoint.pt").exists()]
        if dirs and counters(dirs[0])["env_steps"] > 0:
            return dirs[0]
        time.sleep(0.1)


def stop_a_long_run(run_root, send, *overrides):
    """Start a long run, wait until it trains, stop it with `send(proc)`; return the run
    folder, the run's stderr, its workers' pids, when it was stopped and how long it took."""
    with a_long_run(run_root, *overrides) as proc:
        run_dir = wait_until_it_trains(proc, run_root)
        workers = descendants(proc.pid)
        assert len(workers) >= 2  # the actor processes (and multiprocessing's fork server)
        # The moment of the stop as a file's mtime, taken from the same (coarse) clock as
        # the checkpoint's: time.time() can be a few ms ahead of the file system's.
        marker = Path(run_root) / "stopped-at"
        marker.touch()
        stopped_at, started = marker.stat().st_mtime, time.monotonic()
        send(proc)
        try:
            _, stderr = proc.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:  # it still runs, or a process it left holds its output
            raise AssertionError(f"the run did not stop within {STOP_S} s (exit code "
                                 f"{proc.poll()}); running: {[p for p in workers if running(p)]}") from None
        took = time.monotonic() - started
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert f"interrupted; checkpoint written to {run_dir / 'checkpoint.pt'}" in stderr
    assert_nothing_left(proc, workers, run_dir)
    return run_dir, stopped_at, took


def assert_nothing_left(proc, workers, run_dir):
    """No process of the run still runs, none of its shared memory and no temporary file
    of a checkpoint or config write remains."""
    deadline = time.monotonic() + 10  # orphans are reaped by init
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if running(pid)]
    assert segments_of([proc.pid, *workers]) == []
    assert not leftover_temporary_files(run_dir)


def test_ctrl_c_stops_the_run_writes_a_checkpoint_and_leaves_nothing_behind(tmp_path):
    run_dir, stopped_at, _ = stop_a_long_run(  # Ctrl-C reaches the whole process group
        tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGINT))
    assert (run_dir / "checkpoint.pt").stat().st_mtime >= stopped_at
    assert counters(run_dir)["env_steps"] > 0


@pytest.mark.parametrize("learners", ["thread", "process"])
def test_sigterm_to_the_trainer_alone_stops_the_run_promptly_with_a_checkpoint_that_loads(learners, tmp_path):
    """What `kill`, a job scheduler or `docker stop` sends: SIGTERM to the trainer, not to
    its workers (actor and learner processes), which must still all go."""
    run_dir, stopped_at, took = stop_a_long_run(tmp_path, lambda proc: proc.send_signal(signal.SIGTERM),
                                                f"learners.mode={learners}", "learners.num=2")
    assert took < STOP_S / 2, f"the run took {took:.1f} s to stop"
    assert (run_dir / "checkpoint.pt").stat().st_mtime >= stopped_at
    agent = Agent.load(run_dir)
    assert agent.num_timesteps > 0
    action, _ = agent.predict(np.zeros(4, np.float32))
    assert action in (0, 1)


def test_a_write_cut_short_leaves_a_temporary_file_that_the_leftover_check_finds(tmp_path):
    """The check above would see a leftover: a process that dies inside `write_atomically`
    leaves its temporary file, and nothing else, next to where the file would go."""
    code = ("import os, sys; from a3c.files import write_atomically; "
            "write_atomically(sys.argv[1], lambda file: (file.write(b'half'), os._exit(0)))")
    for name in ("checkpoint.pt", "config.yaml"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], cwd=ROOT, check=True,
                       timeout=60)
    assert len(os.listdir(tmp_path)) == 2 and not (tmp_path / "checkpoint.pt").exists()
    assert sorted(leftover_temporary_files(tmp_path)) == sorted(os.listdir(tmp_path))


# ------------------------------------------------------------- a run that fails as it starts
def test_a_run_that_fails_while_starting_releases_what_it_made_and_writes_no_checkpoint(tmp_path, monkeypatch):
    """/dev/shm full, say, after the queues and the replay buffer were made: the error
    reaches the caller, and the run itself (not the garbage collector, nor the exit hook:
    the trainer still holds every object) removes each segment and restores torch's threads."""
    cfg = load_config(CONFIG, [*TINY, "replay.ratio=1", f"logging.run_root={tmp_path}"])
    trainer = Trainer(cfg, tmp_path / "run", sink=MemorySink())
    before, threads = own_segments(), torch.get_num_threads()

    def no_space(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(training, "step_queue", no_space)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert trainer.fragments.closed and trainer.episodes.closed and trainer.replay is not None
    assert own_segments() == before - {trainer.counters._segment.name}  # the counters closed too
    assert torch.get_num_threads() == threads
    assert not trainer.saved and not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_full_dev_shm_is_a_one_line_error_naming_what_to_shrink(tmp_path, monkeypatch, capsys):
    def no_space(*_):
        raise SharedMemoryFull(errno.ENOSPC, "/dev/shm has no room for 1,000 bytes of shared memory")

    monkeypatch.setattr(training, "step_queue", no_space)
    monkeypatch.setattr(cli, "stop_on_sigterm", lambda: None)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", str(CONFIG), *TINY, f"logging.run_root={tmp_path}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: /dev/shm has no room") and "actors.queue_capacity" in err, err


def test_a_checkpoint_that_does_not_fit_is_refused_before_the_trainer_makes_shared_memory(trained, tmp_path):
    state = torch.load(trained[1] / "checkpoint.pt", weights_only=True)
    cfg = load_config(trained[1] / "config.yaml", ["model.hidden_sizes=[32]"])
    before = own_segments()
    with pytest.raises(CheckpointError, match="the checkpoint was trained with model"):
        Trainer(cfg, tmp_path / "run", state=state)
    assert own_segments() == before


def test_an_actor_that_fails_to_start_leaves_none_of_the_ones_started_before_it_running(tmp_path, monkeypatch):
    """A fork that fails for the second actor process (out of memory, say): the first,
    already acting, is stopped and joined before the error reaches the caller (for
    learners: tests/test_learner_processes.py)."""
    cfg = load_config(CONFIG, [*TINY, "actors.mode=process", f"logging.run_root={tmp_path}"])
    trainer = Trainer(cfg, tmp_path / "run", sink=MemorySink())
    started = fail_to_start(monkeypatch, "a3c-actor-1")
    with pytest.raises(OSError, match="Cannot allocate memory"):
        trainer.train()
    assert [process.name for process in started] == ["a3c-actor-0"]
    assert started[0].exitcode == 0  # ended, stopped, before the error reached the caller
    assert not trainer.saved


# ------------------------------------------------------------------------- a killed actor
def test_a_killed_actor_process_is_restarted_and_the_run_finishes(tmp_path):
    cfg = load_config(CONFIG, [*TINY, "actors.mode=process", "actors.num=1", "total_timesteps=6000",
                               f"logging.run_root={tmp_path}"])
    sink = MemorySink()
    trainer = Trainer(cfg, tmp_path / "run", sink=sink)
    result, killed = run_killing_its_actor(trainer)
    # With one actor, the run could only finish if the killed one was replaced.
    assert result["actor_restarts"] >= 1
    assert result["env_steps"] >= 6000
    assert counters(tmp_path / "run")["actor_restarts"] >= 1
    assert sink.scalars["perf/actor_restarts"][-1][1] >= 1
    assert not running(killed)
    assert not [p for p in mp.active_children() if p.name.startswith("a3c-actor-")]


# ----------------------------------------------------------------------- one pipeline, two doors
def test_the_command_line_and_the_api_resolve_the_same_config_from_the_same_input(tmp_path):
    overrides = [*TINY, "total_timesteps=2000", "optim.lr=0.0003", "env.id=Acrobot-v1",
                 f"logging.run_root={tmp_path}"]
    printed = a3c("config", "cartpole", *overrides)
    assert printed.returncode == 0, printed.stderr
    (tmp_path / "printed.yaml").write_text(printed.stdout)
    keywords = {key.replace(".", "__"): yaml.safe_load(value) for key, _, value in
                (text.partition("=") for text in overrides)}
    agent = Agent("cartpole", **keywords)
    assert load_config(tmp_path / "printed.yaml") == agent.config
    assert agent.config.name == "Acrobot-v1"  # named after the environment it trains on
    result = a3c("train", "cartpole", *overrides)
    assert result.returncode == 0, result.stderr
    assert load_config(the_run_dir(tmp_path) / "config.yaml") == agent.config


def test_a_run_that_spent_its_budget_says_so_and_how_to_extend_it(trained, tmp_path):
    run_dir = copy_of(trained[1], tmp_path)
    result = a3c("train", "--resume", run_dir)
    assert_one_config_problem(result, "total_timesteps: the run has trained", "so its budget is spent",
                              f"a3c train --resume {run_dir} total_timesteps=6000")


def test_the_end_of_a_run_says_why_it_stopped_with_enough_digits(tmp_path):
    result = train(tmp_path, "total_timesteps=2000")
    assert result.returncode == 0, result.stderr
    assert "(trained its total_timesteps)" in result.stdout
    result = train(tmp_path, "total_timesteps=200000", "target_return=9.5")
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("done:")]
    assert line.endswith("(reached target_return 9.5)")
    assert int(line.split()[1]) < 200000


def test_a_run_folder_saved_before_the_package_moved_evaluates_resumes_and_records_video(tmp_path):
    """tests/data/run-saved-before-the-move: 2000 steps of CartPole trained by the flat
    package (a3c/model.py, a3c/learner.py, ...) before it moved into role folders."""
    run_dir = Path(shutil.copytree(ROOT / "tests" / "data" / "run-saved-before-the-move", tmp_path / "run"))
    result = a3c("eval", run_dir, "--episodes", "2")
    assert result.returncode == 0 and result.stdout.startswith("2 episodes: mean return"), result.stderr
    result = a3c("train", "--resume", run_dir, "total_timesteps=3000", "logging.progress=false")
    assert result.returncode == 0, result.stderr
    assert counters(run_dir)["env_steps"] >= 3000
    pytest.importorskip("av", reason="a video needs the 'video' extra")
    result = a3c("eval", run_dir, "--episodes", "1", "--video", tmp_path / "old.mp4")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "old.mp4").stat().st_size > 0
