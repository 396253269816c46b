"""Deterministic mode (`deterministic: true`): two runs of one config end with
bit-identical weights; and what it stands on: synchronous actors act no round past the
budget, and the run ends once the learner has trained the last one."""
import threading
import time

import numpy as np
import pytest
import torch

from a3c import A3C
from a3c.actors.local import SyncGate, sync_rounds
from a3c.config import ConfigError, load_config
from a3c.metrics import MemorySink
from a3c.trainer import COUNTERS, TIMERS
from replay import ArrayQueue, Closed, Counters

DETERMINISTIC = dict(deterministic=True, actors__num=1, actors__sync=True, logging__progress=False,
                     checkpoint__interval_s=0)


def trained_weights(tmp_path, actors_mode: str, seed: int = 1) -> tuple[dict, dict]:
    agent = A3C("cartpole", seed=seed, actors__mode=actors_mode, logging__run_root=str(tmp_path), **DETERMINISTIC)
    agent.learn(3000, sink=MemorySink())
    return agent.model.state_dict(), agent.counters


@pytest.mark.parametrize("actors_mode", ["thread", "process"])
def test_two_deterministic_runs_of_one_config_give_bit_identical_weights(tmp_path, actors_mode):
    first, counters = trained_weights(tmp_path, actors_mode)
    second, _ = trained_weights(tmp_path, actors_mode)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    cfg = load_config("cartpole")
    round_steps = cfg.learners.batch_size * cfg.actors.unroll_length
    assert counters["fresh_batches"] * round_steps == counters["env_steps"] >= 3000  # every round trained
    other, _ = trained_weights(tmp_path, actors_mode, seed=2)
    assert not all(torch.equal(first[name], other[name]) for name in first)  # the seed matters


def test_deterministic_mode_names_every_setting_it_needs_in_one_line():
    with pytest.raises(ConfigError) as caught:
        load_config("cartpole", {"deterministic": True, "learners.mode": "process", "target_return": 400})
    assert caught.value.problems == [(
        "deterministic: true needs actors.num 1 (not 2), actors.sync true (not false), learners.mode thread "
        "(not process), target_return null (not 400.0); set them, or deterministic to false")]
    load_config("cartpole", {"deterministic": True, "actors.num": 1, "actors.sync": True})


def test_a_synchronous_actor_starts_no_round_once_the_budget_is_spent():
    cfg = load_config({"actors": {"num": 1, "envs_per_actor": 4, "sync": True}, "learners": {"batch_size": 8},
                       "total_timesteps": 1000})
    counters = Counters(COUNTERS, TIMERS)
    rounds = sync_rounds(cfg, 0)
    fragments = ArrayQueue(8, np.dtype([("x", "f4")]))
    try:
        gate = SyncGate(cfg, counters, rounds, 0, fragments)
        gate.wait()
        gate.put()
        counters.add("env_steps", 1000)  # the round's second unroll ends past the budget
        gate.wait()
        gate.put()
        counters.add("fresh_batches")  # its batch trained: a round would start now
        ended = []

        def next_round():
            try:
                gate.wait()
            except Closed:
                ended.append("closed")

        waiting = threading.Thread(target=next_round)
        waiting.start()
        time.sleep(0.3)
        assert waiting.is_alive()
        fragments.close()  # the trainer stops
        waiting.join(5)
        assert ended == ["closed"]
    finally:
        fragments.close()
        rounds.close()
        counters.close()


def test_the_seed_draws_the_initial_weights_in_every_mode_and_leaves_the_callers_generator_alone():
    """Runs of several seeds (a3c train --seeds) start from different weights, the same
    seed from the same ones, deterministic or not; torch's generator, as the program set
    it, draws the same numbers afterwards as it would have without the model."""
    def weights(**settings):
        return torch.cat([p.detach().flatten() for p in A3C("cartpole", **settings).model.parameters()])

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = weights(seed=1)
    assert torch.equal(torch.rand(3), expected)
    assert torch.equal(weights(seed=1), first)
    assert torch.equal(weights(seed=1, deterministic=True, actors__num=1, actors__sync=True), first)
    assert not torch.equal(weights(seed=2), first)
