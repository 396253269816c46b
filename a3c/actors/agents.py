"""Actors for games of several agents (`env.multiagent`): one policy acts for every agent
of E games (parameter sharing), and each agent's steps fill fragments of their own.

A *stream* is one agent of one game: its observations at its own turns, its actions, the
reward it collected until its next turn (or its end), and its terminated and truncated
flags, written into ordinary fragments of T steps (a3c.actors.loop.fragment_dtype), so
that the queue, the learners and the loss see nothing new. Each stream has its own
cursor, recurrent state and episode return. A step is closed when the agent's next turn
or its end brings its reward; a fragment is put once its T-th step is closed, with that
turn's observation to bootstrap from. An agent that leaves mid-episode ends its episode
there, and its stream goes on in the next episode, as an environment's fragments go on
across episodes in a3c.actors.loop.

In a turn-based game (PettingZoo's AEC API) one agent of each game acts per tick; in a
Parallel game every live agent does. All the agents that act in a tick share one batched
forward pass.

Self-play: in a two-player game the policy plays both seats. With a pool of past
versions (`selfplay.pool_size`, a3c.selfplay.Pool), each game is, with probability
`selfplay.pool_prob` at its reset, played by the policy in one seat chosen at random and
by one past version in the others; those seats make no fragments and no episodes.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from replay import ArrayQueue, Closed, Counters

from ..config import Config
from ..envs import EnvError
from ..envs.multiagent import Game, Turn, make_game
from ..envs.spaces import obs_to_torch, stack_obs
from ..models.weights import WeightCopy, clone_policy
from ..selfplay import Pool
from .loop import EPISODE_DTYPE, Unroll, report_episodes

__all__ = ["AgentLoop", "run_agents"]


class AgentLoop:
    """Steps `games` (E games of A agents each) with `policy` for every agent, and returns
    each agent's fragments of T steps as they fill. The caller keeps `policy`'s weights
    current, as for a3c.actors.loop.ActorLoop. `pool`, when given, lends past versions
    for the other seats of some games."""

    def __init__(self, games: list[Game], policy: torch.nn.Module, T: int, seed: int, dtype: np.dtype,
                 pool: Pool | None = None):
        self.games, self.policy, self.T, self.pool = games, policy, T, pool
        self.A = len(games[0].agents)
        S = len(games) * self.A  # streams: stream g * A + i is agent i of game g
        self._space = games[0].observation_space
        self._frags = np.zeros(S, dtype)  # each stream's fragment in progress
        self._cursor = np.zeros(S, np.int64)  # the step of it that the stream is at
        self._pending = np.zeros(S, bool)  # the step at the cursor is acted, its reward to come
        self._return, self._length = np.zeros(S), np.zeros(S, np.int64)
        self._recurrent = getattr(policy, "is_recurrent", False)
        self._state = policy.initial_state(S) if self._recurrent else None
        self._starts = torch.ones(S, dtype=torch.bool)  # the stream's next observation begins an episode
        # Who plays each stream's seat in the game's current episode: 0 the policy, k the
        # pool's k-th past version (1-based).
        self._player = np.zeros(S, np.int64)
        self._rng = np.random.default_rng(seed)
        self._turns: list[list[Turn]] = []
        for g, game in enumerate(games):
            self._assign(g)
            self._turns.append(game.reset(seed=seed + g))

    def unroll(self, version: int) -> tuple[np.ndarray, Unroll]:
        """T ticks of every game, the policy acting as version `version`: the fragments
        that filled (at most one per stream) and the episodes that ended."""
        start = time.perf_counter()
        ready, finished, env_s = [], [], 0.0
        for _ in range(self.T):
            env_s += self._tick(version, ready, finished)
        fragments = np.concatenate(ready) if ready else np.zeros(0, self._frags.dtype)
        episodes = np.concatenate(finished) if finished else np.zeros(0, EPISODE_DTYPE)
        return fragments, Unroll(episodes, env_s, time.perf_counter() - start - env_s)

    def _tick(self, version: int, ready: list, finished: list) -> float:
        """Each game's turns taken in, the agents whose turn it is acting, the games
        stepped; returns the seconds spent in the games."""
        acting: list[tuple[int, Any]] = []  # (stream, observation) of the agents to act
        truncated: list[tuple[int, int, Any]] = []  # (stream, step, final observation)
        full: list[tuple[int, Any]] = []  # (stream, observation to bootstrap from)
        ended: list[tuple[float, int, int]] = []  # (return, length, seat) of the policy's episodes
        env_s = 0.0
        for g, game in enumerate(self.games):
            self._take(g, self._turns[g], acting, truncated, full, ended)
            if game.over:
                before = time.perf_counter()
                self._assign(g)
                turns = game.reset()
                env_s += time.perf_counter() - before
                self._take(g, turns, acting, truncated, full, ended)
        if truncated:  # bootstrap values of time limits, from the state after the last step
            streams = [s for s, _, _ in truncated]
            self._frags["trunc_value"][streams, [t for _, t, _ in truncated]] = \
                self._values(stack_obs([o for _, _, o in truncated], self._space), streams)
        if full:
            streams = [s for s, _ in full]
            _write(self._frags["last_obs"], (streams,), stack_obs([o for _, o in full], self._space))
            ready.append(self._frags[streams])  # a copy: the stream's next steps overwrite its record
            self._cursor[streams] = 0
        if ended:
            records = np.zeros(len(ended), EPISODE_DTYPE)
            records["ret"], records["length"], records["seat"] = zip(*ended)
            finished.append(records)
        actions = self._act(acting, version) if acting else {}
        before = time.perf_counter()
        for g, game in enumerate(self.games):
            if g in actions:
                self._turns[g] = game.step(actions[g])
            elif not game.over:  # else the game would wait forever
                raise EnvError(f"env: a game has agents {game.env.agents} left but none of them has a turn; "
                               f"a PettingZoo environment removes an agent from env.agents once it is done")
            else:
                self._turns[g] = []
        return env_s + time.perf_counter() - before

    def _take(self, g: int, turns: list[Turn], acting: list, truncated: list, full: list, ended: list) -> None:
        """Game g's turns: the policy's pending steps closed with their rewards, ended
        episodes counted, and the agents to act listed."""
        f, T = self._frags, self.T
        for turn in turns:
            s = g * self.A + turn.agent
            done = turn.terminated or turn.truncated
            if self._player[s] == 0:
                self._return[s] += turn.reward
                if self._pending[s]:
                    t = self._cursor[s]
                    f["reward"][s, t] = turn.reward
                    f["terminated"][s, t] = turn.terminated
                    f["truncated"][s, t] = turn.truncated and not turn.terminated
                    if turn.truncated and not turn.terminated:
                        truncated.append((s, t, turn.obs))
                    self._pending[s] = False
                    self._cursor[s] = t + 1
                    if t + 1 == T:
                        full.append((s, turn.obs))
                if done:
                    ended.append((self._return[s], self._length[s], turn.agent))
            if done:
                self._return[s], self._length[s] = 0.0, 0
                self._starts[s] = True
            else:
                acting.append((s, turn.obs))

    def _act(self, acting: list[tuple[int, Any]], version: int) -> dict[int, dict[int, np.ndarray]]:
        """Actions of the acting agents, by game and agent: the policy's (written into
        their streams' fragments) and the past versions'."""
        streams = np.array([s for s, _ in acting])
        obs = stack_obs([o for _, o in acting], self._space)
        players = self._player[streams]
        actions = [None] * len(streams)
        for k in np.unique(players):
            rows = np.flatnonzero(players == k)
            model = self.policy if k == 0 else self.pool.models[k - 1]
            sub = streams[rows]
            part = obs if len(rows) == len(streams) else _rows(obs, rows)
            start_state = None
            if self._recurrent:
                index = torch.from_numpy(sub)
                starts = self._starts[index]
                start_state = self._state[index] * (~starts).unsqueeze(-1)
                action, logp, _, self._state[index] = model.act_recurrent(obs_to_torch(part), self._state[index],
                                                                          starts)
            else:
                action, logp, _ = model.act(obs_to_torch(part))
            action = action.numpy()
            for row, a in zip(rows, action):
                actions[row] = a
            if k == 0:
                self._record(sub, part, action, logp.numpy(), version, start_state)
        self._starts[streams] = False
        by_game: dict[int, dict[int, np.ndarray]] = {}
        for s, a in zip(streams, actions):
            by_game.setdefault(int(s) // self.A, {})[int(s) % self.A] = a
        return by_game

    def _record(self, streams: np.ndarray, obs, action: np.ndarray, logp: np.ndarray, version: int,
                start_state: torch.Tensor | None) -> None:
        """The policy's step at each stream's cursor: what it saw, did and was."""
        f, t = self._frags, self._cursor[streams]
        _write(f["obs"], (streams, t), obs)
        f["action"][streams, t] = action
        f["logp"][streams, t] = logp
        f["version"][streams, t] = version
        if start_state is not None:  # a fragment's first step: the state it starts from
            first = t == 0
            f["state"][streams[first]] = start_state[torch.from_numpy(first)].numpy()
        self._pending[streams] = True
        self._length[streams] += 1

    @torch.no_grad()
    def _values(self, obs, streams: list[int]) -> np.ndarray:
        """The values of final observations, from the streams' states after their last
        steps (a final observation may allow no action, so no policy is sampled)."""
        obs = obs_to_torch(obs)
        if self._recurrent:
            _, values, _ = self.policy.step(obs, self._state[streams], torch.zeros(len(streams), dtype=torch.bool))
        else:
            _, values = self.policy(obs)
        return values.numpy()

    def _assign(self, g: int) -> None:
        """Who plays game g's seats in its next episode: the policy all of them or, with
        probability pool_prob, one of them and a past version the others."""
        seats = slice(g * self.A, (g + 1) * self.A)
        self._player[seats] = 0
        pool = self.pool
        if pool is not None and pool.models and self._rng.random() < pool.prob:
            self._player[seats] = self._rng.integers(len(pool.models)) + 1
            self._player[g * self.A + self._rng.integers(self.A)] = 0


def _rows(obs, rows: np.ndarray):
    """Rows of an observation batch (an array, or a dict of leaf arrays)."""
    return {path: value[rows] for path, value in obs.items()} if isinstance(obs, dict) else obs[rows]


def _write(field: np.ndarray, index: tuple, obs) -> None:
    """Store a batch of observations (an array, or a dict of leaf arrays) at `index` (index
    arrays) of a record field: leaf by leaf, as a fancy index of a field copies it."""
    if isinstance(obs, dict):
        for path, value in obs.items():
            field[path][index] = value
    else:
        field[index] = obs


def run_agents(cfg: Config, shared: torch.nn.Module, fragments: ArrayQueue, episodes: ArrayQueue,
               counters: Counters, seed: int, env_factory: Callable | None = None) -> None:
    """A local actor's body for games of several agents (a3c.actors.local.run_actor):
    envs_per_actor games, each agent's fragments put as they fill, until the queue closes."""
    games = []
    try:
        for _ in range(cfg.actors.envs_per_actor):
            games.append(make_game(cfg.env, env_factory))
        local = clone_policy(shared)
        copy_weights = WeightCopy(local, shared)
        sp = cfg.selfplay
        pool = Pool(local, sp.pool_size, sp.snapshot_interval, sp.pool_prob) if sp.pool_size else None
        loop = AgentLoop(games, local, cfg.actors.unroll_length, seed, fragments.dtype, pool)
        while not fragments.closed:  # looked at here too: an unroll may fill no fragment
            start = time.perf_counter()
            copy_weights()  # a recent policy, once per unroll
            version = counters["policy_version"]
            if pool is not None:
                pool.update(version)
            ready, unroll = loop.unroll(version)
            report_episodes(unroll.episodes, episodes, counters)
            counters.add("env_steps", len(ready) * loop.T)  # before the put, as a3c.actors.local counts
            before_put = time.perf_counter()
            if fragments.put_many(ready) < len(ready):  # waits while the learners are behind
                return  # closed while waiting: the trainer is stopping
            done_at = time.perf_counter()
            counters.add("queue_puts", len(ready))
            counters.add("actor_env_s", unroll.env_s)
            counters.add("actor_policy_s", before_put - start - unroll.env_s)  # inference, bookkeeping
            counters.add("actor_queue_s", done_at - before_put)
    except Closed:
        pass  # the trainer is stopping
    finally:
        for game in games:
            game.close()
