"""Action masks (a3c.envs.masks): read from a Dict observation, from info or from an
`action_masks()` method, carried in the fragments, applied by the actors and the
learner alike, and by predict, evaluate and the LSTM core."""
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical

from a3c import A3C, ConfigError
from a3c.actors.loop import ActorLoop, fragment_dtype
from a3c.config import load_config
from a3c.envs import EnvError, make_env, make_vector_env
from a3c.envs.masks import MASK_KEY, MaskError, flat_mask, masked_space
from a3c.envs.play import evaluate
from a3c.models import build_model

from mask_envs import ChooseBest, RandomMasks, RandomMasksByMethod

# (convention, factory): every convention, Discrete and MultiDiscrete, flat and per-component masks.
ROUTES = {
    "observation-discrete": ("auto", functools.partial(RandomMasks, "observation")),
    "observation-multidiscrete-per-component": (
        "auto", functools.partial(RandomMasks, "observation", nvec=[3, 4], per_component=True)),
    "info-discrete": ("info", functools.partial(RandomMasks, "info")),
    "info-multidiscrete-flat": ("info", functools.partial(RandomMasks, "info", nvec=[3, 4])),
    "method-discrete": ("auto", RandomMasksByMethod),
    "method-multidiscrete-per-component": ("auto", functools.partial(RandomMasksByMethod, nvec=[2, 5],
                                                                     per_component=True)),
}


def config(setting="auto", **overrides):
    return load_config({"env": {"id": "Masked", "action_mask": setting}, "logging": {"progress": False},
                        **overrides})


def model_for(cfg, factory):
    """A fresh (random) policy for the environment `factory` makes, and one such env."""
    env = make_env(cfg.env, env_factory=factory)
    return build_model(env.observation_space, env.action_space, cfg.model), env


def assert_one_line(message: str, fragment: str) -> None:
    assert "\n" not in message and fragment in message, message


def valid(actions: np.ndarray, masks: np.ndarray, space: gym.Space) -> np.ndarray:
    """Whether each action (indices from 0) is allowed by its flat mask."""
    if isinstance(space, gym.spaces.Discrete):
        return np.take_along_axis(masks, actions[..., None], -1)[..., 0].astype(bool)
    offsets = np.concatenate([[0], np.cumsum(space.nvec)[:-1]])
    return np.take_along_axis(masks, actions + offsets, -1).astype(bool).all(-1)


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_random_policy_samples_no_invalid_action_in_100k_steps(route):
    setting, factory = ROUTES[route]
    cfg = config(setting)
    model, env = model_for(cfg, factory)
    E, T, samples = 250, 20, 100_000
    envs = make_vector_env(cfg.env, E, factory)  # an invalid action would raise in the env
    try:
        loop = ActorLoop(envs, model, T, seed=1)
        out = np.zeros(E, fragment_dtype(env.observation_space, env.action_space, T))
        for _ in range(samples // (E * T)):
            loop.unroll(out, version=0)
            # ...and the fragment carries the mask each action was drawn under.
            assert valid(out["action"], out["obs"][MASK_KEY], env.action_space).all()
            assert 0 < out["obs"][MASK_KEY].mean() < 1
    finally:
        envs.close()


@pytest.mark.parametrize("nvec", [None, [3, 4]])
def test_masked_log_prob_and_entropy_equal_categorical_over_the_masked_logits(nvec):
    cfg = config()
    model, env = model_for(cfg, functools.partial(RandomMasks, "observation", nvec=nvec))
    rng = np.random.default_rng(0)
    n = 64
    obs = {"position": torch.from_numpy(rng.uniform(-1, 1, (n, 3)).astype(np.float32)),
           MASK_KEY: torch.from_numpy(np.stack([env.reset(seed=i)[0][MASK_KEY] for i in range(n)]))}
    with torch.no_grad():
        logits = model.policy_head(model.features(obs))
    sizes = [5] if nvec is None else nvec
    masks = obs[MASK_KEY].bool().split(sizes, -1)
    parts = [Categorical(logits=chunk.masked_fill(~mask, float("-inf")))
             for chunk, mask in zip(logits.split(sizes, -1), masks)]
    actions = torch.stack([part.sample() for part in parts], -1)
    actions = actions[:, 0] if nvec is None else actions
    logp, entropy, _ = model.evaluate(obs, actions)
    columns = [actions] if nvec is None else actions.unbind(-1)
    expected_logp = sum(part.log_prob(a) for part, a in zip(parts, columns))
    expected_entropy = sum(part.entropy() for part in parts)
    torch.testing.assert_close(logp, expected_logp)
    torch.testing.assert_close(entropy, expected_entropy)
    (logp.sum() + entropy.sum()).backward()  # masked logits give no NaN gradient
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_a_masked_fragment_survives_queue_learner_checkpoint_and_predict(tmp_path):
    agent = A3C(config(replay={"ratio": 0.5}), env=ChooseBest)  # replay: the buffer carries masks too
    agent.learn(4_000, run_dir=tmp_path / "run")
    loaded = A3C.load(tmp_path / "run", env=ChooseBest)
    env = ChooseBest()
    obs, _ = env.reset(seed=3)
    for _ in range(200):
        mask = env.action_masks()
        action, _ = loaded.predict(obs, action_masks=mask, deterministic=False)
        assert mask[action]
        expected, _ = agent.predict(obs, action_masks=mask)
        assert loaded.predict(obs, action_masks=mask)[0] == expected
        obs, *_ = env.step(action)


def test_predict_takes_a_mask_as_a_keyword_or_inside_the_observation():
    agent = A3C(config(), env=ChooseBest)
    obs = np.eye(4, dtype=np.float32)[[0, 1, 2, 3]]
    masks = np.zeros((4, 8), np.int8)
    masks[np.arange(4), [5, 1, 7, 2]] = 1  # one valid action each: predict must pick it
    for deterministic in (True, False):
        actions, _ = agent.predict(obs, action_masks=masks, deterministic=deterministic)
        np.testing.assert_array_equal(actions, [5, 1, 7, 2])
    inside, _ = agent.predict({"observation": obs, MASK_KEY: masks})
    np.testing.assert_array_equal(inside, [5, 1, 7, 2])
    assert agent.predict(obs[0], action_masks=masks[0])[0] == 5
    unmasked, _ = agent.predict(obs)  # no mask: every action valid
    assert unmasked.shape == (4,)


def test_a_mask_given_to_a_policy_without_masks_is_refused():
    agent = A3C("cartpole", logging__progress=False)
    with pytest.raises(ValueError, match="reads no action masks"):
        agent.predict(np.zeros(4, np.float32), action_masks=[1, 0])


def test_an_lstm_policy_acts_scores_and_predicts_under_masks(tmp_path):
    factory = functools.partial(RandomMasks, "observation", nvec=[3, 4], length=12)
    agent = A3C(config(model={"lstm": 16}, actors={"mode": "thread", "num": 1}), env=factory)
    agent.learn(2_000, run_dir=tmp_path / "run")  # the learner unrolls masked fragments
    env = factory()
    obs, _ = env.reset(seed=0)
    state, done = None, False
    while not done:  # RandomMasks raises on an invalid action
        action, state = agent.predict(obs, state=state, action_masks=obs[MASK_KEY], deterministic=False)
        obs, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    assert np.isfinite(evaluate(agent.model, agent.config, 3, env=factory)).all()


def test_a_cnn_policy_on_a_dict_observation_takes_a_mask():
    space = gym.spaces.Dict({"frame": gym.spaces.Box(0, 255, (12, 12, 3), np.uint8),
                             MASK_KEY: gym.spaces.MultiBinary(6)})
    model = build_model(space, gym.spaces.Discrete(6), config().model)
    assert model.uses_cnn and model.mask_key == MASK_KEY
    masks = (np.random.default_rng(0).random((500, 6)) < 0.3).astype(np.int8)
    masks[np.arange(500), np.arange(500) % 6] = 1
    obs = {"frame": torch.randint(0, 255, (500, 12, 12, 3), dtype=torch.uint8),
           MASK_KEY: torch.from_numpy(masks)}
    for deterministic in (True, False):
        actions, logp, _ = model.act(obs, deterministic)
        assert valid(actions.numpy(), masks, gym.spaces.Discrete(6)).all()
        assert torch.isfinite(logp).all()


def test_masks_let_a_task_that_needs_them_be_learned(tmp_path):
    agent = A3C(config(), env=ChooseBest).learn(60_000, run_dir=tmp_path / "run")
    assert np.mean(agent.recent_returns[-100:]) >= 18  # a random valid choice scores 6.7, the best 20
    # Without masks an invalid action ends the episode: the policy cannot tell which are valid.
    assert np.mean(evaluate(agent.model, agent.config, 20, env=ChooseBest)) >= 18


def test_evaluate_and_video_play_a_masked_policy(tmp_path):
    pytest.importorskip("av", reason='needs the video extra: pip install -e ".[video]"')
    from a3c.envs.video import record_video

    agent = A3C(config(), env=ChooseBest)
    returns = record_video(agent.model, agent.config, tmp_path / "masked.mp4", episodes=2, env=ChooseBest)
    assert len(returns) == 2 and (tmp_path / "masked.mp4").stat().st_size > 0
    np.testing.assert_array_equal(returns, evaluate(agent.model, agent.config, 2, env=ChooseBest))


class NoValidActionAtStep3(RandomMasksByMethod):
    def action_masks(self):
        return np.zeros(5, np.int8) if self.t == 3 else super().action_masks()


def test_a_state_without_a_valid_action_is_one_error_naming_its_step():
    env = make_env(config().env, env_factory=NoValidActionAtStep3)
    obs, _ = env.reset(seed=0)
    with pytest.raises(MaskError, match="step 3 of the episode: the action mask allows no action"):
        for _ in range(3):
            obs, *_ = env.step(int(np.flatnonzero(obs[MASK_KEY])[0]))


class WrongSize(RandomMasksByMethod):
    def action_masks(self):
        return np.ones(7, np.int8)


def test_a_mask_of_the_wrong_size_is_one_line_before_any_run_folder(tmp_path, capsys):
    with pytest.raises(EnvError) as error:
        A3C(config(logging={"run_root": str(tmp_path)}), env=WrongSize).learn(100)
    assert_one_line(str(error.value), "needs 5 entries")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("setting, factory, message", [
    ("auto", functools.partial(RandomMasks, "info"), "set env.action_mask: info"),
    ("method", functools.partial(RandomMasks, "observation"), "has no action_masks"),
    ("observation", RandomMasksByMethod, "has no 'action_mask' entry"),
])
def test_masks_not_where_the_config_says_are_one_line_before_any_run_folder(setting, factory, message, tmp_path):
    with pytest.raises((EnvError, ConfigError)) as error:
        A3C(config(setting, logging={"run_root": str(tmp_path)}), env=factory).learn(100)
    assert_one_line(str(error.value), message)
    assert not list(tmp_path.iterdir())


def test_action_mask_none_leaves_a_dict_entry_as_an_ordinary_input():
    cfg = config("none")
    env = make_env(cfg.env, env_factory=functools.partial(RandomMasks, "observation"))
    model = build_model(env.observation_space, env.action_space, cfg.model, action_mask=False)
    assert model.mask_key is None


def test_flat_mask_takes_flat_and_per_component_forms():
    space = gym.spaces.MultiDiscrete([2, 3])
    np.testing.assert_array_equal(flat_mask(([1, 0], [0, 1, 1]), space), [1, 0, 0, 1, 1])
    np.testing.assert_array_equal(flat_mask([True, False, False, True, True], space), [1, 0, 0, 1, 1])
    with pytest.raises(MaskError, match="needs 5 entries"):
        flat_mask([1, 1, 1], space)
    with pytest.raises(MaskError, match="Discrete or a 1-D MultiDiscrete"):
        masked_space(gym.spaces.Box(0, 1, (2,)), gym.spaces.Box(-1, 1, (2,)))
