"""The Python API: A3C(config, **overrides).learn / predict / save / load."""
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from a3c import A3C
from a3c.api import evaluate
from a3c.checkpoint import CheckpointError, config_here
from a3c.config import ConfigError
from a3c.metrics import MemorySink
from a3c.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole.yaml"
TINY = dict(actors__mode="thread", actors__num=1, actors__envs_per_actor=2, actors__unroll_length=5,
            learners__batch_size=4, learners__minibatches=1, actors__queue_capacity=16, logging__progress=False,
            logging__interval_s=0.5, checkpoint__interval_s=0)


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    agent = A3C(str(CONFIG), logging__run_root=str(root), **TINY)
    assert agent.learn(1000, sink=MemorySink()) is agent
    return agent


@pytest.fixture
def observations():
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    batch = [obs]
    for _ in range(7):
        obs, *_ = env.step(env.action_space.sample())
        batch.append(obs)
    env.close()
    return np.stack(batch)


def test_overrides_use_double_underscores_for_dots(tmp_path):
    agent = A3C({"env": {"id": "CartPole-v1"}}, actors__num=3, optim__lr=3e-4,
                logging__run_root=str(tmp_path))
    assert agent.config.actors.num == 3 and agent.config.optim.lr == 3e-4
    assert agent.config.logging.run_root == str(tmp_path)
    assert A3C(CONFIG, seed=5).config.seed == 5  # a path works as well as a dict


def test_learn_returns_self_and_writes_its_run_folder_under_run_root(agent):
    assert agent.num_timesteps >= 1000
    assert agent.run_dir.parent == Path(agent.config.logging.run_root)
    assert (agent.run_dir / "config.yaml").is_file() and (agent.run_dir / "checkpoint.pt").is_file()


def test_recent_returns_is_an_empty_list_before_learn_and_filled_after(agent):
    assert A3C(str(CONFIG), **TINY).recent_returns == []
    assert agent.recent_returns and all(isinstance(r, float) for r in agent.recent_returns)


def test_learn_again_continues_from_the_last_counters(tmp_path):
    agent = A3C(CONFIG, logging__run_root=str(tmp_path), **TINY)
    agent.learn(500, sink=MemorySink())
    first = agent.num_timesteps
    weights = {k: v.clone() for k, v in agent.model.state_dict().items()}
    sink = MemorySink()
    assert agent.learn(500, sink=sink) is agent
    assert agent.num_timesteps >= first + 500
    assert agent._state["counters"]["updates"] > 0
    assert any(not torch.equal(v, agent.model.state_dict()[k]) for k, v in weights.items())
    assert min(step for step, _ in sink.scalars["perf/sps"]) >= first  # steps continue, not restart
    assert sink.scalars["perf/start_step"] == [(first, first)]  # where the second learn() began


def test_predict_one_observation_and_a_batch(agent, observations):
    action, state = agent.predict(observations[0])
    assert state is None
    assert np.ndim(action) == 0 and int(action) in (0, 1)
    actions, _ = agent.predict(observations)
    assert actions.shape == (len(observations),) and set(actions.tolist()) <= {0, 1}
    assert actions[0] == action  # deterministic by default
    sampled, _ = agent.predict(observations, deterministic=False)
    assert sampled.shape == actions.shape


def test_save_and_load_give_identical_predictions(agent, observations, tmp_path):
    path = tmp_path / "agent.pt"
    agent.save(path)
    loaded = A3C.load(path)
    assert loaded.config == agent.config
    np.testing.assert_array_equal(loaded.predict(observations)[0], agent.predict(observations)[0])
    for name, tensor in agent.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor), name
    assert loaded.num_timesteps == agent.num_timesteps
    # A run folder loads from its checkpoint.pt too.
    from_run = A3C.load(agent.run_dir)
    np.testing.assert_array_equal(from_run.predict(observations)[0], agent.predict(observations)[0])


def test_a_loaded_agent_continues_learning_from_its_counters(agent, tmp_path):
    path = tmp_path / "agent.pt"
    agent.save(path)
    loaded = A3C.load(path)
    before = loaded.num_timesteps
    assert loaded.learn(500, run_dir=tmp_path / "more", sink=MemorySink()) is loaded
    assert loaded.num_timesteps >= before + 500
    assert (tmp_path / "more" / "checkpoint.pt").is_file()


def test_normalizer_statistics_are_saved_loaded_and_carried_on_by_a_resumed_run(agent, tmp_path):
    assert agent.model.obs_norm.count > 0 and agent.model.popart.debias > 0  # learned
    path = tmp_path / "agent.pt"
    agent.save(path)
    loaded = A3C.load(path)
    saved = dict(agent.model.named_buffers())
    for name, value in loaded.model.named_buffers():
        torch.testing.assert_close(value, saved[name], msg=f"buffer {name} not restored")
    count = float(loaded.model.obs_norm.count)
    loaded.learn(500, run_dir=tmp_path / "more", sink=MemorySink())
    assert loaded.model.obs_norm.count > count  # merged into, not restarted


def test_the_proximal_average_is_saved_and_a_resumed_run_goes_on_from_it(tmp_path):
    """configs/cartpole.yaml centres the clip on an average of the policy
    (learners.proximal_decay): the learners move the run's average, a checkpoint holds it
    (away from both the first weights and the last), and a run resumed from the
    checkpoint starts from it; one from a checkpoint written before averages were saved
    starts a fresh one from the model."""
    agent = A3C(str(CONFIG), logging__run_root=str(tmp_path), **TINY)
    first = {name: tensor.clone() for name, tensor in agent.model.state_dict().items()}
    agent.learn(1000, sink=MemorySink())
    path, again = tmp_path / "agent.pt", tmp_path / "again.pt"
    agent.save(path)
    A3C.load(path).save(again)  # loaded and saved again, the average comes along
    state = torch.load(path, weights_only=True)
    average, weights = state["proximal"], state["model"]
    assert average.keys() == weights.keys()
    for other in (first, weights):
        assert any(not torch.equal(average[name], other[name]) for name, _ in agent.model.named_parameters())
    for name, tensor in torch.load(again, weights_only=True)["proximal"].items():
        assert torch.equal(tensor, average[name]), name
    older = {key: value for key, value in state.items() if key != "proximal"}
    for saved, expected in ((state, average), (older, weights)):
        trainer = Trainer(agent.config, tmp_path / "resumed", state=saved)
        try:
            for name, tensor in trainer.average.state_dict().items():
                assert torch.equal(tensor, expected[name]), name
        finally:
            trainer.counters.close()


@pytest.mark.parametrize("average", [[1.0, 2.0], {"torso.0.weight": torch.zeros(3)}])
def test_a_checkpoint_whose_average_does_not_match_its_weights_is_refused_as_corrupt(agent, tmp_path, average):
    path = tmp_path / "agent.pt"
    agent.save(path)
    state = torch.load(path, weights_only=True)
    torch.save({**state, "proximal": average}, path)
    with pytest.raises(CheckpointError, match=r"agent\.pt: its proximal average .* does not match .*restore it"):
        A3C.load(path)


def test_predict_and_evaluate_see_observations_through_the_normalizer_without_updating_it(
        agent, observations):
    norm = agent.model.obs_norm
    seen, count = [], float(norm.count)
    hook = norm.register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    try:
        agent.predict(observations)
        evaluate(agent.model, agent.config, episodes=1)
    finally:
        hook.remove()
    assert seen[0] == len(observations) and len(seen) > 1
    assert float(norm.count) == count


def test_loading_a_file_that_is_not_a_checkpoint_raises_checkpoint_error(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint\n" * 20)
    with pytest.raises(CheckpointError, match=r"garbage\.pt is not a readable checkpoint .*corrupt"):
        A3C.load(garbage)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(CheckpointError, match=r"other\.pt is not an a3c checkpoint"):
        A3C.load(other)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        A3C.load(tmp_path / "missing.pt")


@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_a_checkpoint_trained_on_a_gpu_this_host_lacks_loads_and_trains_on_the_cpu(agent, tmp_path, device):
    if config_here({"learners": {"device": device}})["learners"]["device"] == device:
        pytest.skip(f"needs a host without {device}")
    path = tmp_path / "agent.pt"
    agent.save(path)
    state = torch.load(path, weights_only=True)
    state["config"]["learners"]["device"] = device
    torch.save(state, path)
    loaded = A3C.load(path)
    assert loaded.config.learners.device == "cpu"
    before = loaded.num_timesteps
    loaded.learn(200, run_dir=tmp_path / "more", sink=MemorySink())  # resumed: the checkpoint's config checked
    assert loaded.num_timesteps >= before + 200


def test_learn_for_no_steps_is_an_error_that_writes_nothing(agent, tmp_path):
    for steps in (0, -5):
        with pytest.raises(ValueError, match="at least 1 more env step"):
            agent.learn(steps, run_dir=tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_a_setting_the_model_cannot_take_is_an_error_when_the_agent_is_made(tmp_path):
    with pytest.raises(ConfigError, match="learners.bound_coef: 0.1 bounds a Gaussian policy's means"):
        A3C(str(CONFIG), logging__run_root=str(tmp_path), learners__bound_coef=0.1)


def test_a_value_rate_for_a_model_without_value_modules_is_an_error_when_the_agent_is_made(tmp_path):
    class Critic(torch.nn.Module):  # a user's model, its value head not named value_*
        def __init__(self):
            super().__init__()
            self.critic = torch.nn.Linear(4, 1)

    with pytest.raises(ConfigError, match="optim.value_lr is set, but the model has no parameters"):
        A3C(str(CONFIG), model=Critic(), logging__run_root=str(tmp_path), optim__value_lr=1e-2)


def test_a_checkpoint_from_before_a_config_field_existed_still_loads(agent, tmp_path):
    path = tmp_path / "agent.pt"
    agent.save(path)
    state = torch.load(path, weights_only=True)
    del state["config"]["env"]["max_episode_steps"]  # as written before the field existed
    torch.save(state, path)
    loaded = A3C.load(path)
    assert loaded.learn(200, run_dir=tmp_path / "more", sink=MemorySink()) is loaded


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    from a3c.api import new_run_dir

    config = A3C(str(CONFIG), logging__run_root=str(tmp_path)).config
    folders = {new_run_dir(config) for _ in range(3)}
    assert len(folders) == 3 and all(folder.is_dir() for folder in folders)


def test_predict_keeps_continuous_actions_within_the_action_bounds(tmp_path):
    agent = A3C(str(ROOT / "configs" / "pendulum.yaml"), logging__run_root=str(tmp_path))
    with torch.no_grad():
        agent.model.log_std.fill_(3.0)  # a wide policy: samples far outside [-2, 2]
    actions, _ = agent.predict(np.zeros((256, 3), np.float32), deterministic=False)
    assert actions.min() >= -2.0 and actions.max() <= 2.0



def test_run_files_are_written_with_the_umasks_mode_not_mkstemps(agent, tmp_path):
    agent.save(tmp_path / "saved.pt")
    mode = (tmp_path / "saved.pt").stat().st_mode & 0o777
    assert mode == 0o666 & ~umask_of_this_process(), oct(mode)
    assert (agent.run_dir / "config.yaml").stat().st_mode & 0o777 == mode


def umask_of_this_process() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
