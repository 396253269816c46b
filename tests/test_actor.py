"""The actor: the alignment of obs, action, reward and episode ends in a fragment, against
a deterministic environment whose observation encodes the step counter."""
import collections
import queue
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c.actors.local import SyncGate, run_actor, sync_rounds
from a3c.actors.loop import EPISODE_DTYPE, fragment_dtype
from a3c.config import load_config
from a3c.models import ActorCritic
from a3c.trainer import COUNTERS, TIMERS
from replay import ArrayQueue, Counters

ENV_ID = "A3CTestCounter-v0"
TERMINAL_STEP = 3  # odd episodes terminate after this many steps
TIME_LIMIT = 4     # even episodes are truncated by the time limit
E, T = 2, 5


class CounterEnv(gym.Env):
    """Observation [episode, step]: the reset count and the steps taken in the episode.
    The reward equals the action. Odd episodes terminate after TERMINAL_STEP steps; even
    ones run until the time limit (TIME_LIMIT) truncates them."""

    observation_space = spaces.Box(0.0, 1e6, (2,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.episode, self.step_count = -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.step_count = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.step_count += 1
        terminated = self.episode % 2 == 1 and self.step_count == TERMINAL_STEP
        return self._obs(), float(action), terminated, False, {}

    def _obs(self):
        return np.array([self.episode, self.step_count], np.float32)


if ENV_ID not in gym.envs.registry:
    gym.register(ENV_ID, entry_point=CounterEnv, max_episode_steps=TIME_LIMIT)


class ActorRun:
    """One actor thread (run_actor, as in actors.mode=thread) feeding a queue the test reads."""

    def __init__(self, queue_capacity=16, version=7, sync=False, device="cpu"):
        torch.manual_seed(0)
        self.cfg = load_config({
            "env": {"id": ENV_ID},
            "actors": {"num": 1, "envs_per_actor": E, "unroll_length": T, "queue_capacity": queue_capacity,
                       "sync": sync, "device": device},
            "learners": {"batch_size": min(queue_capacity, 4), "minibatches": 1},
        })
        self.model = ActorCritic(CounterEnv.observation_space, CounterEnv.action_space)
        self.model.share_memory()
        self.fragments = ArrayQueue(queue_capacity,
                                    fragment_dtype(CounterEnv.observation_space, CounterEnv.action_space, T))
        self.episodes = ArrayQueue(256, EPISODE_DTYPE)
        self.counters = Counters(COUNTERS, TIMERS)
        self.counters.set("policy_version", version)
        self.rounds = sync_rounds(self.cfg, 0) if sync else None
        self.thread = threading.Thread(target=run_actor, args=(0, self.cfg, self.model, self.fragments,
                                                               self.episodes, self.counters, False),
                                       kwargs={"rounds": self.rounds})
        self.thread.start()

    def pop(self, n, timeout=20.0):
        out, deadline = [], time.monotonic() + timeout
        while len(out) < n:
            try:
                out.append(self.fragments.get(timeout=0.1))
            except queue.Empty:
                assert self.thread.is_alive(), "the actor stopped (see its exception above)"
                assert time.monotonic() < deadline, f"only {len(out)} of {n} fragments came"
        return np.array(out, self.fragments.dtype)

    def close(self):
        self.fragments.close()  # the actor's next put raises Closed, and it returns
        self.thread.join(20)
        alive = self.thread.is_alive()
        self.episodes.close()
        self.counters.close()
        if self.rounds is not None:
            self.rounds.close()
        assert not alive, "the actor did not stop when its queue closed"


@pytest.fixture
def actor_run():
    made = []
    yield lambda **kw: made.append(ActorRun(**kw)) or made[-1]
    for run in made:
        run.close()


def _value(model, obs):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(obs, np.float32))[None])[1].item()


def _logp(model, obs, action):
    with torch.no_grad():
        params, _ = model(torch.as_tensor(np.asarray(obs, np.float32))[None])
        return model.dist(params).log_prob(torch.tensor([action])).item()


def test_fragment_aligns_obs_action_reward_and_episode_ends(actor_run):
    run = actor_run()
    unrolls = 6
    frags = run.pop(E * unrolls)  # one put per unroll: env 0's fragment, then env 1's
    saw = collections.Counter()
    for k, frag in enumerate(frags):
        assert (frag["version"] == 7).all()
        for t in range(T):
            episode, step = frag["obs"][t]
            action = int(frag["action"][t])
            assert frag["reward"][t] == action  # the reward of the action taken at t
            assert frag["logp"][t] == pytest.approx(_logp(run.model, frag["obs"][t], action), abs=1e-5)
            terminated = episode % 2 == 1 and step + 1 == TERMINAL_STEP
            truncated = episode % 2 == 0 and step + 1 == TIME_LIMIT
            assert frag["terminated"][t] == terminated, (k, t)
            assert frag["truncated"][t] == truncated, (k, t)
            saw["terminated"] += terminated
            saw["truncated"] += truncated
            # The observation after step t: the next in the episode, or the next
            # episode's first once this one has ended.
            following = frag["obs"][t + 1] if t + 1 < T else frag["last_obs"]
            expected = [episode + 1, 0] if terminated or truncated else [episode, step + 1]
            np.testing.assert_array_equal(following, expected, err_msg=f"fragment {k}, step {t}")
            if truncated:  # the behaviour value of the final observation, which the fragment lacks
                final = [episode, TIME_LIMIT]
                assert frag["trunc_value"][t] == pytest.approx(_value(run.model, final), abs=1e-5)
                assert frag["trunc_value"][t] != 0
            else:
                assert frag["trunc_value"][t] == 0
        if k >= E:  # each environment's fragments continue where its previous one stopped
            np.testing.assert_array_equal(frag["obs"][0], frags[k - E]["last_obs"])
    assert saw["terminated"] > 0 and saw["truncated"] > 0
    # The first fragments start at the first step of an episode.
    assert all(frags[e]["obs"][0][1] == 0 for e in range(E))


def test_finished_episodes_report_the_return_and_length_of_the_fragments(actor_run):
    run = actor_run()
    frags = run.pop(E * 6)
    from_fragments = collections.Counter()
    for e in range(E):
        steps = np.concatenate([f["reward"] for f in frags[e::E]]), \
            np.concatenate([f["terminated"] | f["truncated"] for f in frags[e::E]])
        ret, length = 0.0, 0
        for reward, done in zip(*steps):
            ret, length = ret + reward, length + 1
            if done:
                from_fragments[(ret, length)] += 1
                ret, length = 0.0, 0
    reported = collections.Counter()
    while sum(reported.values()) < sum(from_fragments.values()):
        for ret, length, *_ in run.episodes.get_many(256, timeout=20).tolist():
            assert length in (TERMINAL_STEP, TIME_LIMIT)
            reported[(ret, length)] += 1
    assert from_fragments and not (from_fragments - reported)
    assert run.counters["episodes"] >= sum(from_fragments.values())
    assert run.counters["env_steps"] >= E * T * 5  # counted before each put


def test_fragment_version_is_the_policy_version_when_the_fragment_began(actor_run):
    """With room for one unroll in the queue the actor waits for the test, so a new
    version shows up within one unroll of being set."""
    run = actor_run(queue_capacity=E, version=7)
    first = run.pop(2 * E)
    run.counters.set("policy_version", 9)
    later = run.pop(4 * E)
    versions = [int(f["version"][0]) for f in np.concatenate([first, later])]
    for f in np.concatenate([first, later]):
        assert (f["version"] == f["version"][0]).all()  # one version per fragment
    assert versions[:2 * E] == [7] * (2 * E)
    assert versions == sorted(versions)
    assert versions[-2 * E:] == [9] * (2 * E)


def test_a_synchronous_actor_acts_one_batch_per_fresh_batch_trained_and_waits_between(actor_run):
    """With a batch of 2 unrolls (4 fragments) the actor acts 2 unrolls, then nothing
    until a learner counts a fresh batch; the next batch is acted by the version of that
    moment. Closing the queue while it waits stops it (the fixture checks)."""
    run = actor_run(queue_capacity=16, version=7, sync=True)
    B = run.cfg.learners.batch_size
    first = run.pop(B)
    time.sleep(0.5)
    assert run.fragments.qsize() == 0  # waiting for an update, not acting
    run.counters.set("policy_version", 9)
    run.counters.add("fresh_batches")
    second = run.pop(B)
    time.sleep(0.5)
    assert run.fragments.qsize() == 0
    assert (first["version"] == 7).all() and (second["version"] == 9).all()
    assert run.counters["actor_sync_s"] > 0.25  # the wait counts as waiting for an update


def test_an_actor_that_replaces_one_dead_mid_round_acts_just_the_unrolls_left():
    """Rounds of 2 unrolls: the first actor put 1 and died; its replacement (a new gate
    on the same shared counts) acts 1, then waits for the batch's update."""
    cfg = load_config({"actors": {"num": 2, "envs_per_actor": 4, "sync": True},
                       "learners": {"batch_size": 16}})
    counters = Counters(COUNTERS, TIMERS)
    rounds = sync_rounds(cfg, counters["fresh_batches"])
    fragments = ArrayQueue(16, np.dtype([("x", "f4")]))
    try:
        first = SyncGate(cfg, counters, rounds, 1, fragments)
        first.wait()
        first.put()
        replacement = SyncGate(cfg, counters, rounds, 1, fragments)
        replacement.wait()  # the unroll its predecessor left
        replacement.put()
        waiting = threading.Thread(target=replacement.wait)
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive()  # the round is done: it waits for the update
        counters.add("fresh_batches")
        waiting.join(5)
        assert not waiting.is_alive()
        assert rounds["actor_1"] == 2 and rounds["actor_0"] == 0
    finally:
        fragments.close()
        rounds.close()
        counters.close()


SYNC_RUN = {"actors": {"num": 2, "envs_per_actor": 2, "unroll_length": 5, "queue_capacity": 16, "sync": True},
            "learners": {"batch_size": 8, "epochs": 2, "minibatches": 2}, "total_timesteps": 4_000,
            "logging": {"progress": False, "interval_s": 0.2}, "checkpoint": {"interval_s": 0}}


def assert_on_policy(cfg, counts, sink, runs=1):
    """Every gradient step's data was acted at most one batch's steps ago (epochs x
    minibatches - 1 versions; lag 0 at a batch's first step), and the actors never
    acted more than a batch ahead of the learner (a batch left untrained per run)."""
    steps_per_batch = cfg.learners.batch_size * cfg.actors.unroll_length
    assert counts["env_steps"] >= cfg.total_timesteps
    assert 0 <= counts["env_steps"] - counts["fresh_batches"] * steps_per_batch <= runs * steps_per_batch
    lag_max = [value for _, value in sink.scalars["policy_lag/max"]]
    assert lag_max and max(lag_max) <= cfg.learners.epochs * cfg.learners.minibatches - 1


def test_synchronous_actors_act_each_batch_with_the_policy_its_update_starts_from(tmp_path):
    """Actor processes and a learner thread (assert_on_policy says what is checked)."""
    from a3c.metrics import MemorySink
    from a3c.trainer import Trainer

    cfg = load_config({**SYNC_RUN, "logging": {**SYNC_RUN["logging"], "run_root": str(tmp_path)}})
    sink = MemorySink()
    counts = Trainer(cfg, tmp_path / "run", sink=sink).train()
    assert_on_policy(cfg, counts, sink)
    assert counts["actor_restarts"] == 0


def test_resumed_synchronous_actors_count_their_rounds_from_the_batches_trained_before(tmp_path):
    """A second learn() carries the counters on: its actors act one round and wait for
    the update, as in the first, rather than catching up on the rounds trained before."""
    from a3c.api import A3C
    from a3c.metrics import MemorySink

    agent = A3C({**SYNC_RUN, "logging": {**SYNC_RUN["logging"], "run_root": str(tmp_path)}})
    agent.learn(2_000, sink=MemorySink())
    first = agent.counters
    sink = MemorySink()
    agent.learn(2_000, sink=sink)
    assert first["fresh_batches"] > 0
    assert_on_policy(agent.config, agent.counters, sink, runs=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device is visible")
def test_an_actor_acting_on_cuda_writes_what_the_cpu_policy_would_have_written(actor_run):
    """actors.device cuda: the policy acts on the GPU with the shared weights; each step's
    log-probability is the CPU policy's for the action taken, to float tolerance."""
    run = actor_run(device="cuda")
    for frag in run.pop(4):
        for t in range(T):
            assert frag["logp"][t] == pytest.approx(_logp(run.model, frag["obs"][t], frag["action"][t]), abs=1e-4)
