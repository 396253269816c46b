"""Evaluation while training: a process of its own evaluates the newest weights of the
shared model every so many env steps, and the final ones at the end of the run.

    Evaluator      the trainer's side: starts the process, charts what it reports, stops it
    run_evaluator  the process: a job's `once` each time the env steps pass a multiple of
                   the interval, and once more at the end
    Evaluation     the job of the `eval` section: `eval.episodes` episodes in an environment
                   of its own (a3c.envs.play), charted as eval/mean_return, eval/std_return
                   and eval/mean_length; the best mean's weights go to the run's best.pt

    trainer ──fork──▶ evaluator process: copy the shared weights, play, maybe write best.pt
        ▲                                   │
        └──── records (ArrayQueue) ◀────────┘     control (Counters): final, stop

The evaluator is a process, as the actors are, forked while the trainer still runs one
thread: a thread would take the GIL from the learner threads for every step it plays.
It runs at a lower priority than they do, so that on a machine they keep busy it takes
the time they leave, and evaluations come later rather than slow the run
(docs/results.md, Evaluation while training). With `actors.mode: ray` it runs on the
trainer's machine all the same.

best.pt is a checkpoint (a3c.checkpoint) without optimizer statistics, its counters
those of the evaluation plus `eval_mean_return`, its mean: a resumed run reads it back and
replaces best.pt only with a better mean.
"""
from __future__ import annotations

import math
import os
import queue
import time
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import Config, config_to_dict
from .envs import EnvError, factory_name, make_env
from .envs.play import play
from .files import excerpt
from .metrics import Sink
from .models.weights import WeightCopy, clone_policy
from .procs import as_worker_process, join_worker, worker_context

__all__ = ["BEST_KEY", "Evaluation", "Evaluator", "best_checkpoint", "best_mean", "eval_while_training",
           "existing_best", "run_evaluator"]

BEST_KEY = "eval_mean_return"  # best.pt's mean, in its counters
_POLL_S = 0.1  # how often the evaluator looks at the env step count
# The evaluator's niceness: below the actors and learners (0), it takes mostly the CPU time
# they leave, but not so far below that other programs on a busy machine starve it.
_NICE = 10


def best_checkpoint(run_dir: str | Path) -> Path:
    return Path(run_dir) / "best.pt"


def existing_best(run_dir: str | Path) -> Path:
    """The run folder's best.pt, for loading; CheckpointError if it has none."""
    path = best_checkpoint(run_dir)
    if Path(run_dir).is_file():
        raise CheckpointError(f"best: {run_dir} is a file, and best.pt lies in a run folder; give the run folder")
    if not path.is_file():
        raise CheckpointError(f"no best.pt in {run_dir}: a run folder holds one once the run has evaluated "
                              f"while training (eval.interval_steps above 0); load its last weights "
                              f"without best")
    return path


def best_mean(run_dir: str | Path) -> float:
    """The mean return of the run folder's best.pt; -inf where it has none."""
    path = best_checkpoint(run_dir)
    if not path.exists():
        return -math.inf
    return float(load_checkpoint(path)["counters"].get(BEST_KEY, -math.inf))


class _Stopped(Exception):
    """The run is stopping: the evaluation in progress is abandoned."""


class Evaluation:
    """The evaluator's work for the eval section (a job of `Evaluator`): its own
    environment (the config's, or `env_factory`'s) and copy of the policy, and the best
    mean so far (`best`: a resumed run's). `once` plays one evaluation of the shared
    model's newest weights and writes best.pt when its mean is the best yet."""

    DTYPE = np.dtype([("step", "i8"), ("mean", "f8"), ("std", "f8"), ("length", "f8")])

    def __init__(self, cfg: Config, shared: torch.nn.Module, run_dir: str | Path,
                 env_factory: Callable | None = None, best: float = -math.inf):
        self.cfg, self.run_dir, self.best = cfg, Path(run_dir), best
        self.policy = clone_policy(shared)  # its normalizer statistics come with the weights
        self.copy_weights = WeightCopy(self.policy, shared)
        self.env = make_env(cfg.env, env_factory=env_factory)

    def once(self, counts: dict, stop: Callable[[], bool] = lambda: False) -> tuple | None:
        """(step, mean, std, mean length) of an evaluation of the shared weights as they
        are now; `counts` are the run's counters read just before (their env_steps is the
        step, and best.pt keeps them). None if `stop()` turned true before the end."""
        self.copy_weights()
        e = self.cfg.eval
        calls = 0

        def on_state(env) -> None:
            nonlocal calls
            calls += 1
            if stop():
                raise _Stopped

        try:
            returns = play(self.policy, self.env, e.episodes, e.seed, e.deterministic, on_state=on_state)
        except _Stopped:
            return None
        mean = float(returns.mean())
        if mean > self.best:
            self.best = mean
            save_checkpoint(best_checkpoint(self.run_dir), self.policy.state_dict(), {},
                            config_to_dict(self.cfg), {**counts, BEST_KEY: mean})
        # on_state runs once after each reset and once after each step.
        return int(counts["env_steps"]), mean, float(returns.std()), calls / e.episodes - 1

    @staticmethod
    def chart(sink: Sink, record: tuple) -> float:
        """Chart one evaluation; its mean, for eval.judges_target."""
        step, mean, std, length = record
        sink.scalar("eval/mean_return", mean, step)
        sink.scalar("eval/std_return", std, step)
        sink.scalar("eval/mean_length", length, step)
        return mean

    def close(self) -> None:
        self.env.close()


def run_evaluator(job: type, args: tuple, counters: Counters, control: Counters, results: ArrayQueue,
                  interval: int, total_timesteps: int) -> None:
    """The evaluator process: makes `job(*args)`, and calls its `once` as the env steps
    pass each multiple of `interval` (below `total_timesteps`), and once more when
    `control["final"]` is set, then ends; ends at once (mid-episode) when
    `control["stop"]` is set. The records go into `results`."""
    as_worker_process()
    os.nice(_NICE)

    def stop() -> bool:
        return control["stop"] > 0

    work = job(*args)
    try:
        due = (counters["env_steps"] // interval + 1) * interval  # a resumed run: the next multiple
        while not stop():
            final = control["final"] > 0
            counts = counters.snapshot()
            # From total_timesteps on, the run is ending: the final evaluation comes next.
            if not (final or due <= counts["env_steps"] < total_timesteps):
                time.sleep(_POLL_S)
                continue
            record = work.once(counts, stop)
            if record is not None:
                try:
                    results.put_many(np.array([record], job.DTYPE), block=False)
                except (queue.Full, Closed):  # the trainer reads often; full means it is stopping
                    return
            if final:
                return
            due = (counts["env_steps"] // interval + 1) * interval  # evaluations left behind are skipped
    finally:
        work.close()


class Evaluator:
    """The trainer's side of an evaluator process: starts it, charts what it reports
    (`poll`), and stops it (`close`). In the process, `job(*args)` does the work: its
    `once(counts, stop)` returns a record of `job.DTYPE` (or None once stopped), and
    `job.chart(sink, record)` charts one here and returns its mean. `latest_mean` is the
    latest one (nan before the first), which `eval.judges_target` compares with
    target_return. `env_factory`: the one in `args`, if any, checked to pickle where the
    process comes from the fork server."""

    def __init__(self, job: type, args: tuple, counters: Counters, interval: int, total_timesteps: int,
                 env_factory: Callable | None = None, name: str = "a3c-evaluator"):
        context = worker_context()
        if env_factory is not None and context.get_start_method() != "fork":
            _check_pickles(env_factory)
        self.job, self.latest_mean = job, math.nan
        self.control = Counters(["final", "stop"])
        try:
            self.results = ArrayQueue(64, job.DTYPE)
        except BaseException:
            self.control.close()
            raise
        self.process = context.Process(
            target=run_evaluator, name=name, daemon=True,
            args=(job, args, counters, self.control, self.results, interval, total_timesteps))
        try:
            self.process.start()
        except BaseException:
            self._release()
            raise

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def poll(self, sink: Sink) -> None:
        """Chart the evaluations that ended since the last call."""
        try:
            done = self.results.get_many(64, block=False)
        except (queue.Empty, Closed):
            return
        for record in done.tolist():
            self.latest_mean = self.job.chart(sink, record)

    def close(self, sink: Sink | None, final: bool) -> None:
        """With `final`, have the evaluator evaluate the final weights and wait for it
        (Ctrl-C ends the wait); then stop it, chart what it reported, and release its
        shared memory."""
        try:
            if final:
                self.control.set("final", 1)
                self.process.join()  # as long as its episodes take
        finally:
            self.control.set("stop", 1)  # it stops within one env step
            try:
                join_worker(self.process)
                if sink is not None:
                    self.poll(sink)
            finally:
                self._release()

    def _release(self) -> None:
        self.results.close()
        self.control.close()


def eval_while_training(cfg: Config, shared: torch.nn.Module, counters: Counters, run_dir: str | Path,
                        env_factory: Callable | None = None) -> Evaluator:
    """The evaluator of the eval section, started; a resumed run's best.pt stays the bar."""
    return Evaluator(Evaluation, (cfg, shared, run_dir, env_factory, best_mean(run_dir)), counters,
                     cfg.eval.interval_steps, cfg.total_timesteps, env_factory)


def _check_pickles(env_factory: Callable) -> None:
    """Where this process runs other threads, the evaluator comes from the fork server and
    receives the factory pickled: say so before it starts, if it cannot be."""
    try:
        ForkingPickler.dumps(env_factory)
    except Exception as error:  # PicklingError, AttributeError, TypeError: all mean the same
        raise EnvError(
            f"the env factory {factory_name(env_factory)} cannot be pickled ({excerpt(error, 120)}), and the "
            f"evaluator process receives it pickled, as this process runs other threads; define it at "
            f"module level, or turn evaluation while training off") from None
