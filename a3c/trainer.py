"""The trainer: wires actors, the queue, learners and the monitor, supervises them, and
shuts everything down (also on Ctrl-C) leaving no process, thread or shared memory.

    actors (processes or threads) --put_many--> ArrayQueue --get_many--> learners
         |  read weights once per fragment                    |  Hogwild updates
         +------------------ shared model <-------------------+
    counters, learner reports (shared memory) ---> monitor thread ---> TensorBoard, progress bar

Learners are threads of this process or, with `learners.mode: process`, processes of their
own, one GIL each: the model's parameters and statistics and the optimizer's statistics
live in shared memory, so the same Hogwild updates land in the same tensors either way.

With `actors.mode: ray` the actors run on a Ray cluster and a pump thread puts what they
return into the same queue (a3c.actors.remote); the learners do not know the difference.

With `eval.interval_steps`, an evaluator process plays the newest weights now and then, and
the final ones (a3c.evaluator); the trainer charts its results.
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch

from replay import ArrayQueue, Counters

from .actors.local import rounds_trained, run_actor, sync_rounds
from .actors.loop import EPISODE_DTYPE, fragment_dtype
from .checkpoint import check_compatible, latest_checkpoint, load_state, save_checkpoint
from .config import Config, ConfigError, config_table, config_to_dict
from .envs import check_env_factory
from .envs.multiagent import run_spaces
from .evaluator import Evaluator, eval_while_training
from .learners.optim import build_optimizer, value_lr_problem
from .learners.source import replay_buffer
from .learners.updater import proximal_average, step_queue
from .learners.workers import DeviceCopy, Learners, start_learners
from .metrics import Monitor, Sink, TensorBoardSink
from .models import build_model
from .procs import JOIN_TIMEOUT_S, actor_context, join_worker, learner_context
from .selfplay import games_while_training

__all__ = ["COUNTERS", "TIMERS", "Trainer", "build_default_model", "check_learner_settings"]

# fragments_lost: in the calls of remote actors (actors.mode ray) that died or timed out.
# fresh_batches: fresh batches the learners have trained on (synchronous actors wait for it).
# kl_stops: batches (fresh or replayed) whose passes learners.target_kl ended early.
COUNTERS = ("env_steps", "episodes", "episodes_dropped", "updates", "policy_version",
            "queue_puts", "queue_gets", "replayed", "actor_restarts", "nonfinite_losses",
            "fragments_lost", "fresh_batches", "kl_stops")
# Seconds spent, summed over workers: the per-part time profile.
# actor_sync_s: synchronous actors (actors.sync) waiting for the learner's update.
TIMERS = ("actor_env_s", "actor_policy_s", "actor_queue_s", "actor_sync_s", "learner_queue_s",
          "learner_update_s")
_EPISODE_QUEUE = 4096


def build_default_model(cfg: Config, env_factory: Callable | None = None) -> torch.nn.Module:
    """The model the config describes, for the config's environment (or `env_factory`'s),
    its initial weights drawn from `seed`: runs of several seeds start from different
    weights. The caller's torch generator is left as it was."""
    spaces = run_spaces(cfg.env, env_factory)  # with env.multiagent, one agent's
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            return build_model(spaces.observation, spaces.action, cfg.model, cfg.env.action_mask != "none")
    except ValueError as error:  # spaces the model cannot take: say so, in one line
        raise ConfigError([f"env.id {cfg.env.id!r}: {error}"]) from None


def check_learner_settings(cfg: Config, model: torch.nn.Module) -> None:
    """The settings that need a kind of model, against the run's model (a user's
    included): `learners.bound_coef` bounds a feedforward Gaussian policy's means, so the
    model must have one, and a Box action space whose bounds it reads
    (a3c.learners.loss.mean_excess); minibatches of steps need a feedforward model;
    `optim.value_lr` needs modules named value_*."""
    space = getattr(model, "action_space", None)
    recurrent = getattr(model, "is_recurrent", False)
    problems = []
    if cfg.learners.bound_coef and not (getattr(model, "is_continuous", False)
                                        and isinstance(space, gym.spaces.Box)):
        problems.append(f"learners.bound_coef: {cfg.learners.bound_coef} bounds a Gaussian policy's "
                        f"means, and this model's actions are {space}; set it to 0")
    elif cfg.learners.bound_coef and recurrent:
        problems.append(f"learners.bound_coef: {cfg.learners.bound_coef} needs a feedforward model, and "
                        f"this model is recurrent; set it to 0")
    if cfg.learners.minibatch_split == "steps" and recurrent:
        problems.append("learners.minibatch_split: steps needs a feedforward model, and this model is "
                        "recurrent; split by fragments")
    if problem := value_lr_problem(model, cfg.optim):
        problems.append(problem)
    if problems:
        raise ConfigError(problems)


class Trainer:
    """One training run. `state` is a checkpoint dict to continue from; `env_factory`, when
    given, makes every environment (A3C(config, env=...))."""

    def __init__(self, cfg: Config, run_dir: Path, model: torch.nn.Module | None = None,
                 state: dict | None = None, sink: Sink | None = None,
                 env_factory: Callable | None = None):
        self.cfg, self.run_dir, self.env_factory = cfg, Path(run_dir), env_factory
        check_env_factory(env_factory, cfg.actors.mode)
        self.model = model if model is not None else build_default_model(cfg, env_factory)
        check_learner_settings(cfg, self.model)
        self.model.share_memory()  # parameters in shared memory: actors read them in place
        self.optimizer = build_optimizer(self.model, cfg.optim)
        if state is not None:
            check_compatible(cfg, state)
            # state["model"] is None when `model` already holds the weights (A3C.learn).
            load_state(state, self.model if state["model"] is not None else None, self.optimizer)
        # learners.proximal_decay: the learners' one average, continued from the checkpoint's.
        self.average = None
        if cfg.learners.proximal_decay is not None:
            self.average = proximal_average(self.model)
            load_state(state or {}, average=self.average)
            self.average.share_memory()
        # Shared memory last: a checkpoint that does not fit leaves nothing to release.
        self.counters = Counters(COUNTERS, TIMERS)
        for name, value in (state or {}).get("counters", {}).items():
            if name in self.counters.names:
                self.counters.set(name, value)
        self._sink = sink
        self.saved = False  # whether the final checkpoint was written
        self._actors: list = []
        self.learners = Learners(threading.Event(), [])  # none until train() starts them
        self._restarts = [0] * cfg.actors.num
        # With actors.mode ray: a3c.actors.cluster.RayRuntime and a3c.actors.remote.Pump.
        self._ray = self._pump = None
        self._actors_stopped = False
        # With eval.interval_steps; or selfplay.eval_games (games against a fixed opponent).
        self.evaluator: Evaluator | None = None
        self.device_copy: DeviceCopy | None = None  # the learners' model on an accelerator
        self.rounds: Counters | None = None  # with actors.sync: a3c.actors.local.sync_rounds
        # Made by train(): the fragment and episode queues, the replay buffer (with
        # replay.ratio > 0) and the learners' step statistics.
        self.fragments = self.episodes = self.replay = self.learner_stats = None

    # ---- the run ---------------------------------------------------------------------

    def train(self) -> dict:
        """Train until `total_timesteps` env steps; return the final counters."""
        cfg = self.cfg
        threads = torch.get_num_threads()  # restored at the end: the caller's setting
        torch.set_num_threads(1)  # one thread per worker: parallelism comes from workers
        sink = monitor = None
        finished = False  # the run reached its end (not stopped by an error or Ctrl-C)
        # A resumed run's count, before any actor adds to it.
        start = self.start_steps = int(self.counters["env_steps"])
        if cfg.deterministic:  # the draws of the learner thread, and of actors forked or threads
            torch.manual_seed(cfg.seed)
        try:  # whatever fails, `_shutdown` releases what was made (counters included)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            spaces = run_spaces(cfg.env, self.env_factory)  # with env.multiagent, one agent's
            dtype = fragment_dtype(spaces.observation, spaces.action, cfg.actors.unroll_length,
                                   getattr(self.model, "state_size", 0))
            self.fragments = ArrayQueue(cfg.actors.queue_capacity, dtype)
            self.episodes = ArrayQueue(_EPISODE_QUEUE, EPISODE_DTYPE)
            self.replay = replay_buffer(cfg, dtype)
            self.learner_stats = step_queue()
            if cfg.actors.sync:  # from the restored count on a resume: the first round acts at once
                self.rounds = sync_rounds(cfg, self.counters["fresh_batches"])
            if cfg.eval.interval_steps:  # forked, as the actors are, while this process runs one thread
                self.evaluator = eval_while_training(cfg, self.model, self.counters, self.run_dir, self.env_factory)
            elif cfg.selfplay.eval_games:  # games against a fixed opponent, with its interface
                self.evaluator = games_while_training(cfg, self.model, self.counters, self.env_factory)
            if cfg.actors.mode == "ray":
                self._start_remote_actors()
            else:
                # Actors first: while this process runs one thread they can be forked directly.
                # Each kept as it starts, so that `_shutdown` joins them if a later one fails.
                for i in range(cfg.actors.num):
                    self._actors.append(self._start_actor(i))
            if torch.device(cfg.learners.device).type != "cpu":  # after the actors' fork
                self.device_copy = DeviceCopy(cfg, self.model, self.optimizer, average=self.average)
            self.learners = start_learners(
                cfg, self.model, self.optimizer, self.fragments, self.counters, self.learner_stats,
                self.replay, learner_context() if cfg.learners.mode == "process" else None,
                self.device_copy, self.average)
            sink = self._sink or TensorBoardSink(str(self.run_dir))
            sink.text("config", config_table(cfg))
            # Where this sitting starts: a resumed run's episodes from here on replace those
            # an interrupted sitting played past its last checkpoint (scripts/held.py).
            sink.scalar("perf/start_step", start, start)
            monitor = self.monitor = Monitor(
                sink, self.counters, self.fragments, self.episodes, self.learner_stats,
                cfg.logging.interval_s, cfg.total_timesteps, cfg.logging.progress,
                gauges=self._pump.gauges if self._pump is not None else None, seats=spaces.agents)
            monitor.start()
            self._supervise(sink)
            finished = True
        finally:
            self._shutdown(monitor, sink, threads, finished)
        return self.counters.snapshot()

    def _shutdown(self, monitor, sink, threads: int, finished: bool = False) -> None:
        """Stop everything, in an order that matters: closing the queue wakes actors
        blocked in put (they exit) and learners blocked in get; the checkpoint is written
        as soon as no learner updates; a `finished` run's evaluator then evaluates the
        final weights. Every later step runs even if one fails (or a second Ctrl-C
        arrives), so nothing is left behind."""
        self.learners.stop.set()
        if self.fragments is not None:
            self.fragments.close()
        with contextlib.ExitStack() as later:  # callbacks run last-registered first
            later.callback(torch.set_num_threads, threads)
            later.callback(self.counters.close)
            for made in (self.rounds, self.learner_stats, self.episodes, self.replay):
                if made is not None:  # None: not needed, or `train` failed before making it
                    later.callback(made.close)
            if sink is not None and self._sink is None:
                later.callback(sink.close)
            if monitor is not None:
                later.callback(monitor.stop)  # drains episodes, writes the last values
            if self.evaluator is not None:  # after the checkpoint, before the sink closes
                later.callback(lambda: self.evaluator.close(sink, final=finished and self.saved))
            later.callback(self._stop_actors)  # also if a join below fails
            for learner in self.learners.workers:  # each ends within a gradient step once stopped
                join_worker(learner)
            if self.learners.workers:  # else train failed while starting: nothing was learned
                # Actors first: one that the close stopped takes back the steps it counted for
                # fragments the queue did not take, and the checkpoint's count holds them not.
                self._stop_actors()
                self.save(latest_checkpoint(self.run_dir))
                self.saved = True

    def _supervise(self, sink: Sink) -> None:
        cfg = self.cfg
        next_checkpoint = time.monotonic() + cfg.checkpoint.interval_s
        while not self._budget_spent() and not self._reached_target():
            time.sleep(0.05)
            if self.evaluator is not None:
                self.evaluator.poll(sink)
                if not self.evaluator.is_alive():
                    raise RuntimeError("the evaluator process died; see its error above")
            if not all(learner.is_alive() for learner in self.learners.workers):
                # Without learners the queue fills and the actors wait forever.
                raise RuntimeError(f"a learner {self.cfg.learners.mode} died; see its error above")
            if not self.monitor.is_alive():
                raise RuntimeError("the monitor thread died; see its error above")
            for i, actor in enumerate(self._actors):
                if not actor.is_alive():
                    self._restart_actor(i, actor)
            if self._pump is not None and not self._pump.is_alive():
                # It replaces remote actors itself; it ends only on what it cannot recover from.
                raise self._pump.error or RuntimeError("the Ray pump thread ended; see its error above")
            if cfg.checkpoint.interval_s and time.monotonic() >= next_checkpoint:
                self.save(latest_checkpoint(self.run_dir))
                next_checkpoint += cfg.checkpoint.interval_s

    # ---- actors ----------------------------------------------------------------------

    def _budget_spent(self) -> bool:
        """`total_timesteps` env steps are acted; synchronous actors then act no further
        round, and the run ends once the learner has trained the last one (between updates)."""
        return (self.counters["env_steps"] >= self.cfg.total_timesteps
                and (self.rounds is None
                     or rounds_trained(self.cfg, self.rounds, self.counters, self.start_steps)))

    def _reached_target(self) -> bool:
        target = self.cfg.target_return
        if target is not None and self.cfg.eval.judges_target:
            return self.evaluator.latest_mean >= target  # nan before the first evaluation: False
        returns = self.monitor.recent_returns
        return (target is not None and len(returns) == returns.maxlen
                and self.monitor.mean_recent_return() >= target)

    def _start_actor(self, i: int):
        cfg = self.cfg
        # Seeds differ per actor and per restart, so a restarted actor does not replay
        # the episodes of the one it replaces.
        run_cfg = dataclasses.replace(cfg, seed=cfg.seed + 7919 * self._restarts[i])
        args = (i, run_cfg, self.model, self.fragments, self.episodes, self.counters)
        # A restarted process receives the factory pickled (check_env_factory vouched for it).
        kwargs = {"env_factory": self.env_factory, "rounds": self.rounds}
        if cfg.actors.mode == "thread":
            actor = threading.Thread(target=run_actor, args=(*args, False), kwargs=kwargs,
                                     name=f"a3c-actor-{i}", daemon=True)
        else:
            actor = actor_context(cfg.actors.device).Process(target=run_actor, args=(*args, True), kwargs=kwargs,
                                                             name=f"a3c-actor-{i}", daemon=True)
        actor.start()
        return actor

    def _restart_actor(self, i: int, actor) -> None:
        self._restarts[i] += 1
        code = getattr(actor, "exitcode", None)
        if self._restarts[i] > self.cfg.actors.max_restarts:
            raise RuntimeError(
                f"actor {i} died {self._restarts[i]} times (last exit code {code}); "
                "see its error above, or raise actors.max_restarts"
            )
        actor.join()
        self.counters.add("actor_restarts")
        self._actors[i] = self._start_actor(i)

    def _start_remote_actors(self) -> None:
        from .actors.cluster import RayRuntime
        from .actors.remote import Pump

        self._ray = RayRuntime(self.cfg)
        self._pump = Pump(self.cfg, self.model, self.fragments, self.episodes, self.counters,
                          self.env_factory)
        self._pump.start()

    def _stop_actors(self) -> None:
        """Stop and join every actor, once (later calls return at once)."""
        if self._actors_stopped:
            return
        self._actors_stopped = True
        if self._ray is not None:
            try:
                if self._pump is not None:
                    self._pump.stop()  # kills every remote actor
            finally:
                self._ray.close()  # a Ray instance started for the run stops with it
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for actor in self._actors:
            actor.join(max(0.0, deadline - time.monotonic()))
        for actor in self._actors:
            if isinstance(actor, mp.process.BaseProcess) and actor.is_alive():
                actor.kill()  # stuck in an environment step: nothing left to lose
                actor.join()

    # ---- checkpoints -----------------------------------------------------------------

    def save(self, path: Path) -> None:
        if self.device_copy is not None:  # the learners' newest weights and statistics
            self.device_copy.publish()
            self.optimizer.load_state_dict(self.device_copy.optimizer.state_dict())
            if self.average is not None:
                self.average.load_state_dict(self.device_copy.average.state_dict())
        save_checkpoint(path, self.model.state_dict(), self.optimizer.state_dict(),
                        config_to_dict(self.cfg), self.counters.snapshot(), self.proximal_state())

    def proximal_state(self) -> dict | None:
        """The proximal average's weights as a checkpoint holds them (None: none)."""
        return None if self.average is None else self.average.state_dict()
