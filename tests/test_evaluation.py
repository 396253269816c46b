"""Evaluation while training (the eval section, a3c.evaluator): the evaluator plays the
newest weights, charts eval/*, keeps the best weights in best.pt (also over a resume),
can stop a run on target_return, and leaves no process or thread behind."""
import itertools
import multiprocessing
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

import a3c.evaluator
import a3c.trainer
from a3c import A3C
from a3c.api import evaluate
from a3c.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from a3c.config import ConfigError, load_config
from a3c.envs import EnvError
from a3c.evaluator import BEST_KEY, Evaluation, Evaluator, best_checkpoint, eval_while_training
from a3c.metrics import MemorySink
from conftest import running
from replay import Counters

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole.yaml"
SMALL = dict(actors__mode="thread", actors__num=1, actors__envs_per_actor=8, actors__unroll_length=8,
             learners__batch_size=16, learners__minibatches=2, actors__queue_capacity=32, logging__progress=False,
             logging__interval_s=0.5, checkpoint__interval_s=0)


class ShowAction(gym.Env):
    """One step per episode, whose reward is the action taken: a return shows what the
    policy did."""

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), float(action), True, False, {}


class PaysOnLowSeeds(gym.Env):
    """One step per episode, paying 10 in an episode reset with a seed below 1000 (those
    evaluations play), else 0 (the actors' episodes: their seeds are from 10 000 up, then
    none)."""

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.pay = 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pay = 10.0 if seed is not None and seed < 1000 else 0.0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), self.pay, True, False, {}


def prefer(model, action: int) -> None:
    """Make `action` the policy's greedy choice, whatever the observation."""
    with torch.no_grad():
        model.policy_head.weight.zero_()
        model.policy_head.bias.copy_(torch.tensor([1.0, 0.0] if action == 0 else [0.0, 1.0]))


def test_each_evaluation_plays_the_newest_weights_and_best_pt_keeps_the_best(tmp_path):
    agent = A3C({"env": {"id": "ShowAction"}, "eval": {"episodes": 3}}, env=ShowAction)
    evaluation = Evaluation(agent.config, agent.model, tmp_path, env_factory=ShowAction)
    try:
        prefer(agent.model, 0)
        assert evaluation.once({"env_steps": 100}) == (100, 0.0, 0.0, 1.0)  # step, mean, std, length
        prefer(agent.model, 1)  # the shared model changes between evaluations
        assert evaluation.once({"env_steps": 200}) == (200, 1.0, 0.0, 1.0)
        prefer(agent.model, 0)
        assert evaluation.once({"env_steps": 300}) == (300, 0.0, 0.0, 1.0)
    finally:
        evaluation.close()
    best = load_checkpoint(best_checkpoint(tmp_path))
    assert best["counters"] == {"env_steps": 200, BEST_KEY: 1.0}  # the second, not the later worse one
    assert best["model"]["policy_head.bias"].tolist() == [0.0, 1.0]


def test_an_evaluation_stops_mid_episode_when_the_run_stops(tmp_path):
    agent = A3C("cartpole", eval__episodes=5)
    evaluation = Evaluation(agent.config, agent.model, tmp_path)
    steps = []
    try:
        assert evaluation.once({"env_steps": 0}, stop=lambda: steps.append(1) or len(steps) > 3) is None
    finally:
        evaluation.close()
    assert len(steps) == 4 and not best_checkpoint(tmp_path).exists()


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A short CartPole run evaluated every 1000 env steps, its charts in a MemorySink."""
    sink = MemorySink()
    agent = A3C(CONFIG, logging__run_root=str(tmp_path_factory.mktemp("runs")), eval__interval_steps=1000,
                eval__episodes=3, **SMALL)
    agent.learn(4000, sink=sink)
    return agent, sink


def test_evaluations_are_charted_against_env_steps_and_the_last_at_the_end(evaluated_run):
    agent, sink = evaluated_run
    means = sink.scalars["eval/mean_return"]
    assert [step for step, _ in sink.scalars["eval/std_return"]] == [step for step, _ in means]
    assert [step for step, _ in sink.scalars["eval/mean_length"]] == [step for step, _ in means]
    assert len(means) >= 2 and all(a <= b for (a, _), (b, _) in itertools.pairwise(means))
    assert means[0][0] >= 1000
    assert means[-1][0] == agent.num_timesteps  # the final weights, once the learner stopped
    # CartPole pays 1 a step: the mean length is the mean return.
    assert [m for _, m in sink.scalars["eval/mean_length"]] == pytest.approx([m for _, m in means])


def test_best_pt_holds_the_weights_of_the_best_charted_evaluation(evaluated_run):
    agent, sink = evaluated_run
    means = sink.scalars["eval/mean_return"]
    best_step, best = max(means, key=lambda point: point[1])  # the first of equals, as best.pt keeps it
    state = load_checkpoint(best_checkpoint(agent.run_dir))
    assert state["counters"][BEST_KEY] == best and state["counters"]["env_steps"] == best_step
    loaded = A3C.load(agent.run_dir, best=True)
    replayed = evaluate(loaded.model, loaded.config, 3, seed=0)  # the evaluations' episodes
    assert replayed.mean() == best


def test_loading_the_best_of_a_run_that_never_evaluated_names_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="eval.interval_steps"):
        A3C.load(tmp_path, best=True)


def test_a_resumed_run_keeps_a_better_best_pt(tmp_path):
    agent = A3C(CONFIG, logging__run_root=str(tmp_path), eval__interval_steps=500, eval__episodes=2,
                total_timesteps=1500, **SMALL)
    agent.learn(sink=MemorySink())
    path = best_checkpoint(agent.run_dir)
    kept = load_checkpoint(path)
    save_checkpoint(path, kept["model"], {}, kept["config"], {**kept["counters"], BEST_KEY: 1e6})
    sink = MemorySink()
    A3C.resume(agent.run_dir, ["total_timesteps=3000"]).learn(sink=sink)
    assert len(sink.scalars["eval/mean_return"]) >= 2  # evaluated, and none was better
    after = load_checkpoint(path)
    assert after["counters"][BEST_KEY] == 1e6
    assert all(torch.equal(after["model"][k], kept["model"][k]) for k in kept["model"])


def test_target_return_judged_by_the_evaluations_stops_the_run(tmp_path):
    """The training episodes pay 0, the evaluations' 10: only the evaluations can stop it."""
    sink = MemorySink()
    agent = A3C({"env": {"id": "PaysOnLowSeeds"}, "target_return": 5.0,
                 "eval": {"interval_steps": 500, "episodes": 2, "judges_target": True}},
                env=PaysOnLowSeeds, logging__run_root=str(tmp_path), **SMALL)
    agent.learn(1_000_000, sink=sink)
    assert agent.num_timesteps < 200_000
    assert sink.scalars["eval/mean_return"][0][1] == 10.0
    assert max(ret for _, ret in sink.scalars["charts/episodic_return"]) == 0.0


class ChartFails(MemorySink):
    """A sink that raises `error` when the first evaluation is charted: as a crash of the
    trainer, or a Ctrl-C reaching it, at that moment."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def scalar(self, tag, value, step):
        if tag.startswith("eval/"):
            raise self.error
        super().scalar(tag, value, step)


@pytest.mark.parametrize("error", [RuntimeError("crash"), KeyboardInterrupt()])
def test_no_process_or_thread_outlives_a_run_that_ends_or_fails(tmp_path, monkeypatch, error):
    made = []

    def kept(*args):
        made.append(eval_while_training(*args))
        return made[-1]

    monkeypatch.setattr(a3c.trainer, "eval_while_training", kept)
    agent = A3C(CONFIG, logging__run_root=str(tmp_path), eval__interval_steps=300, eval__episodes=1, **SMALL)
    agent.learn(1000, sink=MemorySink())
    with pytest.raises(type(error)):
        agent.learn(100_000, sink=ChartFails(error))
    assert len(made) == 2
    assert not any(running(evaluator.process.pid) for evaluator in made)
    assert threading.enumerate() == [threading.main_thread()]


def test_a_factory_the_evaluator_cannot_receive_is_named_before_anything_starts(monkeypatch):
    """Where the trainer runs other threads, the evaluator comes from the fork server."""
    monkeypatch.setattr(a3c.evaluator, "worker_context", lambda: multiprocessing.get_context("forkserver"))
    counters = Counters(["env_steps"])
    try:
        with pytest.raises(EnvError, match="<lambda>.*module level"):
            Evaluator(Evaluation, (), counters, 100, 1000, env_factory=lambda: ShowAction())
    finally:
        counters.close()


def test_eval_settings_that_contradict_each_other_are_config_errors():
    with pytest.raises(ConfigError) as caught:
        load_config("cartpole", {"eval.judges_target": True})
    assert [p.split(":")[0] for p in caught.value.problems] == ["eval.judges_target"] * 2
    assert "eval.interval_steps is 0" in caught.value.problems[0]
    assert "target_return is null" in caught.value.problems[1]
    load_config("cartpole", {"eval.judges_target": True, "eval.interval_steps": 1000, "target_return": 475})


def test_a_run_with_the_default_eval_section_plays_no_evaluation(tmp_path):
    sink = MemorySink()
    agent = A3C(CONFIG, logging__run_root=str(tmp_path), **SMALL)
    agent.learn(500, sink=sink)
    assert agent.config.eval.interval_steps == 0
    assert not any(tag.startswith("eval/") for tag in sink.scalars)
    assert not best_checkpoint(agent.run_dir).exists()
