"""Self-play (a3c.selfplay): games against a fixed opponent are counted as won, drawn or
lost for the seat the policy took; the pool of past versions grows at its interval and
keeps its newest; a user's opponent is looked up before a run starts. Learning (slow):
configs/tictactoe.yaml, trained by self-play, never loses to a uniformly random player in
1 000 games, taking either seat, and draws with a perfect (minimax) player in at least
95 % of its games."""
import functools

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo", reason="pettingzoo is not installed (pip install -e '.[multiagent]')")
pytest.importorskip("pygame", reason="tictactoe_v3 imports pygame (pip install -e '.[multiagent]')")

from a3c import A3C, load_config  # noqa: E402
from a3c.envs import EnvError  # noqa: E402
from a3c.envs.multiagent import make_game  # noqa: E402
from a3c.selfplay import Pool, opponent, play_games  # noqa: E402

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def won(cells: frozenset) -> bool:
    return any(all(c in cells for c in line) for line in LINES)


@functools.cache
def value(mine: frozenset, theirs: frozenset) -> int:
    """+1 if the player to move, who holds `mine`, wins with best play; 0 a draw; -1 a loss."""
    free = [c for c in range(9) if c not in mine | theirs]
    if not free:
        return 0
    return max(1 if won(mine | {c}) else -value(theirs, mine | {c}) for c in free)


_rng = np.random.default_rng(0)


def minimax(obs, mask):
    """A perfect tic-tac-toe player, written as a user writes an opponent: a function of
    PettingZoo's observation (3x3x2: the mover's marks, then the other's) and the mask.
    It picks at random among its best moves, so that its games differ."""
    cells = np.asarray(obs).reshape(9, 2)
    mine, theirs = (frozenset(np.flatnonzero(cells[:, k]).tolist()) for k in (0, 1))
    scores = {c: 1 if won(mine | {c}) else -value(theirs, mine | {c}) for c in np.flatnonzero(mask).tolist()}
    best = max(scores.values())
    return _rng.choice([c for c, score in scores.items() if score == best])


def first_valid(obs, mask):
    return int(np.flatnonzero(mask)[0])


class Playing(torch.nn.Module):
    """A `model` whose greedy action is a player function's, for play_games."""

    def __init__(self, player):
        super().__init__()
        self.player = player

    def act(self, obs, deterministic=False):
        actions = [self.player(o.numpy(), m.numpy()) for o, m in zip(obs["observation"], obs["action_mask"])]
        return torch.as_tensor(np.array(actions)), None, None


def tables(n: int):
    cfg = load_config("tictactoe")
    return [make_game(cfg.env) for _ in range(n)], cfg


def test_games_against_an_opponent_are_counted_for_the_seat_the_policy_takes():
    games, _ = tables(8)
    against = opponent("random", games[0].action_space, seed=1)
    perfect = play_games(Playing(minimax), games, against, 200, seed=0)
    assert len(perfect) == 200 and (perfect >= 0).all() and (perfect > 0).mean() > 0.7  # never loses
    naive = play_games(Playing(first_valid), games, minimax, 40, seed=0)
    assert (naive == -1).all()  # the perfect player beats it from either seat
    both = play_games(Playing(minimax), games, minimax, 40, seed=0)
    assert (both == 0).all()  # perfect play on both sides draws


def test_the_pool_snapshots_the_policy_at_its_interval_and_keeps_the_newest():
    policy = torch.nn.Linear(2, 1)
    pool = Pool(policy, size=2, interval=10, prob=0.5)
    seen = []
    for version in range(0, 45, 5):
        with torch.no_grad():
            policy.bias.fill_(version)
        pool.update(version)
        seen.append(len(pool.models))
    assert seen == [1, 1, 2, 2, 2, 2, 2, 2, 2]  # snapshots at versions 0, 10, 20, 30, 40
    assert [float(m.bias) for m in pool.models] == [30.0, 40.0]
    assert not any(p.requires_grad for m in pool.models for p in m.parameters())


def test_an_opponent_that_cannot_be_found_is_named_before_the_run_starts(tmp_path):
    agent = A3C("tictactoe", logging__run_root=str(tmp_path), logging__progress=False,
                selfplay__eval_opponent="test_selfplay:no_such_player")
    with pytest.raises(EnvError, match="selfplay.eval_opponent: .*has no attribute 'no_such_player'"):
        agent.learn(100)
    assert not list(tmp_path.iterdir())  # no run folder


@pytest.mark.slow
@pytest.mark.learning
def test_tictactoe_self_play_never_loses_to_random_and_draws_with_a_perfect_player(tmp_path):
    agent = A3C("tictactoe", logging__run_root=str(tmp_path), logging__progress=False,
                checkpoint__interval_s=0, selfplay__eval_games=0)
    agent.learn()
    games, _ = tables(64)
    random_player = opponent("random", games[0].action_space, seed=7)
    against_random = play_games(agent.model, games, random_player, 1000, seed=10_000)
    against_perfect = play_games(agent.model, games, minimax, 1000, seed=20_000)
    for seat in (0, 1):  # the policy takes seat i % 2 in game i
        print(f"\nseat {seat}: against random, losses {(against_random[seat::2] < 0).sum()} of 500; "
              f"against minimax, draws {(against_perfect[seat::2] == 0).mean():.1%}")
    assert (against_random >= 0).all()
    assert (against_perfect == 0).mean() >= 0.95
