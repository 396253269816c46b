"""Local actors: processes or threads of the trainer's machine (`actors.mode` process or
thread), each stepping its environments with a private copy of the shared policy and
putting the fragments into the learners' queue; and synchronous actors (`actors.sync`).
With `env.multiagent`, an actor plays games of several agents (a3c.actors.agents).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from ..config import Config
from ..envs import make_vector_env
from ..models.weights import WeightCopy, clone_policy
from ..procs import as_worker_process
from .agents import run_agents
from .loop import ActorLoop, actor_seed, report_episodes

__all__ = ["SyncGate", "rounds_trained", "run_actor", "sync_rounds"]


def run_actor(actor_id: int, cfg: Config, model: torch.nn.Module, fragments: ArrayQueue,
              episodes: ArrayQueue, counters: Counters, in_process: bool,
              env_factory: Callable | None = None, rounds: Counters | None = None) -> None:
    """Act until the fragment queue is closed. `model` is the shared model: it is read
    (copied into a local one) once per fragment and never written. `env_factory`, when
    given, makes the environments instead of the config's env section. `rounds`
    (`sync_rounds`) is required with `actors.sync`."""
    if cfg.actors.sync and rounds is None:
        raise ValueError("actors.sync needs the run's sync_rounds(...) passed as rounds")
    if in_process:
        as_worker_process()
        # Its samples from its own seed: a forked process would draw its parent's numbers,
        # the same in every actor, and one from the fork server the same in every run.
        torch.manual_seed(actor_seed(cfg, actor_id))
    if cfg.env.multiagent:  # games of several agents: a loop of their own
        run_agents(cfg, model, fragments, episodes, counters, actor_seed(cfg, actor_id), env_factory)
        return
    envs = make_vector_env(cfg.env, cfg.actors.envs_per_actor, env_factory)
    try:
        gate = SyncGate(cfg, counters, rounds, actor_id, fragments) if cfg.actors.sync else None
        _act(envs, model, fragments, episodes, counters, cfg, actor_seed(cfg, actor_id), gate)
    except Closed:
        pass  # the trainer is stopping
    finally:
        envs.close()


def _act(envs, shared: torch.nn.Module, fragments: ArrayQueue, episodes: ArrayQueue,
         counters: Counters, cfg: Config, seed: int, gate: SyncGate | None) -> None:
    local = clone_policy(shared).to(cfg.actors.device)  # acts there; weights copied over per unroll
    copy_weights = WeightCopy(local, shared)
    loop = ActorLoop(envs, local, cfg.actors.unroll_length, seed)
    buf = np.zeros(loop.E, fragments.dtype)  # one fragment per environment
    while True:
        if gate is not None:
            gate.wait()
        start = time.perf_counter()
        copy_weights()  # a recent policy, once per fragment
        unroll = loop.unroll(buf, counters["policy_version"])
        report_episodes(unroll.episodes, episodes, counters)
        # Counted before the put: a learner that trains on these fragments reads a count
        # (for its learning rate) that holds them, whatever the timing. What the queue did
        # not take (it closed: the trainer is stopping) is taken back, so that the count,
        # and the final checkpoint's, holds only the steps that went in.
        counters.add("env_steps", buf.size * loop.T)
        before_put = time.perf_counter()
        put = fragments.put_many(buf)  # waits while the learners are behind
        if put < len(buf):
            counters.add("env_steps", -(len(buf) - put) * loop.T)
            return
        if gate is not None:
            gate.put()
        done_at = time.perf_counter()
        counters.add("queue_puts", len(buf))
        counters.add("actor_env_s", unroll.env_s)
        counters.add("actor_policy_s", before_put - start - unroll.env_s)  # inference, bookkeeping
        counters.add("actor_queue_s", done_at - before_put)


def sync_rounds(cfg: Config, fresh_batches: int) -> Counters:
    """The shared state of synchronous actors (`actors.sync`): each actor's unrolls put
    so far, in shared memory so that a restarted actor carries on from its predecessor's
    count, and `start`, the learners' `fresh_batches` when the run (or resume) began.
    The trainer makes it, hands it to every actor it starts, and closes it."""
    rounds = Counters(["start", *(f"actor_{i}" for i in range(cfg.actors.num))])
    rounds.set("start", fresh_batches)
    return rounds


class SyncGate:
    """Synchronous actors (`actors.sync`): each of the N actors acts B / (N x E) unrolls
    of its E environments per fresh batch of B fragments (a round), then waits until the
    learner has trained on a fresh batch (the `fresh_batches` counter). Actor i's u-th
    unroll (u: its count in `rounds`) belongs to round u // (B / (N x E)), and starts
    once that many fresh batches are trained since the start. The learner trains on
    batch n only once all its fragments are in, and none of batch n + 1's can be acted
    before batch n's update: every fresh batch is acted by the policy version its update
    starts from. (Observation statistics, where the model normalizes them, take in the
    batch before its first step.)

    Once `total_timesteps` env steps are acted, no actor starts another round: the
    learner's last batch is the last one acted, and the run ends once it is trained
    (`rounds_trained`), between updates.

    The count is kept in shared memory and added to only once an unroll is in the
    queue, so an actor that dies mid-round is replaced by one that acts the unrolls it
    left: no round runs short (a wait forever) or long (a surplus that would make every
    later batch part stale), short of a death between a put and its count, which leaves
    one unroll over. (Counting before the put would instead lose one, and wait forever.)"""

    # The wait is one update long (tens to hundreds of ms): polls start short and back
    # off, so that waiting actors take little of the cores the learner is using.
    FIRST_POLL_S, LONGEST_POLL_S = 0.0002, 0.005

    def __init__(self, cfg: Config, counters: Counters, rounds: Counters, actor_id: int,
                 fragments: ArrayQueue):
        a = cfg.actors
        self.per_round = cfg.learners.batch_size // (a.num * a.envs_per_actor)
        self.counters, self.rounds, self.fragments = counters, rounds, fragments
        self.name = f"actor_{actor_id}"
        self.start = rounds["start"]  # set once, before any actor starts
        self.total = cfg.total_timesteps

    def wait(self) -> None:
        """Return when this actor's next unroll may start; raises Closed if the queue
        closes while it waits (the trainer is stopping)."""
        unrolls = self.rounds[self.name]
        self._wait_for(self.start + unrolls // self.per_round)
        # A round starts once the last one is trained, so every actor's steps of it are
        # counted (before their put) and all actors see one count here.
        if unrolls % self.per_round == 0 and self.counters["env_steps"] >= self.total:
            self._wait_for(float("inf"))  # the budget is spent: act no further round

    def _wait_for(self, due: float) -> None:
        """Wait until the learner has trained `due` fresh batches, or raise Closed."""
        if self.counters["fresh_batches"] >= due:
            return
        started, poll = time.perf_counter(), self.FIRST_POLL_S
        while self.counters["fresh_batches"] < due:
            if self.fragments.closed:
                raise Closed("the queue closed while the actor waited for an update")
            time.sleep(poll)
            poll = min(2 * poll, self.LONGEST_POLL_S)
        self.counters.add("actor_sync_s", time.perf_counter() - started)

    def put(self) -> None:
        """An unroll is in the queue."""
        self.rounds.add(self.name)


def rounds_trained(cfg: Config, rounds: Counters, counters: Counters, start_steps: int) -> bool:
    """Whether the learner has trained every round that synchronous actors began since
    `rounds` was made (`sync_rounds`), when the env step count was `start_steps`. A round
    is a batch of B fragments of T steps, and its steps count as they are acted, before
    their put: one begun counts whole."""
    acted = -(-(counters["env_steps"] - start_steps) // (cfg.learners.batch_size * cfg.actors.unroll_length))
    return counters["fresh_batches"] - rounds["start"] >= acted
