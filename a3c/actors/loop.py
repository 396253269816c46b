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
fragments into the queue; a remote one (`a3c.actors.remote`) loads published weights and returns
the fragments to the trainer, which puts them into the same queue.
"""
from __future__ import annotations

import queue
import time
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from ..config import Config
from ..envs import env_action
from ..envs.spaces import action_record, flat_obs, obs_record, obs_to_torch, stack_obs, write_obs

__all__ = ["EPISODE_DTYPE", "ActorLoop", "Unroll", "actor_seed", "fragment_dtype", "report_episodes"]

# One finished episode, for charts/episodic_return and charts/episode_length; `seat`: the
# agent's index in a game of several agents (a3c.actors.agents), else 0.
EPISODE_DTYPE = np.dtype([("ret", "f8"), ("length", "i8"), ("step", "i8"), ("seat", "i8")])


def fragment_dtype(observation_space: gym.Space, action_space: gym.Space, T: int,
                   state_size: int = 0) -> np.dtype:
    """The structured dtype of one fragment of T steps. Observations keep their space's
    dtype (uint8 and bool images stay compact); a Dict or Tuple observation is a
    structured field with one sub-field per leaf (a3c.envs.spaces). `state_size` > 0 (a
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
    version they are; each environment's next fragment starts where its last one ended.
    The policy acts on the device its weights are on (`actors.device`): observations go
    there each step, actions and log-probabilities come back."""

    def __init__(self, envs: gym.vector.VectorEnv, policy: torch.nn.Module, T: int, seed: int):
        self.envs, self.policy, self.T = envs, policy, T
        self.device = next(policy.parameters()).device
        self.E = envs.num_envs
        self._space = envs.single_observation_space
        obs, _ = envs.reset(seed=seed)
        self._obs = flat_obs(obs, self._space)
        self._return, self._length = np.zeros(self.E), np.zeros(self.E, np.int64)
        # A recurrent policy's core state, carried across steps and fragments, and which
        # environments' current observation begins an episode (the state resets there).
        self._recurrent = getattr(policy, "is_recurrent", False)
        self._state = policy.initial_state(self.E) if self._recurrent else None
        self._starts = torch.ones(self.E, dtype=torch.bool, device=self.device)

    def unroll(self, out: np.ndarray, version: int) -> Unroll:
        """Fill `out` (E records of the fragment dtype) with the next T steps of every
        environment, acted by policy version `version`."""
        start = time.perf_counter()
        env_s = 0.0  # time in envs.step, for the per-part profile
        envs, local, space, obs, device = self.envs, self.policy, self._space, self._obs, self.device
        # Field views, bound once: indexing a record array by name makes a new view each time.
        f_obs, f_action, f_logp, f_version = out["obs"], out["action"], out["logp"], out["version"]
        f_reward, f_terminated, f_truncated = out["reward"], out["terminated"], out["truncated"]
        f_trunc_value = out["trunc_value"]
        ep_return, ep_length = self._return, self._length
        recurrent, state, starts = self._recurrent, self._state, self._starts
        if recurrent:  # the state obs[0] is read from, reset where it begins an episode
            state = state * (~starts).unsqueeze(-1)
            out["state"] = state.cpu().numpy()
        finished = []
        for t in range(self.T):
            if recurrent:
                action, logp, _, state = local.act_recurrent(obs_to_torch(obs, device), state, starts)
            else:
                action, logp, _ = local.act(obs_to_torch(obs, device))
            action = action.cpu().numpy()
            write_obs(f_obs[:, t], obs)
            f_action[:, t] = action
            f_logp[:, t] = logp.cpu().numpy()
            f_version[:, t] = version
            before_step = time.perf_counter()
            obs, reward, terminated, truncated, info = envs.step(
                env_action(action, envs.single_action_space))
            env_s += time.perf_counter() - before_step
            obs = flat_obs(obs, space)
            f_reward[:, t] = reward
            f_terminated[:, t] = terminated
            f_truncated[:, t] = truncated & ~terminated
            f_trunc_value[:, t] = _final_values(local, info, truncated & ~terminated, space, state, device)
            ep_return += reward
            ep_length += 1
            done = terminated | truncated
            starts = torch.from_numpy(done).to(device)
            if done.any():
                ended = np.zeros(int(done.sum()), EPISODE_DTYPE)
                ended["ret"], ended["length"] = ep_return[done], ep_length[done]
                finished.append(ended)
                ep_return[done], ep_length[done] = 0, 0
        write_obs(out["last_obs"], obs)
        self._obs, self._state, self._starts = obs, state, starts
        episodes = np.concatenate(finished) if finished else np.zeros(0, EPISODE_DTYPE)
        return Unroll(episodes, env_s, time.perf_counter() - start - env_s)


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
                  state: torch.Tensor | None, device: torch.device) -> np.ndarray:
    """The value of the final observation of each truncated episode, else 0. A recurrent
    policy reads it from `state`, the state after the episode's last step."""
    values = np.zeros(len(truncated), np.float32)
    if truncated.any():
        index = np.flatnonzero(truncated)
        final = obs_to_torch(stack_obs([info["final_obs"][i] for i in index], space), device)
        if state is None:
            _, _, v = model.act(final)
        else:
            rows = torch.from_numpy(index).to(device)
            _, _, v, _ = model.act_recurrent(final, state[rows], torch.zeros(len(index), dtype=torch.bool,
                                                                              device=device))
        values[truncated] = v.cpu().numpy()
    return values
