"""Self-play: past versions of the policy as opponents, and games against a fixed opponent.

    Pool         the past versions an actor keeps (selfplay.pool_size), one snapshot of its
                 policy every selfplay.snapshot_interval policy versions
    opponent     the fixed opponent: random (uniform over the valid actions), or a user's
                 module:function(obs, mask) -> action
    play_games   the greedy policy's games against an opponent, taking each seat in turn
    GameEvaluation  the evaluator's job (a3c.evaluator runs it in a process of its own):
                 selfplay.eval_games games every selfplay.eval_interval_steps env steps and
                 at the end, charted as selfplay/win_rate, draw_rate and loss_rate

A game counts as won, drawn or lost by the sign of the policy's return in it, as in
two-player zero-sum games (+1, 0, -1 in PettingZoo Classic).
"""
from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from replay import Counters

from .config import Config
from .envs.masks import random_action
from .envs.multiagent import Game, make_game, unmasked
from .envs.sources import load_object
from .envs.spaces import obs_to_torch, stack_obs
from .evaluator import Evaluator
from .metrics import Sink
from .models.weights import WeightCopy, clone_policy

__all__ = ["GameEvaluation", "Pool", "games_while_training", "opponent", "play_games"]

_TABLES = 64  # games an evaluation plays at once (one forward pass for all of them)


class Pool:
    """Past versions of `policy` (an actor's copy): a snapshot every `interval` policy
    versions, the `size` newest kept; `prob` is the share of games they play in."""

    def __init__(self, policy: torch.nn.Module, size: int, interval: int, prob: float):
        self.policy, self.interval, self.prob = policy, interval, prob
        self.models: deque[torch.nn.Module] = deque(maxlen=size)
        self._next = 0  # the first snapshot: the policy the actor starts with

    def update(self, version: int) -> None:
        """Snapshot the policy if `version` (the one it holds now) is due."""
        if version >= self._next:
            self.models.append(clone_policy(self.policy))
            self._next = version + self.interval


def opponent(spec: str, action_space: gym.Space, seed: int = 0) -> Callable[[Any, np.ndarray | None], Any]:
    """The fixed opponent `spec` names (selfplay.eval_opponent): `random`, uniform over the
    valid actions (all, without a mask), or a user's `module:function(obs, mask)`. Either
    returns its action as the policy does: a discrete action as its index from 0, the
    position of its entry in the mask."""
    if spec != "random":
        return load_object(spec)
    space = copy.deepcopy(action_space)
    space.seed(seed)
    start = getattr(space, "start", 0)  # a Discrete or MultiDiscrete space's first action
    return lambda obs, mask: np.asarray(random_action(space, mask)) - start


def play_games(model: torch.nn.Module, tables: list[Game], against: Callable, games: int, seed: int = 0,
               stop: Callable[[], bool] = lambda: False) -> np.ndarray | None:
    """The policy's return in each of `games` games against `against`, the greedy
    policy taking seat i % A in game i and `against` the others, played on `tables` at
    once; game i is reset with seed + i. None if `stop()` turns true first."""
    A = len(tables[0].agents)
    recurrent = getattr(model, "is_recurrent", False)
    space = tables[0].observation_space
    returns = np.zeros(games)
    game_of = [-1] * len(tables)  # the game each table plays (-1: none)
    turns: list[list] = [[] for _ in tables]
    state = model.initial_state(len(tables)) if recurrent else None
    starts = torch.ones(len(tables), dtype=torch.bool)
    started = 0

    def begin(i: int) -> None:
        nonlocal started
        game_of[i], started = started, started + 1
        turns[i] = tables[i].reset(seed=seed + game_of[i])
        starts[i] = True

    for i in range(min(games, len(tables))):
        begin(i)
    while any(g >= 0 for g in game_of):
        if stop():
            return None
        actions: list[dict] = [{} for _ in tables]
        mine: list[tuple[int, Any]] = []  # (table, observation) where the policy's turn it is
        for i, g in enumerate(game_of):
            if g < 0:
                continue
            seat = g % A
            for turn in turns[i]:
                if turn.agent == seat:
                    returns[g] += turn.reward
                if turn.terminated or turn.truncated:
                    continue
                if turn.agent == seat:
                    mine.append((i, turn.obs))
                else:
                    actions[i][turn.agent] = np.asarray(against(*unmasked(turn.obs)))
        if mine:
            rows = [i for i, _ in mine]
            obs = obs_to_torch(stack_obs([o for _, o in mine], space))
            if recurrent:
                action, _, _, state[rows] = model.act_recurrent(obs, state[rows], starts[rows], True)
                starts[rows] = False
            else:
                action, _, _ = model.act(obs, True)
            for i, a in zip(rows, action.numpy()):
                actions[i][game_of[i] % A] = a
        for i, g in enumerate(game_of):
            if g < 0:
                continue
            if tables[i].over:
                game_of[i] = -1
                if started < games:
                    begin(i)
            else:
                turns[i] = tables[i].step(actions[i])
    return returns


# ------------------------------------------------------------------------------ the evaluator
class GameEvaluation:
    """The evaluator's work for selfplay.eval_games (a job of a3c.evaluator.Evaluator, which
    runs it in a process of its own): games of its copy of the newest weights against
    selfplay.eval_opponent on tables of its own, charted as selfplay/win_rate, draw_rate
    and loss_rate."""

    DTYPE = np.dtype([("step", "i8"), ("wins", "i8"), ("draws", "i8"), ("losses", "i8")])

    def __init__(self, cfg: Config, shared: torch.nn.Module, env_factory: Callable | None = None):
        self.cfg = cfg
        self.policy = clone_policy(shared)
        self.copy_weights = WeightCopy(self.policy, shared)
        self.tables: list[Game] = []
        for _ in range(min(cfg.selfplay.eval_games, _TABLES)):
            self.tables.append(make_game(cfg.env, env_factory))
        self.against = opponent(cfg.selfplay.eval_opponent, self.tables[0].action_space, cfg.seed)

    def once(self, counts: dict, stop: Callable[[], bool] = lambda: False) -> tuple | None:
        """(step, wins, draws, losses) of the shared weights as they are now; None if
        `stop()` turned true before the games were over."""
        self.copy_weights()
        returns = play_games(self.policy, self.tables, self.against, self.cfg.selfplay.eval_games,
                             seed=self.cfg.seed * 1_000_003, stop=stop)
        if returns is None:
            return None
        return int(counts["env_steps"]), int((returns > 0).sum()), int((returns == 0).sum()), int((returns < 0).sum())

    @staticmethod
    def chart(sink: Sink, record: tuple) -> float:
        """Chart one evaluation; its mean return (wins less losses, per game)."""
        step, wins, draws, losses = record
        games = wins + draws + losses
        sink.scalar("selfplay/win_rate", wins / games, step)
        sink.scalar("selfplay/draw_rate", draws / games, step)
        sink.scalar("selfplay/loss_rate", losses / games, step)
        return (wins - losses) / games

    def close(self) -> None:
        for table in self.tables:
            table.close()


def games_while_training(cfg: Config, shared: torch.nn.Module, counters: Counters,
                         env_factory: Callable | None = None) -> Evaluator:
    """The evaluator of selfplay.eval_games, started."""
    return Evaluator(GameEvaluation, (cfg, shared, env_factory), counters, cfg.selfplay.eval_interval_steps,
                     cfg.total_timesteps, env_factory, name="a3c-selfplay-evaluator")
