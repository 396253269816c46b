"""Actors: step a vector of environments with a recent copy of the policy and push
rollout fragments into the queue.

One queue item is one fragment: `unroll_length` (T) steps of one environment, with the
observation after the last step for bootstrapping. Field by field, step t holds
`obs[t]` (what the policy saw), `action[t]`, `reward[t]`, `terminated[t]`,
`truncated[t]`, `logp[t]` (the behaviour policy's log-probability of the action, for
V-trace), `version[t]` (the policy version that acted) and `trunc_value[t]` (the
behaviour value of the final observation where `truncated[t]`, so that the learner can
bootstrap a time limit without storing a second observation).
"""
from __future__ import annotations

import queue
import signal
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from .config import Config
from .envs import env_action, make_vector_env
from .model import WeightCopy
from .spaces import action_record, flat_obs, obs_record, obs_to_torch, stack_obs, write_obs

__all__ = ["EPISODE_DTYPE", "fragment_dtype", "run_actor"]

# One finished episode, for charts/episodic_return and charts/episode_length.
EPISODE_DTYPE = np.dtype([("ret", "f8"), ("length", "i8"), ("step", "i8")])


def fragment_dtype(observation_space: gym.Space, action_space: gym.Space, T: int) -> np.dtype:
    """The structured dtype of one fragment of T steps. Observations keep their space's
    dtype (uint8 and bool images stay compact); a Dict or Tuple observation is a
    structured field with one sub-field per leaf (a3c.spaces)."""
    obs_type, obs_shape = obs_record(observation_space)
    action_type, action_shape = action_record(action_space)
    return np.dtype([
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


def run_actor(actor_id: int, cfg: Config, model: torch.nn.Module, fragments: ArrayQueue,
              episodes: ArrayQueue, counters: Counters, in_process: bool,
              env_factory: Callable | None = None) -> None:
    """Act until the fragment queue is closed. `model` is the shared model: it is read
    (copied into a local one) once per fragment and never written. `env_factory`, when
    given, makes the environments instead of the config's env section."""
    if in_process:
        # Ctrl-C reaches the whole process group; the trainer decides how to stop. A
        # forked actor also inherits the command line's SIGTERM handler: back to default.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        torch.set_num_threads(1)
    E = cfg.actors.envs_per_actor
    envs = make_vector_env(cfg.env, E, env_factory)
    try:
        _act(envs, model, fragments, episodes, counters, cfg, seed=cfg.seed * 10_000 + actor_id * E)
    except Closed:
        pass  # the trainer is stopping
    finally:
        envs.close()


def _act(envs, shared: torch.nn.Module, fragments: ArrayQueue, episodes: ArrayQueue,
         counters: Counters, cfg: Config, seed: int) -> None:
    E, T = cfg.actors.envs_per_actor, cfg.actors.unroll_length
    local = _clone(shared)
    copy_weights = WeightCopy(local, shared)
    buf = np.zeros(E, fragments.dtype)  # one fragment per environment
    # Field views, bound once: indexing a record array by name makes a new view each time.
    f_obs, f_action, f_logp, f_version = buf["obs"], buf["action"], buf["logp"], buf["version"]
    f_reward, f_terminated, f_truncated = buf["reward"], buf["terminated"], buf["truncated"]
    f_trunc_value = buf["trunc_value"]
    space = envs.single_observation_space
    obs, _ = envs.reset(seed=seed)
    obs = flat_obs(obs, space)
    ep_return, ep_length = np.zeros(E), np.zeros(E, np.int64)
    while True:
        start = time.perf_counter()
        env_s = 0.0  # time in envs.step, for the per-part profile
        copy_weights()  # a recent policy, once per fragment
        version = counters["policy_version"]
        for t in range(T):
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
            f_trunc_value[:, t] = _final_values(local, info, truncated & ~terminated, space)
            ep_return += reward
            ep_length += 1
            done = terminated | truncated
            if done.any():
                steps = counters["env_steps"]
                finished = np.zeros(int(done.sum()), EPISODE_DTYPE)
                finished["ret"], finished["length"] = ep_return[done], ep_length[done]
                finished["step"] = steps
                try:
                    episodes.put_many(finished, block=False)  # monitoring only: never wait
                except (queue.Full, Closed):  # nobody reading, or stopping: drop, count
                    counters.add("episodes_dropped", len(finished))
                counters.add("episodes", len(finished))
                ep_return[done], ep_length[done] = 0, 0
        write_obs(buf["last_obs"], obs)
        before_put = time.perf_counter()
        if fragments.put_many(buf) < len(buf):  # waits while the learners are behind
            return  # closed while waiting: the trainer is stopping
        done_at = time.perf_counter()
        counters.add("env_steps", E * T)
        counters.add("queue_puts", E)
        counters.add("actor_env_s", env_s)
        counters.add("actor_policy_s", before_put - start - env_s)  # inference, bookkeeping
        counters.add("actor_queue_s", done_at - before_put)


def _final_values(model, info: dict, truncated: np.ndarray, space: gym.Space) -> np.ndarray:
    """The value of the final observation of each truncated episode, else 0."""
    values = np.zeros(len(truncated), np.float32)
    if truncated.any():
        final = stack_obs([info["final_obs"][i] for i in np.flatnonzero(truncated)], space)
        _, _, v = model.act(obs_to_torch(final))
        values[truncated] = v.numpy()
    return values


def _clone(model: torch.nn.Module) -> torch.nn.Module:
    """A private copy for acting, so reading weights never races a learner's update
    in the middle of a forward pass."""
    import copy

    local = copy.deepcopy(model)
    for p in local.parameters():
        p.requires_grad_(False)
    return local
