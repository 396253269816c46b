"""Actors: step a vector of environments with a recent copy of the policy and push
rollout fragments into the queue.

One queue item is one fragment: `unroll_length` (T) steps of one environment, with the
observation after the last step for bootstrapping. Field by field, step t holds
`obs[t]` (what the policy saw), `action[t]`, `reward[t]`, `terminated[t]`,
`truncated[t]`, `logp[t]` (the behaviour policy's log-probability of the action, for
V-trace), `version[t]` (the policy version that acted) and `trunc_value[t]` (the
behaviour value of the final observation where `truncated[t]`, so that the learner can
bootstrap a time limit without storing a second observation). With a recurrent policy a
fragment also holds `state`: the core state the actor read `obs[0]` from (already reset
if `obs[0]` began an episode); the learner unrolls the fragment from it, resetting where
an episode ended inside.

`ActorLoop` is the one loop that fills fragments. A local actor (`run_actor`, a process
or a thread) copies the shared weights into its policy before each unroll and puts the
fragments into the queue; a remote one (`a3c.remote`) loads published weights and returns
the fragments to the trainer, which puts them into the same queue.
"""
from __future__ import annotations

import ctypes
import os
import queue
import signal
import time
from collections.abc import Callable
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from .config import Config
from .envs import env_action, make_vector_env
from .model import WeightCopy
from .spaces import action_record, flat_obs, obs_record, obs_to_torch, stack_obs, write_obs

__all__ = ["EPISODE_DTYPE", "JOIN_TIMEOUT_S", "ActorLoop", "SyncGate", "Unroll", "actor_seed",
           "end_with_parent", "fragment_dtype", "run_actor", "sync_rounds"]

# One finished episode, for charts/episodic_return and charts/episode_length.
EPISODE_DTYPE = np.dtype([("ret", "f8"), ("length", "i8"), ("step", "i8")])
# A worker (actor or learner process, or the Ray pump's thread) still running this long
# after it was asked to stop is stuck, and is killed or left to the process's end.
JOIN_TIMEOUT_S = 10.0


def fragment_dtype(observation_space: gym.Space, action_space: gym.Space, T: int,
                   state_size: int = 0) -> np.dtype:
    """The structured dtype of one fragment of T steps. Observations keep their space's
    dtype (uint8 and bool images stay compact); a Dict or Tuple observation is a
    structured field with one sub-field per leaf (a3c.spaces). `state_size` > 0 (a
    recurrent policy's) adds the `state` field."""
    obs_type, obs_shape = obs_record(observation_space)
    action_type, action_shape = action_record(action_space)
    state = [("state", np.float32, (state_size,))] if state_size else []
    return np.dtype([*state,
        ("obs", obs_type, (T, *obs_shape)),
        ("last_obs", obs_type, obs_shape),
        ("action", action_type, (T, *action_shape)),
        ("reward", np.float32, (T,)),
        ("logp", np.float32, (T,)),
        ("trunc_value", np.float32, (T,)),
        ("version", np.int64, (T,)),
        ("terminated", np.bool_, (T,)),
        ("truncated", np.bool_, (T,)),
    ])


def actor_seed(cfg: Config, actor_id: int) -> int:
    """The seed of actor `actor_id`'s first environment (the others follow it)."""
    return cfg.seed * 10_000 + actor_id * cfg.actors.envs_per_actor


class Unroll(NamedTuple):
    """What one unroll produced besides its fragments."""
    episodes: np.ndarray  # EPISODE_DTYPE, the episodes that ended; `step` is left 0
    env_s: float  # seconds in envs.step
    policy_s: float  # seconds in the rest: inference, writing the fragments


class ActorLoop:
    """Steps `envs` (a vector of E environments) with `policy` and writes one fragment of
    T steps per environment. The caller keeps `policy`'s weights current (a local actor
    copies the shared model, a remote one loads published weights) and says which policy
    version they are; each environment's next fragment starts where its last one ended."""

    def __init__(self, envs: gym.vector.VectorEnv, policy: torch.nn.Module, T: int, seed: int):
        self.envs, self.policy, self.T = envs, policy, T
        self.E = envs.num_envs
        self._space = envs.single_observation_space
        obs, _ = envs.reset(seed=seed)
        self._obs = flat_obs(obs, self._space)
        self._return, self._length = np.zeros(self.E), np.zeros(self.E, np.int64)
        # A recurrent policy's core state, carried across steps and fragments, and which
        # environments' current observation begins an episode (the state resets there).
        self._recurrent = getattr(policy, "is_recurrent", False)
        self._state = policy.initial_state(self.E) if self._recurrent else None
        self._starts = torch.ones(self.E, dtype=torch.bool)

    def unroll(self, out: np.ndarray, version: int) -> Unroll:
        """Fill `out` (E records of the fragment dtype) with the next T steps of every
        environment, acted by policy version `version`."""
        start = time.perf_counter()
        env_s = 0.0  # time in envs.step, for the per-part profile
        envs, local, space, obs = self.envs, self.policy, self._space, self._obs
        # Field views, bound once: indexing a record array by name makes a new view each time.
        f_obs, f_action, f_logp, f_version = out["obs"], out["action"], out["logp"], out["version"]
        f_reward, f_terminated, f_truncated = out["reward"], out["terminated"], out["truncated"]
        f_trunc_value = out["trunc_value"]
        ep_return, ep_length = self._return, self._length
        recurrent, state, starts = self._recurrent, self._state, self._starts
        if recurrent:  # the state obs[0] is read from, reset where it begins an episode
            state = state * (~starts).unsqueeze(-1)
            out["state"] = state.numpy()
        finished = []
        for t in range(self.T):
            if recurrent:
                action, logp, _, state = local.act_recurrent(obs_to_torch(obs), state, starts)
            else:
                action, logp, _ = local.act(obs_to_torch(obs))
            action = action.numpy()
            write_obs(f_obs[:, t], obs)
            f_action[:, t] = action
            f_logp[:, t] = logp.numpy()
            f_version[:, t] = version
            before_step = time.perf_counter()
            obs, reward, terminated, truncated, info = envs.step(
                env_action(action, envs.single_action_space))
            env_s += time.perf_counter() - before_step
            obs = flat_obs(obs, space)
            f_reward[:, t] = reward
            f_terminated[:, t] = terminated
            f_truncated[:, t] = truncated & ~terminated
            f_trunc_value[:, t] = _final_values(local, info, truncated & ~terminated, space, state)
            ep_return += reward
            ep_length += 1
            done = terminated | truncated
            starts = torch.from_numpy(done)
            if done.any():
                ended = np.zeros(int(done.sum()), EPISODE_DTYPE)
                ended["ret"], ended["length"] = ep_return[done], ep_length[done]
                finished.append(ended)
                ep_return[done], ep_length[done] = 0, 0
        write_obs(out["last_obs"], obs)
        self._obs, self._state, self._starts = obs, state, starts
        episodes = np.concatenate(finished) if finished else np.zeros(0, EPISODE_DTYPE)
        return Unroll(episodes, env_s, time.perf_counter() - start - env_s)


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
        # Ctrl-C reaches the whole process group; the trainer decides how to stop. A
        # forked actor also inherits the command line's SIGTERM handler: back to default.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        end_with_parent()
        torch.set_num_threads(1)
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
    local = clone_policy(shared)
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
        before_put = time.perf_counter()
        if fragments.put_many(buf) < len(buf):  # waits while the learners are behind
            return  # closed while waiting: the trainer is stopping
        if gate is not None:
            gate.put()
        done_at = time.perf_counter()
        counters.add("env_steps", buf.size * loop.T)
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

    def wait(self) -> None:
        """Return when this actor's next unroll may start; raises Closed if the queue
        closes while it waits (the trainer is stopping)."""
        due = self.start + self.rounds[self.name] // self.per_round
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


def end_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent ends (Linux's
    PR_SET_PDEATHSIG), however it ends: a trainer killed with SIGKILL, or whose SIGTERM
    handler never ran, cannot stop its actors (or learner processes), and without this
    they would wait on the queue forever. The parent is the trainer, or the fork server,
    which ends with the trainer (restarted actors, and learner processes where an
    accelerator is visible, come from it)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def report_episodes(finished: np.ndarray, episodes: ArrayQueue, counters: Counters) -> None:
    """Count the episodes that ended and hand them to the monitor, stamped with the env
    steps counted so far."""
    if not len(finished):
        return
    finished["step"] = counters["env_steps"]
    try:
        episodes.put_many(finished, block=False)  # monitoring only: never wait
    except (queue.Full, Closed):  # nobody reading, or stopping: drop, count
        counters.add("episodes_dropped", len(finished))
    counters.add("episodes", len(finished))


def _final_values(model, info: dict, truncated: np.ndarray, space: gym.Space,
                  state: torch.Tensor | None) -> np.ndarray:
    """The value of the final observation of each truncated episode, else 0. A recurrent
    policy reads it from `state`, the state after the episode's last step."""
    values = np.zeros(len(truncated), np.float32)
    if truncated.any():
        index = np.flatnonzero(truncated)
        final = obs_to_torch(stack_obs([info["final_obs"][i] for i in index], space))
        if state is None:
            _, _, v = model.act(final)
        else:
            rows = torch.from_numpy(index)
            _, _, v, _ = model.act_recurrent(final, state[rows], torch.zeros(len(index), dtype=torch.bool))
        values[truncated] = v.numpy()
    return values


def clone_policy(model: torch.nn.Module) -> torch.nn.Module:
    """A private copy for acting, so reading weights never races a learner's update
    in the middle of a forward pass."""
    import copy

    local = copy.deepcopy(model)
    for p in local.parameters():
        p.requires_grad_(False)
    return local
