"""Dict and Tuple observations, MultiDiscrete and MultiBinary actions end to end:
actor processes -> queue -> learner -> checkpoint -> predict, on tiny environments
defined in the tests (tests/space_envs.py)."""
import numpy as np
import pytest
from space_envs import CopyTheBits, MatchTheCue

from a3c import A3C
from a3c.metrics import MemorySink

TINY = dict(actors__num=1, actors__envs_per_actor=4, actors__unroll_length=8, learners__batch_size=4,
            learners__minibatches=2, learners__epochs=2, actors__queue_capacity=16,
            logging__progress=False, logging__interval_s=0.5, checkpoint__interval_s=0)


@pytest.mark.parametrize("make, steps, split", [(MatchTheCue, 6000, "fragments"), (CopyTheBits, 6000, "fragments"),
                                                (MatchTheCue, 6000, "steps")],
                         ids=["dict-obs-multidiscrete", "tuple-obs-multibinary",
                              "dict-obs-multidiscrete-minibatches-of-steps"])
def test_composite_observations_and_factorised_actions_train_checkpoint_and_predict(make, steps, split, tmp_path):
    env = make()
    agent = A3C({"env": {"id": make.__name__}}, env=make, logging__run_root=str(tmp_path),
                learners__minibatch_split=split, **TINY)
    agent.learn(steps, sink=MemorySink())
    assert agent.num_timesteps >= steps and agent.counters["updates"] > 0
    loaded = A3C.load(agent.run_dir, env=make)
    obs, _ = env.reset(seed=3)
    action, _ = loaded.predict(obs)
    assert env.action_space.contains(action.astype(env.action_space.dtype))
    expected, _ = agent.predict(obs)
    np.testing.assert_array_equal(action, expected)
    if make is MatchTheCue:  # learned: the uniform policy matches the cue 8/3 times an episode
        assert np.mean(agent.recent_returns) > 8 / 3 + 1, agent.recent_returns

def test_predict_takes_a_batch_of_dict_observations_as_a_vector_env_returns_them(tmp_path):
    import gymnasium as gym

    agent = A3C({"env": {"id": "MatchTheCue"}}, env=MatchTheCue, logging__run_root=str(tmp_path), **TINY)
    envs = gym.vector.SyncVectorEnv([MatchTheCue] * 3)
    obs, _ = envs.reset(seed=0)
    actions, _ = agent.predict(obs)
    assert actions.shape == (3, 2)
    envs.close()
