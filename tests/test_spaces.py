"""Every common space: Dict and Tuple observations stored field by field and modelled
leaf by leaf, MultiDiscrete and MultiBinary actions with factorised heads, CNN torsos
sized to the image, and one line for the spaces that stay unsupported."""
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Bernoulli, Categorical

from a3c.models import ActorCritic
from a3c.models.torsos import cnn_arch_for
from a3c.envs.spaces import (UnsupportedSpace, action_record, as_batch, leaves, obs_record, obs_to_torch, stack_obs, write_obs)

DICT = spaces.Dict({
    "image": spaces.Box(0, 255, (12, 12, 3), np.uint8),
    "direction": spaces.Discrete(4),
    "pose": spaces.Tuple((spaces.Box(-1, 1, (2,), np.float32), spaces.MultiBinary(3))),
})


def sample_batch(space, n, seed=0):
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def stacked(space, observations):
    """A batch of observations as a vector env returns it: leaf arrays stacked."""
    return stack_obs(observations, space)


def test_leaves_of_nested_dict_and_tuple_spaces_are_named_by_their_paths():
    assert [path for path, _ in leaves(DICT)] == ["direction", "image", "pose.0", "pose.1"]
    assert leaves(spaces.Discrete(3)) == [("", spaces.Discrete(3))]


def test_a_dict_observation_is_stored_field_by_field_and_read_back_leaf_by_leaf():
    dtype, shape = obs_record(DICT)
    assert shape == () and dtype.names == ("direction", "image", "pose.0", "pose.1")
    assert dtype["image"] == np.dtype((np.uint8, (12, 12, 3)))  # images stay compact
    records = np.zeros((5, 2), dtype)  # [B, T] of observations, as in a fragment's field
    batch = stacked(DICT, sample_batch(DICT, 5))
    write_obs(records[:, 1], batch)
    tensors = obs_to_torch(records[:, 1])
    for path, value in batch.items():
        assert tensors[path].dtype == torch.from_numpy(value).dtype
        np.testing.assert_array_equal(tensors[path].numpy(), value)


@pytest.mark.parametrize("space, expected", [
    (spaces.Discrete(5), (np.int64, ())),
    (spaces.MultiDiscrete([3, 2, 4]), (np.int64, (3,))),
    (spaces.MultiBinary(6), (np.int8, (6,))),
    (spaces.Box(-1, 1, (2,), np.float32), (np.float32, (2,))),
])
def test_each_action_space_has_a_record_dtype_and_shape(space, expected):
    assert action_record(space) == (np.dtype(expected[0]), expected[1])


@pytest.mark.parametrize("space", [spaces.Text(8), spaces.Sequence(spaces.Discrete(2)),
                                   spaces.Graph(spaces.Box(0, 1, (2,)), None)])
def test_spaces_of_no_fixed_size_are_refused_in_one_line_naming_the_space(space):
    with pytest.raises(UnsupportedSpace, match=type(space).__name__) as error:
        ActorCritic(spaces.Dict({"ok": spaces.Discrete(2), "bad": space}), spaces.Discrete(2))
    assert "\n" not in str(error.value) and "'bad'" in str(error.value)


def test_an_unsupported_action_space_is_refused_in_one_line():
    with pytest.raises(UnsupportedSpace, match="action space") as error:
        ActorCritic(spaces.Box(-1, 1, (2,)), spaces.Box(-1, 1, (2, 2)))
    assert "\n" not in str(error.value)


def test_a_dict_model_sends_each_image_through_a_cnn_and_the_rest_through_the_mlp():
    model = ActorCritic(DICT, spaces.Discrete(3), normalize_obs=True)
    assert model.uses_cnn and list(model.torso.cnns) == ["image"]
    assert list(model.obs_norm.paths) == ["pose.0"]  # the one vector Box leaf
    obs = obs_to_torch(stacked(DICT, sample_batch(DICT, 7)))
    params, value = model(obs)
    assert params.shape == (7, 3) and value.shape == (7,)
    # Changing a vector leaf changes the output: it reaches the torso.
    obs2 = dict(obs, direction=(obs["direction"] + 1) % 4)
    assert not torch.equal(model(obs2)[1], value)


def test_a_tuple_observation_is_modelled_like_a_dict_of_its_positions():
    space = spaces.Tuple((spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32)))
    model = ActorCritic(space, spaces.Discrete(2))
    obs = obs_to_torch(stacked(space, sample_batch(space, 4)))
    assert set(obs) == {"0", "1"}
    action, logp, value = model.act(obs)
    assert action.shape == (4,) and logp.shape == (4,) and value.shape == (4,)


def test_multidiscrete_log_probs_and_entropy_are_sums_of_per_component_categoricals():
    space = spaces.MultiDiscrete([3, 2, 4])
    model = ActorCritic(spaces.Box(-1, 1, (5,), np.float32), space)
    torch.nn.init.normal_(model.policy_head.weight)  # not the near-uniform initial policy
    obs = torch.randn(6, 5)
    action, logp, _ = model.act(obs)
    assert action.shape == (6, 3) and (action < torch.tensor([3, 2, 4])).all()
    eval_logp, entropy, _ = model.evaluate(obs, action)
    logits, _ = model(obs)
    parts = [Categorical(logits=c) for c in logits.split([3, 2, 4], -1)]
    torch.testing.assert_close(eval_logp, sum(p.log_prob(action[:, i]) for i, p in enumerate(parts)))
    torch.testing.assert_close(entropy, sum(p.entropy() for p in parts))
    torch.testing.assert_close(logp, eval_logp.detach())
    torch.testing.assert_close(model.dist(logits).log_prob(action), eval_logp)


def test_multibinary_log_probs_and_entropy_are_sums_of_per_component_bernoullis():
    model = ActorCritic(spaces.Box(-1, 1, (5,), np.float32), spaces.MultiBinary(4))
    torch.nn.init.normal_(model.policy_head.weight)
    obs = torch.randn(6, 5)
    action, logp, _ = model.act(obs)
    assert action.dtype == torch.int8 and action.shape == (6, 4)
    eval_logp, entropy, _ = model.evaluate(obs, action)
    logits, _ = model(obs)
    reference = Bernoulli(logits=logits)
    torch.testing.assert_close(eval_logp, reference.log_prob(action.float()).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    torch.testing.assert_close(logp, eval_logp.detach())
    deterministic, _, _ = model.act(obs, deterministic=True)
    torch.testing.assert_close(deterministic, (logits > 0).to(torch.int8))


def test_the_cnn_torso_is_sized_to_the_image():
    assert cnn_arch_for((4, 84, 84)) == "nature"
    assert cnn_arch_for((4, 10, 10)) == "small"
    minatar = spaces.Box(0, 1, (10, 10, 4), bool)  # MinAtar's grids, channels last
    model = ActorCritic(minatar, spaces.Discrete(3))
    assert model.uses_cnn and model.torso[0][0].in_channels == 4
    assert model.torso[0][0].kernel_size == (3, 3)
    obs = torch.from_numpy(np.stack([minatar.sample() for _ in range(5)]))
    params, value = model(obs)
    assert params.shape == (5, 3) and value.shape == (5,)
    nature = ActorCritic(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(3))
    assert nature.torso[0][0].kernel_size == (8, 8)
    forced = ActorCritic(spaces.Box(0, 255, (40, 40, 3), np.uint8), spaces.Discrete(3), cnn_arch="small")
    assert forced.torso[0][0].kernel_size == (3, 3)


@pytest.mark.parametrize("shape, chw", [((4, 84, 84), (4, 84, 84)), ((96, 96, 3), (3, 96, 96)),
                                        ((10, 10, 6), (6, 10, 10)), ((10, 10, 10), (10, 10, 10))])
def test_image_channels_are_found_first_or_last(shape, chw):
    model = ActorCritic(spaces.Box(0, 1, shape, np.float32), spaces.Discrete(2))
    assert model.torso[0][0].in_channels == chw[0]


def test_discrete_spaces_that_do_not_start_at_zero_are_shifted():
    model = ActorCritic(spaces.Discrete(3, start=-1), spaces.Discrete(2, start=5))
    params, _ = model(torch.tensor([-1, 0, 1]))
    assert params.shape == (3, 2)
    with pytest.raises(RuntimeError):  # -1 is index 0 of the one-hot; -2 is out of range
        model(torch.tensor([-2]))


def test_a_model_of_every_space_round_trips_through_its_state_dict():
    model = ActorCritic(DICT, spaces.MultiDiscrete([2, 3]), normalize_obs=True, normalize_value=True)
    copy = ActorCritic(DICT, spaces.MultiDiscrete([2, 3]), normalize_obs=True, normalize_value=True)
    copy.load_state_dict(model.state_dict())
    obs = obs_to_torch(stacked(DICT, sample_batch(DICT, 3)))
    torch.testing.assert_close(copy(obs), model(obs))


@pytest.mark.parametrize("space", [DICT, spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32)])
def test_predict_input_is_recognised_as_one_observation_or_a_batch(space):
    one = sample_batch(space, 1)[0]
    batch, single = as_batch(one, space)
    assert single and len(obs_to_torch(batch)["image"] if space is DICT else batch) == 1
    batch, single = as_batch(gym.vector.utils.batch_space(space, 3).sample(), space)
    assert not single
