"""Remote actors on a Ray cluster (`actors.mode: ray`).

    Ray actors, on any node                                the trainer's process
    ActorLoop: envs_per_actor envs x T steps  --sample()-->  pump thread --put_many--> ArrayQueue --> learners
    loads the weights a call carries when            |                                    |
    their version is newer than its own  <--(version, ref)-- one ray.put of the model state <--+
                                                           every ray.weights_interval_*

Fragments still end in the learners' `ArrayQueue`, so learners do not know where actors
run. A remote actor runs the same loop as a local one (`a3c.actors.loop.ActorLoop`); a call
returns `fragments_per_call` fragments of each of its environments as one numpy record
array of the queue's dtype (numpy, not torch tensors: a reader on the same node maps it
from the object store without a copy), with the episodes that ended and the seconds spent
per part. The C counters live in one machine's shared memory, so the pump adds those to
the trainer's counters and episode queue; TensorBoard shows the same tags as for a local
run, plus `ray/`.

Back-pressure: at most `calls_in_flight` calls per actor are out; a result that arrives
is replaced by a new call, then copied into the queue, and no call goes out while the
pump waits there for room. A full queue stops the pump, which stops the actors after the
calls already out, so the object store holds at most actors x calls_in_flight results
and the one being copied (RLlib's unbounded requests filled it: ray#24329).

Weights are pulled, not pushed: the pump publishes the model state (parameters and
buffers, the normalizer statistics with them) with one `ray.put`, tagged with the policy
version, and every call carries the newest (version, ref); the actor fetches the state
only when that version is newer than its own. A push under back-pressure drops
broadcasts and leaves actors on stale weights (RLlib's EnvRunnerStateServer, ray#48314).

Faults: a dead actor (its process killed, its node removed) fails its pending calls with
RayActorError; a call out longer than `call_timeout_s` counts the same. Its outstanding
fragments are counted lost (`fragments_lost`), it is killed and a new one started on any
live node, counted in `actor_restarts` against `actors.max_restarts` and reseeded as a
local actor is. Ray's own actor restarts are off: a new actor gets fresh constructor
arguments (a restart re-running the constructor can fail on an evicted argument, ray#53727).
Every wait on Ray has a timeout.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from ..config import Config
from ..envs import make_vector_env
from ..files import excerpt
from ..models.weights import clone_policy
from ..procs import JOIN_TIMEOUT_S
from .cluster import ClusterError, import_ray
from .loop import ActorLoop, actor_seed, report_episodes

__all__ = ["Pump", "RemoteActor", "Sample"]

log = logging.getLogger(__name__)

_WAIT_S = 0.05  # the pump's longest wait on Ray: it also publishes weights and checks deadlines


_GET_TIMEOUT_S = 10.0  # reading a result that ray.wait found ready (it is on this node already)


class Sample(NamedTuple):
    """What one call of `RemoteActor.sample` returns."""

    fragments: np.ndarray  # fragments_per_call x envs_per_actor records of the queue's dtype
    episodes: np.ndarray  # EPISODE_DTYPE: the episodes that ended; `step` is left 0
    env_s: float  # seconds in envs.step
    policy_s: float  # seconds in the rest: inference, loading weights, writing fragments
    node_id: str  # the Ray node the actor runs on


class RemoteActor:
    """The body of a remote actor (made a Ray actor class by `ray.remote(RemoteActor)`):
    envs_per_actor environments stepped by `ActorLoop`, with a private copy of the policy.
    Its constructor arguments are small, or a reference the trainer keeps alive."""

    def __init__(self, cfg: Config, model: torch.nn.Module, dtype: np.dtype, seed: int,
                 env_factory: Callable | None = None):
        import ray

        torch.set_num_threads(1)  # parallelism comes from actors
        torch.manual_seed(seed)  # its own samples: every fresh process starts torch from one seed
        self.policy = clone_policy(model)
        # Never closed here: the actor's process ends with it (ray.kill), and with the process
        # any threads its environments run (the ALE backend's).
        self.envs = make_vector_env(cfg.env, cfg.actors.envs_per_actor, env_factory)
        self.loop = ActorLoop(self.envs, self.policy, cfg.actors.unroll_length, seed)
        self.dtype, self.per_call = dtype, cfg.ray.fragments_per_call
        self.version = -1  # of the weights in self.policy; the model's own weights are unpublished
        self.node_id = ray.get_runtime_context().get_node_id()

    def sample(self, version: int, weights: list) -> Sample:
        """`fragments_per_call` fragments of each environment. `weights` holds the reference
        to the state published as `version`, inside a list so that Ray passes the reference
        and does not fetch the state for every call: it is fetched only when newer."""
        started = time.perf_counter()
        if version > self.version:
            self._load(weights[0])
            self.version = version
        E = self.loop.E
        out = np.zeros(self.per_call * E, self.dtype)
        episodes, env_s = [], 0.0
        for k in range(self.per_call):
            unroll = self.loop.unroll(out[k * E:(k + 1) * E], self.version)
            episodes.append(unroll.episodes)
            env_s += unroll.env_s
        return Sample(out, np.concatenate(episodes), env_s,
                      time.perf_counter() - started - env_s, self.node_id)

    def _load(self, ref) -> None:
        import ray

        state = ray.get(ref, timeout=_GET_TIMEOUT_S)
        with warnings.catch_warnings():
            # The arrays map the object store read-only; torch warns that a tensor made on
            # them must not be written. They are only read, copied into the policy.
            warnings.simplefilter("ignore", UserWarning)
            self.policy.load_state_dict({name: torch.from_numpy(array) for name, array in state.items()})


class _Call(NamedTuple):
    actor: int
    issued: float  # time.monotonic()


class _Published(NamedTuple):
    version: int
    ref: Any  # ray.ObjectRef of {name: array}
    at: float  # time.monotonic()


class Pump(threading.Thread):
    """Runs the remote actors of a run: starts them, keeps `calls_in_flight` sample calls
    out per actor, puts what returns into the learners' queue and adds its steps, episodes
    and timers to the counters, publishes the weights, and replaces actors that fail. Ray
    must be initialised (RayRuntime). After a failure it cannot recover from (an actor past
    actors.max_restarts) the thread ends with `error` set; `stop()` ends it and every actor.
    `actor` is the class remote actors are made of: RemoteActor, or one with its
    constructor and `sample` (scripts/bench_scale.py swaps in one that returns ready-made
    fragments, to time the pump alone)."""

    def __init__(self, cfg: Config, model: torch.nn.Module, fragments: ArrayQueue,
                 episodes: ArrayQueue, counters: Counters, env_factory: Callable | None = None,
                 actor: type = RemoteActor):
        super().__init__(name="a3c-ray-pump", daemon=True)
        ray = self.ray = import_ray()
        self.cfg, self.model, self.env_factory = cfg, model, env_factory
        self.fragments, self.episodes, self.counters = fragments, episodes, counters
        self.error: BaseException | None = None
        self.nodes: dict[int, str] = {}  # actor -> the node its last result came from
        self._per_call = cfg.ray.fragments_per_call * cfg.actors.envs_per_actor  # fragments
        self._remote = ray.remote(actor)
        try:
            # One copy in the object store for every actor started, kept alive (and so never
            # evicted) by this reference for the whole run.
            self._model_ref = ray.put(model)
        except Exception as error:  # a model cloudpickle cannot take
            raise ClusterError(f"the model cannot be sent to remote actors ({type(error).__name__}: "
                               f"{excerpt(error, 200)})") from None
        self._actors: list = [None] * cfg.actors.num
        self._restarts = [0] * cfg.actors.num
        self._pending: dict[Any, _Call] = {}  # ObjectRef -> the call that will fill it
        self._published = _Published(-1, None, time.monotonic())
        self._stopping = threading.Event()
        self._moved = 0  # bytes of fragments put into the queue
        self._idle = 0.0  # seconds the pump waited for results
        self._gauged = (time.monotonic(), 0, 0.0)
        self._store_state: Any = None  # for the object store's use; False once it failed

    # ---- the loop --------------------------------------------------------------------

    def run(self) -> None:
        ray = self.ray
        try:
            self._publish(force=True)
            for i in range(len(self._actors)):
                self._start(i)
            while not self._stopping.is_set():
                self._publish()
                self._issue()
                self._expire()
                waited_from = time.perf_counter()
                if not self._pending:
                    self._stopping.wait(_WAIT_S)
                    self._idle += time.perf_counter() - waited_from
                    continue
                ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=_WAIT_S)
                self._idle += time.perf_counter() - waited_from
                for ref in ready:
                    self._receive(ref)
        except Closed:
            pass  # the queue closed: the trainer is stopping
        except BaseException as error:  # the trainer's supervisor raises it in the main thread
            if not self._stopping.is_set():
                self.error = error

    def stop(self) -> None:
        """End the thread, kill every remote actor and drop the results still out."""
        self._stopping.set()
        self._store_state = False  # the monitor's last write must not wait on a closing cluster
        if self.is_alive():
            self.join(JOIN_TIMEOUT_S)
        for actor in self._actors:
            self._kill(actor)
        self._actors = [None] * len(self._actors)
        self._pending.clear()
        self._published = self._published._replace(ref=None)
        self._model_ref = None

    def _issue(self) -> None:
        """Top every actor up to calls_in_flight calls, each carrying the newest weights."""
        out = collections.Counter(call.actor for call in self._pending.values())
        version, ref = self._published.version, self._published.ref
        now = time.monotonic()
        for i, actor in enumerate(self._actors):
            for _ in range(self.cfg.ray.calls_in_flight - out[i]):
                self._pending[actor.sample.remote(version, [ref])] = _Call(i, now)

    def _receive(self, ref) -> None:
        ray, counters = self.ray, self.counters
        call = self._pending.pop(ref)
        try:
            sample = ray.get(ref, timeout=_GET_TIMEOUT_S)
        except ray.exceptions.RayError as error:  # the actor died, or raised
            self._replace(call.actor, error, lost_calls=1)
            return
        self.nodes[call.actor] = sample.node_id
        # The actor's next call goes out before the copy into the queue, so that with calls
        # as short as the copy it has one to work on meanwhile. Results out stay bounded:
        # while the copy waits for room, no call is issued.
        self._publish()
        self._issue()
        report_episodes(np.array(sample.episodes), self.episodes, counters)  # a writable copy
        before = time.perf_counter()
        put = self.fragments.put_many(sample.fragments)  # waits while the learners are behind
        counters.add("actor_queue_s", time.perf_counter() - before)
        self._moved += put * self.fragments.dtype.itemsize
        counters.add("env_steps", put * self.cfg.actors.unroll_length)
        counters.add("queue_puts", put)
        counters.add("actor_env_s", sample.env_s)
        counters.add("actor_policy_s", sample.policy_s)
        if put < len(sample.fragments):
            raise Closed  # closed while waiting: the trainer is stopping

    def _expire(self) -> None:
        """Replace the actors of calls out past call_timeout_s that have not returned."""
        limit = self.cfg.ray.call_timeout_s
        now = time.monotonic()
        overdue = [ref for ref, call in self._pending.items() if now - call.issued > limit]
        if not overdue:
            return
        # Returned meanwhile (the pump waited on a full queue): received as usual.
        _, late = self.ray.wait(overdue, num_returns=len(overdue), timeout=0)
        for ref in late:
            call = self._pending.get(ref)
            if call is not None:  # not already dropped with another call of its actor
                self._replace(call.actor, TimeoutError(
                    f"a call was not back after ray.call_timeout_s ({limit:g} s); if the actor "
                    "never started, the cluster may lack the CPUs or resources it asks for "
                    "(ray status)"), lost_calls=0)

    # ---- actors ----------------------------------------------------------------------

    def _start(self, i: int) -> None:
        cfg, rc = self.cfg, self.cfg.ray
        # Seeds differ per actor and per restart, as for local actors.
        run_cfg = dataclasses.replace(cfg, seed=cfg.seed + 7919 * self._restarts[i])
        options = dict(num_cpus=rc.num_cpus, resources=dict(rc.resources or {}),
                       max_restarts=0, max_task_retries=0,
                       scheduling_strategy="SPREAD" if rc.spread else "DEFAULT")
        self._actors[i] = self._remote.options(**options).remote(
            run_cfg, self._model_ref, self.fragments.dtype, actor_seed(run_cfg, i), self.env_factory)

    def _replace(self, i: int, error: BaseException, lost_calls: int) -> None:
        """Actor i failed: count its outstanding fragments lost, kill it, start another."""
        mine = [ref for ref, call in self._pending.items() if call.actor == i]
        for ref in mine:
            del self._pending[ref]
        lost = (len(mine) + lost_calls) * self._per_call
        self.counters.add("fragments_lost", lost)
        self._kill(self._actors[i])
        self.nodes.pop(i, None)
        self._restarts[i] += 1
        why = _describe(error, self.ray)
        if self._restarts[i] > self.cfg.actors.max_restarts:
            raise RuntimeError(f"remote actor {i} failed {self._restarts[i]} times (last: {why}); "
                               "see its error above, or raise actors.max_restarts")
        self.counters.add("actor_restarts")
        log.warning("remote actor %d failed (%s); %d fragments lost; starting it again%s", i, why,
                    lost, f"\n{error}" if _raised(error, self.ray) else "")
        self._start(i)

    def _kill(self, actor) -> None:
        if actor is not None:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # gone already, or Ray is shutting down: nothing left to stop
                pass

    # ---- weights ---------------------------------------------------------------------

    def _publish(self, force: bool = False) -> None:
        """Put the model state in the object store once it is weights_interval_updates
        updates newer than the last published, or weights_interval_s seconds later."""
        rc, last = self.cfg.ray, self._published
        # The version first, then the weights: learners update, then count the version, so
        # the weights published are at least the version they are tagged with.
        version, now = self.counters["policy_version"], time.monotonic()
        if not force:
            if version <= last.version:
                return
            by_updates = rc.weights_interval_updates and version - last.version >= rc.weights_interval_updates
            by_time = rc.weights_interval_s and now - last.at >= rc.weights_interval_s
            if not (by_updates or by_time):
                return
        state = {name: tensor.detach().cpu().numpy() for name, tensor in self.model.state_dict().items()}
        self._published = _Published(version, self.ray.put(state), now)  # put copies: a snapshot

    # ---- monitoring ------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        """The ray/ scalars, for the monitor (called once per interval)."""
        now, moved, idle = time.monotonic(), self._moved, self._idle
        then, moved_then, idle_then = self._gauged
        self._gauged = (now, moved, idle)
        dt = max(now - then, 1e-9)
        published = self._published
        out = {
            "ray/calls_in_flight": len(self._pending),
            "ray/pump_mb_per_s": (moved - moved_then) / dt / 1e6,
            # The share of its time the pump did anything but wait for results (copying
            # into the queue, waiting there for room included): near 1, the pump limits.
            "ray/pump_busy": max(0.0, 1.0 - (idle - idle_then) / dt),
            "ray/weights_age_s": now - published.at,
            "ray/weights_lag": self.counters["policy_version"] - published.version,
            "ray/fragments_lost": self.counters["fragments_lost"],
            "ray/nodes": len(set(self.nodes.values())),
        }
        used = self._object_store_bytes()
        if used is not None:
            out["ray/object_store_mb"] = used / 1e6
        return out

    def _object_store_bytes(self) -> int | None:
        """Bytes in the object stores of all nodes, from one raylet request (a few ms); None
        where this Ray's internal API does not allow it (it is not public)."""
        if self._store_state is False:
            return None
        try:
            from ray._private.internal_api import get_memory_info_reply, get_state_from_address

            if self._store_state is None:
                self._store_state = get_state_from_address(
                    self.ray.get_runtime_context().gcs_address)
            reply = get_memory_info_reply(self._store_state, timeout_seconds=2.0)
            return int(reply.store_stats.object_store_bytes_used)
        except Exception:  # another Ray version, or the cluster is going away: stop asking
            self._store_state = False
            return None


def _raised(error: BaseException, ray) -> bool:
    """Whether the actor's own code raised `error` (its constructor, or sample): then Ray's
    message holds the traceback, worth showing whole."""
    return isinstance(error, ray.exceptions.RayTaskError) or \
        getattr(error, "actor_init_failed", False)


def _describe(error: BaseException, ray) -> str:
    """One line for a failed call: for an error the actor's code raised, the last line of
    its traceback (the exception); else the exception's type and first line."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if _raised(error, ray):
        where = "its constructor" if getattr(error, "actor_init_failed", False) else "it"
        return f"{where} raised {lines[-1].strip()[:300] if lines else type(error).__name__}"
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"
