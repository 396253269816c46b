"""Learner processes (`learners.mode: process`): Hogwild updates from several processes
land in the one shared model and its shared optimizer statistics, exactly as the same
updates made one at a time in this process (the slow reference); and a run with learner
processes leaves no process and no shared memory after any ending."""
import copy
import multiprocessing as mp
import os
import queue
import signal
import threading

import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c.actors.loop import fragment_dtype
from a3c.config import load_config
from a3c.learners.batch import batch_from_fragments
from a3c.learners.updater import Updater, step_queue
from a3c.learners.workers import start_learners
from a3c.models import ActorCritic
from a3c.learners.optim import SharedAdam
from a3c import procs
from a3c.trainer import COUNTERS, TIMERS, Trainer
from replay import ArrayQueue, Counters

from conftest import descendants, fail_to_start, running
from waiting import wait_until

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")

OBS, ACTIONS, T, B = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), 4, 4
CFG = load_config({"learners": {"mode": "process", "num": 2, "batch_size": B, "epochs": 2, "minibatches": 1},
                   "optim": {"lr_schedule": "constant"}, "actors": {"queue_capacity": 64}})


def batches(n, seed=0):
    """n batches of B random fragments, each acted by policy version 0."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, B), fragment_dtype(OBS, ACTIONS, T))
    out["obs"] = rng.uniform(-1, 1, out["obs"].shape)
    out["last_obs"] = rng.uniform(-1, 1, out["last_obs"].shape)
    out["reward"] = rng.normal(size=out["reward"].shape)
    out["action"] = rng.integers(0, 2, out["action"].shape)
    out["logp"] = np.log(0.5)
    return out


def tiny_model():
    torch.manual_seed(0)  # the same weights in the reference and the shared model
    return ActorCritic(OBS, ACTIONS, hidden_sizes=(8,), normalize_obs=True, normalize_value=True)


class Learners:
    """CFG's learner processes on a shared tiny model, from the `context` given."""

    def __init__(self, context):
        self.model = tiny_model()
        self.initial = copy.deepcopy(self.model)
        self.model.share_memory()
        self.optimizer = SharedAdam(self.model.parameters(), CFG.optim.lr)
        self.fragments = ArrayQueue(CFG.actors.queue_capacity, fragment_dtype(OBS, ACTIONS, T))
        self.counters, self.steps = Counters(COUNTERS, TIMERS), step_queue()
        self.learners = start_learners(CFG, self.model, self.optimizer, self.fragments,
                                       self.counters, self.steps, None, context)
        self.processes = self.learners.workers

    def train(self, batch):
        updates = self.counters["updates"] + CFG.learners.epochs
        self.fragments.put_many(batch)
        wait_until(lambda: self.counters["updates"] >= updates, timeout=60, what="the batch's updates")

    def close(self):
        self.learners.stop.set()
        self.fragments.close()
        for process in self.processes:
            process.join(30)
        assert not any(process.is_alive() for process in self.processes)
        for handle in (self.counters, self.steps):
            handle.close()


@pytest.fixture
def learners():
    made = []
    yield lambda context: made.append(Learners(context)) or made[-1]
    for each in made:
        each.close()


def reference(initial, data):
    """The slow reference: the same batches, one after the other, in this process."""
    model = copy.deepcopy(initial)
    optimizer = SharedAdam(model.parameters(), CFG.optim.lr)
    counters, steps = Counters(COUNTERS, TIMERS), step_queue()
    try:
        updater = Updater(CFG, model, optimizer, counters, steps, threading.Lock())
        for batch in data:
            updater.train(batch_from_fragments(batch), True)
    finally:
        counters.close()
        steps.close()
    return model, optimizer


@pytest.fixture
def one_torch_thread():
    """The learner processes' setting, here too: the same float sums."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_learner_process_that_fails_to_start_leaves_none_started_before_it_running(monkeypatch):
    """A fork that fails for the second learner (out of memory, say): `start_learners`
    raises with the first already ended, since its caller never gets it to stop."""
    model = tiny_model()
    model.share_memory()
    fragments = ArrayQueue(CFG.actors.queue_capacity, fragment_dtype(OBS, ACTIONS, T))
    counters, steps = Counters(COUNTERS, TIMERS), step_queue()
    started = fail_to_start(monkeypatch, "a3c-learner-1")
    try:
        with pytest.raises(OSError, match="Cannot allocate memory"):
            start_learners(CFG, model, SharedAdam(model.parameters(), CFG.optim.lr), fragments, counters, steps,
                           None, mp.get_context("forkserver"))
        assert [process.name for process in started] == ["a3c-learner-0"]
        assert started[0].exitcode == 0  # the queue still open: it ended because it was stopped
    finally:
        for handle in (fragments, counters, steps):
            handle.close()


# Where an accelerator is visible, a forked child cannot run a backward pass once this
# process has run one (autograd's device threads), and runs take the fork server there.
ACCELERATOR = procs._accelerator_visible()
FORK = pytest.param("fork", marks=pytest.mark.skipif(ACCELERATOR, reason="runs do not fork learners here"))


@pytest.mark.parametrize("start", [FORK, "forkserver"])
@pytest.mark.usefixtures("one_torch_thread")
def test_updates_from_learner_processes_land_in_the_shared_model_as_one_at_a_time_here(learners, start):
    """Batches handed over one at a time, each taken by whichever learner process is
    waiting: the shared parameters, running statistics (observation normalizer, PopArt)
    and Adam moments end where this process's own updates of the same batches end."""
    h = learners(mp.get_context(start))
    assert len({p.pid for p in h.processes} | {os.getpid()}) == 3
    data = batches(6)
    for batch in data:
        h.train(batch)
    model, optimizer = reference(h.initial, data)
    assert h.counters["updates"] == len(data) * CFG.learners.epochs
    for (name, mine), theirs in zip(model.state_dict().items(), h.model.state_dict().values()):
        torch.testing.assert_close(theirs, mine, msg=lambda m, name=name: f"{name}: {m}")
    for name, tensors in optimizer.state.items():
        for mine, theirs in zip(tensors, h.optimizer.state[name]):
            torch.testing.assert_close(theirs, mine, msg=lambda m, name=name: f"optimizer {name}: {m}")


def test_learner_processes_updating_at_once_all_write_the_shared_state(learners):
    """Many batches at once, two processes taking them concurrently: their gradient steps
    count in the shared Adam step (Hogwild: an increment may be lost to a race, but a
    process that stepped a copy of its own would leave half of them out), every fresh
    observation counts in the shared normalizer (its updates take the processes' common
    lock), and every step's report reaches the monitor's queue."""
    h = learners(procs.learner_context())
    data = batches(24, seed=1)
    for batch in data:
        h.fragments.put_many(batch)
    total = len(data) * CFG.learners.epochs
    wait_until(lambda: h.counters["updates"] >= total, timeout=120, what=f"{total} updates")
    assert 0.9 * total <= h.optimizer.state["step"][0].item() <= total
    assert int(h.model.obs_norm.count) == data["obs"][..., 0].size
    assert any(not torch.equal(p, p0) for p, p0 in zip(h.model.parameters(), h.initial.parameters()))
    reports = []

    def all_reported():  # a learner hands its reports over just after its last update
        try:
            reports.append(h.steps.get_many(1024, block=False))
        except queue.Empty:
            pass
        return sum(map(len, reports)) >= total

    wait_until(all_reported, what=f"{total} reports")
    reports = np.concatenate(reports)
    assert len(reports) == total and np.isfinite(reports["value"]).all()


def run_config(tmp_path, **overrides):
    return load_config({"actors": {"mode": "process", "num": 1, "envs_per_actor": 2, "unroll_length": 8},
                        "learners": {"mode": "process", "num": 2, "batch_size": 4, "minibatches": 1},
                        "logging": {"progress": False, "interval_s": 0.5, "run_root": str(tmp_path)},
                        "checkpoint": {"interval_s": 0}, **overrides})


def test_a_run_with_learner_processes_trains_and_leaves_no_process(tmp_path):
    from a3c.metrics import MemorySink

    sink = MemorySink()
    trainer = Trainer(run_config(tmp_path, total_timesteps=4000), tmp_path / "run", sink=sink)
    counts = trainer.train()
    assert counts["env_steps"] >= 4000 and counts["updates"] > 0
    assert sink.scalars["losses/value"], "the learner processes' reports reach the monitor"
    wait_until(lambda: not run_processes(), timeout=10, what="the run's processes to end")
    assert (tmp_path / "run" / "checkpoint.pt").is_file()


def test_learner_processes_train_after_this_process_ran_a_backward_pass(tmp_path):
    """Where an accelerator is visible, the first backward pass starts autograd's device
    threads, and a forked child's backward pass fails: a run of learner processes after
    one of learner threads in the same process (or this suite's earlier tests) broke there.
    It guards such hosts; on a CPU-only one it cannot fail for that reason."""
    torch.nn.Linear(2, 1)(torch.ones(1, 2)).sum().backward()
    counts = Trainer(run_config(tmp_path, total_timesteps=2000), tmp_path / "run").train()
    assert counts["updates"] > 0


def test_learner_processes_come_from_the_fork_server_where_an_accelerator_is_visible(monkeypatch, tmp_path):
    monkeypatch.setattr(procs, "_accelerator_visible", lambda: True)
    trainer = Trainer(run_config(tmp_path, total_timesteps=2000), tmp_path / "run")
    assert trainer.train()["updates"] > 0
    assert all(isinstance(worker, mp.context.ForkServerProcess) for worker in trainer.learners.workers)


@pytest.mark.parametrize("fork_server", [False, True], ids=["forked", "from-the-fork-server"])
def test_learner_processes_move_the_runs_one_proximal_average_in_shared_memory(monkeypatch, tmp_path, fork_server):
    """learners.proximal_decay: the processes move the trainer's average, not copies of
    it, whether forked or started by the fork server (which pickles their arguments)."""
    monkeypatch.setattr(procs, "_accelerator_visible", lambda: fork_server)
    cfg = run_config(tmp_path, total_timesteps=2000)
    cfg.learners.proximal_decay = 0.9
    trainer = Trainer(cfg, tmp_path / "run")
    first = [p.clone() for p in trainer.average.parameters()]
    assert trainer.train()["updates"] > 0
    assert any(not torch.equal(now, then) for now, then in zip(trainer.average.parameters(), first))


def test_a_learner_process_that_dies_stops_the_run_with_an_error_and_a_checkpoint(tmp_path):
    trainer = Trainer(run_config(tmp_path, total_timesteps=100_000_000), tmp_path / "run")
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(pytest.raises(RuntimeError, trainer.train)))
    thread.start()
    wait_until(lambda: trainer.counters["updates"] > 0, timeout=60, what="the first update")
    workers = run_processes()
    os.kill(trainer.learners.workers[1].pid, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive(), "the run hangs when a learner process dies"
    (info,) = outcome
    assert "learner" in str(info.value) and "died" in str(info.value)
    assert (tmp_path / "run" / "checkpoint.pt").is_file()  # the usual shutdown still ran
    wait_until(lambda: not [pid for pid in workers if running(pid)], timeout=10,
               what="the run's processes to end")


def run_processes() -> list[int]:
    """The processes below this one that still run, but for multiprocessing's fork server
    (restarted actors and, once threads run, new workers come from it) and resource
    tracker (which unlinks named semaphores), which outlive runs."""
    from multiprocessing import forkserver, resource_tracker

    keep = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    return [pid for pid in descendants(os.getpid()) if pid not in keep and running(pid)]
