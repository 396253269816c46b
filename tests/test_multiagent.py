"""Games of several agents (env.multiagent, a3c.envs.multiagent and a3c.actors.agents):
each agent's steps land in fragments of their own, once each, with their own rewards and
ends, in Parallel games whose agents leave at different steps and in turn-based (AEC)
ones; a run charts each seat's returns; agents whose spaces differ, and a game named
where a gymnasium environment is expected (or the reverse), are refused in one line."""
import gymnasium as gym
import numpy as np
import pytest
import torch

pettingzoo = pytest.importorskip("pettingzoo", reason="pettingzoo is not installed (pip install -e '.[multiagent]')")

from pettingzoo import ParallelEnv  # noqa: E402

from a3c import A3C, ConfigError, load_config  # noqa: E402
from a3c.actors.agents import AgentLoop  # noqa: E402
from a3c.actors.loop import fragment_dtype  # noqa: E402
from a3c.envs import EnvError  # noqa: E402
from a3c.envs.multiagent import Game, make_game  # noqa: E402
from a3c.metrics import MemorySink  # noqa: E402
from a3c.models import build_model  # noqa: E402
from a3c.selfplay import Pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")

TICTACTOE = "pettingzoo.classic.tictactoe.tictactoe:env"


class Leaving(ParallelEnv):
    """Three agents that leave at different steps: agent 0 is terminated after its 2nd
    step, agent 1 after its 3rd, agent 2 truncated after its 5th, which ends the game.
    Each observation says who sees it, where: (agent, episode, step, game); the reward
    of each step is unique to it. Written as users write a Parallel environment."""

    metadata = {"name": "leaving_v0"}
    LIVES = (2, 3, 5)
    games = 0  # instances made, to tell games apart

    def __init__(self):
        self.possible_agents = ["a0", "a1", "a2"]
        self.game, self.episode = Leaving.games, -1
        Leaving.games += 1

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1e6, (4,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        self.episode += 1
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        rewards = {a: reward(self.possible_agents.index(a), self.episode, self.t) for a in self.agents}
        self.t += 1
        ends = {a: self.t == self.LIVES[self.possible_agents.index(a)] for a in self.agents}
        terminated = {a: ends[a] and a != "a2" for a in self.agents}
        truncated = {a: ends[a] and a == "a2" for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        self.agents = [a for a in self.agents if not ends[a]]
        return obs, rewards, terminated, truncated, {a: {} for a in obs}

    def _obs(self, agent):
        return np.array([self.possible_agents.index(agent), self.episode, self.t, self.game], np.float32)


def reward(agent: int, episode: int, t: int) -> float:
    return 1000.0 * episode + 10.0 * agent + t


class Mismatched(Leaving):
    """Agent a1 sees one more number than the others."""

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1e6, (5 if agent == "a1" else 4,), np.float32)


@pytest.fixture(autouse=True)
def one_thread():
    """Torch on one thread, as actors run it: small forward passes on many threads crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loop_of(cfg, games, T):
    """An AgentLoop of `games` with a fresh model of the config's, and the model."""
    spaces = games[0].observation_space, games[0].action_space
    model = build_model(*spaces, cfg.model)
    return AgentLoop(games, model, T, 0, fragment_dtype(*spaces, T, getattr(model, "state_size", 0))), model


def unrolled(loop, n: int, version: int):
    """The fragments and finished episodes of `n` unrolls of `loop`, each concatenated."""
    fragments, episodes = [], []
    for _ in range(n):
        ready, unroll = loop.unroll(version=version)
        fragments.append(ready)
        episodes.append(unroll.episodes)
    return np.concatenate(fragments), np.concatenate(episodes)


def test_every_agent_step_lands_once_in_its_own_stream_with_its_own_reward_and_end():
    cfg = load_config({"env": {"multiagent": True, "entry_point": "x:y"}})
    T, G = 4, 2
    games = [Game(Leaving()) for _ in range(G)]
    first_game = games[0].env.game
    loop, _ = loop_of(cfg, games, T)
    fragments, episodes = unrolled(loop, 12, version=3)
    streams: dict[tuple[int, int], list] = {}  # (game, agent) -> its steps in the order they came
    for fragment in fragments:
        obs = fragment["obs"]
        who = {(int(o[3]), int(o[0])) for o in obs}
        assert len(who) == 1, f"a fragment mixes agents: {who}"
        streams.setdefault(who.pop(), []).extend(
            zip(obs.tolist(), fragment["reward"], fragment["terminated"], fragment["truncated"]))
        agent, episode, t, game = fragment["obs"][-1]
        assert fragment["last_obs"].tolist() == [agent, episode, t + 1, game]  # the next (or final) observation
        assert (fragment["version"] == 3).all()
    assert sorted(streams) == [(first_game + g, i) for g in range(G) for i in range(3)]
    for (game, agent), steps in streams.items():
        life = Leaving.LIVES[agent]
        # Every step of the agent's episodes, in order, each once: none missed, none twice.
        assert [tuple(obs) for obs, *_ in steps] == \
            [(agent, e, t, game) for e in range(len(steps)) for t in range(life)][:len(steps)]
        for (_, episode, t, _), r, terminated, truncated in steps:
            assert r == reward(agent, int(episode), int(t))
            assert terminated == (t + 1 == life and agent != 2)
            assert truncated == (t + 1 == life and agent == 2)
    # One episode per agent and game episode, with the agent's own return and length.
    for seat, life in enumerate(Leaving.LIVES):
        mine = episodes[episodes["seat"] == seat]
        assert len(mine) >= G * 2
        assert set(mine["length"]) == {life}
        assert set(mine["ret"]) <= {sum(reward(seat, e, t) for t in range(life)) for e in range(20)}


def test_a_turn_based_game_acts_only_valid_moves_and_rewards_both_seats_at_its_end():
    pytest.importorskip("pygame", reason="tictactoe_v3 imports pygame")
    cfg = load_config("tictactoe")
    games = [make_game(cfg.env) for _ in range(3)]
    assert games[0].agents == ["player_1", "player_2"] and not games[0].parallel
    loop, _ = loop_of(cfg, games, T=8)
    fragments, episodes = unrolled(loop, 20, version=0)
    assert len(fragments) > 10
    masks, actions = fragments["obs"]["action_mask"], fragments["action"]
    assert (np.take_along_axis(masks, actions[..., None], -1) == 1).all()  # every move was valid
    rewarded = fragments["reward"] != 0
    assert (fragments["terminated"][rewarded]).all() and set(np.unique(fragments["reward"])) <= {-1, 0, 1}
    assert not fragments["truncated"].any()
    # Both seats play every game: as many episodes each, and zero-sum returns.
    first, second = episodes[episodes["seat"] == 0], episodes[episodes["seat"] == 1]
    assert abs(len(first) - len(second)) <= len(games)
    assert abs(first["ret"].sum() + second["ret"].sum()) <= len(games)


def test_seats_played_by_a_past_version_make_no_fragments_or_episodes():
    pytest.importorskip("pygame", reason="tictactoe_v3 imports pygame")
    cfg = load_config("tictactoe")
    resets = []

    class Counted(Game):
        def reset(self, seed=None):
            resets.append(1)
            return super().reset(seed)

    games = [Counted(make_game(cfg.env).env) for _ in range(2)]
    loop, model = loop_of(cfg, games, T=4)
    pool = Pool(model, size=2, interval=1, prob=1.0)  # every game: the policy in one seat only
    pool.update(1)
    loop.pool = pool
    recorded, episodes = 0, []
    for _ in range(25):
        ready, unroll = loop.unroll(version=1)
        recorded += ready.size * 4
        episodes.append(unroll.episodes)
    episodes = np.concatenate(episodes)
    finished = len(resets) - len(games)  # games that ended; the pool played in all but the first ones
    assert finished >= 10
    assert len(episodes) == finished + len(games)  # one episode per game, two in the first ones
    # The steps in fragments (whole ones, and those of the ones filling) are the policy's
    # steps, those of its episodes, ended or not, less the ones awaiting their reward.
    acted = episodes["length"].sum() + loop._length.sum()
    assert recorded + loop._cursor.sum() == acted - loop._pending.sum()


def test_a_run_charts_each_seats_returns_and_leaves_nothing_behind(tmp_path):
    pytest.importorskip("pygame", reason="tictactoe_v3 imports pygame")
    sink = MemorySink()
    agent = A3C({"env": {"id": "tictactoe", "entry_point": TICTACTOE, "multiagent": True},
                 "model": {"cnn": False}, "actors": {"num": 1, "envs_per_actor": 4, "unroll_length": 4},
                 "learners": {"batch_size": 8, "minibatches": 2},
                 "selfplay": {"pool_size": 2, "snapshot_interval": 2, "eval_games": 20,
                              "eval_interval_steps": 500}},
                logging__run_root=str(tmp_path), logging__progress=False, checkpoint__interval_s=0)
    agent.learn(2_000, sink=sink)
    assert agent.num_timesteps >= 2_000
    for seat in ("player_1", "player_2"):
        assert sink.scalars[f"charts/return_{seat}"]
        assert {r for _, r in sink.scalars[f"charts/return_{seat}"]} <= {-1.0, 0.0, 1.0}
    rates = [sink.scalars[f"selfplay/{name}_rate"] for name in ("win", "draw", "loss")]
    assert rates[0]  # the final evaluation, at least
    for (step, win), (_, draw), (_, loss) in zip(*rates):
        assert win + draw + loss == pytest.approx(1.0)
    game = make_game(agent.config.env).env
    game.reset(seed=0)
    game.step(4)  # the centre: the second player's mask rules it out
    obs = game.last()[0]
    action, _ = agent.predict(obs)  # the observation as PettingZoo gives it, its mask in it
    assert obs["action_mask"][action] == 1


def test_agents_whose_spaces_differ_are_refused_in_one_line_naming_them(tmp_path):
    with pytest.raises(EnvError) as info:
        A3C({"env": {"multiagent": True}}, env=Mismatched, logging__run_root=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message
    assert "'a0'" in message and "'a1'" in message and "pad_observations_v0" in message


def test_a_game_where_a_gymnasium_environment_is_expected_and_the_reverse_say_which_to_set(tmp_path):
    with pytest.raises(EnvError, match="it is a PettingZoo environment: set env.multiagent: true"):
        A3C({"env": {"id": "leaving"}}, env=Leaving, logging__run_root=str(tmp_path))
    with pytest.raises(EnvError, match="set env.multiagent: false for a gymnasium environment"):
        A3C({"env": {"multiagent": True}}, env=lambda: gym.make("CartPole-v1"), actors__mode="thread",
            logging__run_root=str(tmp_path))


@pytest.mark.parametrize("overrides, fragment", [
    ({"actors.mode": "ray"}, "actors.mode: ray runs single-agent actors"),
    ({"actors.sync": True, "learners.batch_size": 16}, "actors.sync: true acts rounds"),
    ({"env.max_episode_steps": 9}, "env.max_episode_steps: 9 is a gymnasium time limit"),
    ({"eval.interval_steps": 1000}, "eval.interval_steps: 1000 evaluates episodes of a single-agent"),
    ({"env.entry_point": None}, "env.multiagent: true needs env.entry_point"),
])
def test_settings_a_game_of_several_agents_cannot_take_are_refused(overrides, fragment):
    base = {"env": {"id": "tictactoe", "entry_point": TICTACTOE, "multiagent": True}}
    with pytest.raises(ConfigError) as info:
        load_config(base, overrides)
    assert any(fragment in p for p in info.value.problems), info.value.problems


def test_selfplay_settings_without_a_game_of_several_agents_are_refused():
    with pytest.raises(ConfigError) as info:
        load_config({}, {"selfplay.pool_size": 4, "selfplay.eval_games": 10, "selfplay.eval_opponent": "oops"})
    problems = "\n".join(info.value.problems)
    assert "selfplay.pool_size: 4 is for games of several agents" in problems
    assert "selfplay.eval_games: 10 is for games of several agents" in problems
    assert "selfplay.eval_opponent: 'oops' is not allowed" in problems


def test_a_recurrent_policy_keeps_one_state_per_agent_and_starts_fragments_from_it():
    cfg = load_config({"env": {"multiagent": True, "entry_point": "x:y"}, "model": {"lstm": 8}})
    games = [Game(Leaving()) for _ in range(2)]
    loop, model = loop_of(cfg, games, T=3)
    assert model.is_recurrent
    fragments = np.concatenate([loop.unroll(0)[0] for _ in range(8)])
    assert len(fragments) and fragments["state"].shape[1] == model.state_size
    # A fragment that begins an episode starts from the zero state; the others from the
    # state its agent's stream carried.
    begins = fragments["obs"][:, 0, 2] == 0
    assert (fragments["state"][begins] == 0).all()
    assert (np.abs(fragments["state"][~begins]).sum(-1) > 0).all()
