"""Tests of the actor-critic networks in a3c.models."""

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c.models import ActorCritic

N = 5

CARTPOLE = (spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2))
PENDULUM = (spaces.Box(-8.0, 8.0, (3,), np.float32), spaces.Box(-2.0, 2.0, (1,), np.float32))
ATARI = (spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6))
CARRACING = (spaces.Box(0, 255, (96, 96, 3), np.uint8), spaces.Box(-1.0, 1.0, (3,), np.float32))
SPACES = pytest.mark.parametrize("obs_space, action_space", [CARTPOLE, PENDULUM, ATARI, CARRACING],
                                 ids=["cartpole", "pendulum", "atari", "carracing"])


def batch(space, n=N):
    """A batch of observations with the space's dtype, as the trainer passes them."""
    return torch.as_tensor(np.stack([space.sample() for _ in range(n)]))


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@SPACES
def test_forward_act_evaluate_shapes(obs_space, action_space):
    model = ActorCritic(obs_space, action_space)
    assert isinstance(model, ActorCritic)
    obs = batch(obs_space)
    discrete = isinstance(action_space, spaces.Discrete)
    n_params = action_space.n if discrete else action_space.shape[0]

    params, value = model(obs)
    assert params.shape == (N, n_params) and value.shape == (N,)

    action, log_prob, value = model.act(obs)
    assert action.shape == (N, *model.action_shape)
    assert action.numpy().dtype == model.action_dtype
    assert log_prob.shape == value.shape == (N,)

    log_prob, entropy, value = model.evaluate(obs, action)
    assert log_prob.shape == entropy.shape == value.shape == (N,)
    assert log_prob.requires_grad


def test_properties_describe_the_action_space():
    discrete, continuous = ActorCritic(*CARTPOLE), ActorCritic(*PENDULUM)
    assert not discrete.is_continuous and discrete.action_shape == ()
    assert discrete.action_dtype is np.int64
    assert continuous.is_continuous and continuous.action_shape == (1,)
    assert continuous.action_dtype is np.float32
    torch.testing.assert_close(continuous.log_std.detach(), torch.zeros(1))


@pytest.mark.parametrize("cnn, uses_cnn", [(None, True), (False, False)])
def test_cnn_torso_is_chosen_for_images(cnn, uses_cnn):
    model = ActorCritic(*ATARI, cnn=cnn)
    assert model.uses_cnn is uses_cnn
    assert any(isinstance(m, torch.nn.Conv2d) for m in model.modules()) is uses_cnn
    assert not ActorCritic(*CARTPOLE).uses_cnn


def test_height_width_channel_images_are_read_as_channels_first():
    model = ActorCritic(*CARRACING)
    assert model.uses_cnn
    assert model.torso[0][0].in_channels == 3
    obs = batch(CARRACING[0])  # [N, 96, 96, 3]
    channels_first = ActorCritic(spaces.Box(0, 255, (3, 96, 96), np.uint8), CARRACING[1])
    channels_first.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(obs), channels_first(obs.permute(0, 3, 1, 2)))


def test_an_image_too_small_for_the_nature_cnn_says_how_small_and_what_to_set():
    with pytest.raises(ValueError, match=r"at least 36x36; set model.cnn_arch to auto"):
        ActorCritic(spaces.Box(0, 255, (3, 20, 20), np.uint8), spaces.Discrete(2), cnn_arch="nature")
    with pytest.raises(ValueError, match=r"at least 3x3"):
        ActorCritic(spaces.Box(0, 255, (2, 2, 3), np.uint8), spaces.Discrete(2))


@SPACES
def test_sampled_log_prob_matches_evaluate(obs_space, action_space):
    model = ActorCritic(obs_space, action_space)
    obs = batch(obs_space)
    action, log_prob, value = model.act(obs)
    eval_log_prob, _, eval_value = model.evaluate(obs, action)
    torch.testing.assert_close(log_prob, eval_log_prob.detach())
    torch.testing.assert_close(value, eval_value.detach())


@SPACES
def test_deterministic_act_is_mode(obs_space, action_space):
    model = ActorCritic(obs_space, action_space)
    obs = batch(obs_space)
    action, _, _ = model.act(obs, deterministic=True)
    params, _ = model(obs)
    expected = params if model.is_continuous else params.argmax(dim=-1)
    torch.testing.assert_close(action, expected.detach())


def reference_log_prob_and_entropy(action_space, logits, actions):
    """Log-probabilities and entropies from torch's distributions: Categorical(logits=...)
    per Discrete or MultiDiscrete component (summed), Bernoulli(logits=...) per MultiBinary
    component (summed)."""
    if isinstance(action_space, spaces.MultiBinary):
        dist = torch.distributions.Bernoulli(logits=logits)
        return dist.log_prob(actions.to(logits.dtype)).sum(-1), dist.entropy().sum(-1)
    nvec = [int(action_space.n)] if isinstance(action_space, spaces.Discrete) else action_space.nvec
    parts = [torch.distributions.Categorical(logits=chunk) for chunk in logits.split(list(nvec), -1)]
    columns = actions.reshape(len(actions), -1).unbind(-1)
    return (sum(part.log_prob(column) for part, column in zip(parts, columns)),
            sum(part.entropy() for part in parts))


@pytest.mark.parametrize("action_space", [spaces.Discrete(2), spaces.Discrete(6), spaces.Discrete(18),
                                          spaces.MultiDiscrete([3, 5]), spaces.MultiBinary(4)],
                         ids=["2", "6", "18", "multidiscrete-3-5", "multibinary-4"])
@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0], ids=["near-uniform", "spread", "near-certain"])
def test_discrete_log_prob_and_entropy_are_torchs_with_their_gradients(action_space, scale):
    """evaluate computes them without building a distribution; they must still be torch's
    (reference_log_prob_and_entropy, in float64 on the same logits), from near-uniform
    policies to near-certain ones, to float32 rounding: 1e-6 of the logits' size."""
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    model = ActorCritic(obs_space, action_space)
    with torch.no_grad():  # logits of about `scale` times 8
        model.policy_head.weight.normal_(0.0, scale)
        model.policy_head.bias.normal_(0.0, scale)
    obs_space.seed(0)
    action_space.seed(0)
    obs, actions = batch(obs_space, 64), batch(action_space, 64)

    log_prob, entropy, _ = model.evaluate(obs, actions)
    logits, _ = model(obs)
    ref_log_prob, ref_entropy = reference_log_prob_and_entropy(action_space, logits.double(), actions)
    most = reference_log_prob_and_entropy(  # the entropy of the uniform policy
        action_space, torch.zeros_like(logits[:1]).double(), actions[:1])[1][0]
    regime = {0.01: ref_entropy.min() > 0.99 * most, 1.0: 0.1 < ref_entropy.median() < 0.9 * most,
              30.0: ref_entropy.median() < 0.01 * most}[scale]
    assert regime, (ref_entropy.min(), ref_entropy.median(), most)
    tolerance = dict(rtol=0, atol=1e-6 * max(1.0, logits.abs().max().item()))
    torch.testing.assert_close(log_prob.double(), ref_log_prob, **tolerance)
    torch.testing.assert_close(entropy.double(), ref_entropy, **tolerance)
    for mine, theirs in ((log_prob, ref_log_prob), (entropy, ref_entropy)):
        weights = torch.randn(len(mine))  # any weighting of the batch, as a loss applies
        grad, = torch.autograd.grad((weights * mine).sum(), model.policy_head.weight, retain_graph=True)
        ref_grad, = torch.autograd.grad((weights.double() * theirs).sum(), model.policy_head.weight,
                                        retain_graph=True)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-5 * max(1.0, ref_grad.abs().max().item()))


def test_gaussian_log_prob_and_entropy_sum_over_action_dims():
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    model = ActorCritic(obs_space, spaces.Box(-2.0, 2.0, (4,), np.float32))
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([-1.0, 0.0, 0.5, 1.0]))
    obs = batch(obs_space)
    actions = torch.randn(N, 4)

    log_prob, entropy, _ = model.evaluate(obs, actions)
    mean, _ = model(obs)
    per_dim = torch.distributions.Normal(mean, model.log_std.exp())
    torch.testing.assert_close(log_prob, per_dim.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, per_dim.entropy().sum(-1))


def test_state_dependent_std_is_read_from_the_head_next_to_the_mean():
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    model = ActorCritic(obs_space, spaces.Box(-2.0, 2.0, (2,), np.float32), state_dependent_std=True)
    assert not hasattr(model, "log_std")
    with torch.no_grad():  # log-stds that vary with the state, one beyond the clamp
        model.policy_head.weight[2:].normal_()
        model.policy_head.bias[2:] = torch.tensor([0.0, 9.0])
    obs = batch(obs_space)
    actions = torch.randn(N, 2)

    params, _ = model(obs)
    assert params.shape == (N, 4)
    mean, log_std = params[:, :2], params[:, 2:].clamp(-5.0, 2.0)
    assert log_std[:, 0].std() > 0 and (log_std[:, 1] == 2.0).all()
    per_dim = torch.distributions.Normal(mean, log_std.exp())
    log_prob, entropy, _ = model.evaluate(obs, actions)
    torch.testing.assert_close(log_prob, per_dim.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, per_dim.entropy().sum(-1))
    torch.testing.assert_close(model.act(obs, deterministic=True)[0], mean.detach())
    log_prob.sum().backward()
    assert model.policy_head.weight.grad[2:].abs().sum() > 0


def test_state_dependent_std_leaves_discrete_policies_alone():
    model = ActorCritic(*CARTPOLE, state_dependent_std=True)
    assert model(batch(CARTPOLE[0]))[0].shape == (N, 2)


def test_discrete_observations_are_one_hot_encoded():
    model = ActorCritic(spaces.Discrete(7), spaces.Discrete(3), hidden_sizes=())
    obs = torch.tensor([0, 3, 6])
    expected = model.policy_head(torch.nn.functional.one_hot(obs, 7).float())
    torch.testing.assert_close(model(obs)[0], expected)


@pytest.mark.parametrize("obs_space, action_space, message", [
    (spaces.Text(5), spaces.Discrete(2), "observation space Text"),
    (CARTPOLE[0], spaces.MultiBinary((2, 2)), "action space MultiBinary"),
    (CARTPOLE[0], spaces.Box(-1.0, 1.0, (2, 2), np.float32), "action space Box"),
])
def test_unsupported_spaces_raise_value_error_naming_the_space(obs_space, action_space, message):
    with pytest.raises(ValueError, match=message):
        ActorCritic(obs_space, action_space)


def test_forcing_cnn_on_flat_observations_raises_value_error():
    with pytest.raises(ValueError, match=r"rank-3 Box .* got Box"):
        ActorCritic(*CARTPOLE, cnn=True)


def test_unknown_activation_raises_value_error():
    with pytest.raises(ValueError, match="activation"):
        ActorCritic(*CARTPOLE, activation="gelu")



def test_sampled_discrete_actions_follow_the_policy_probabilities():
    model = ActorCritic(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3))
    with torch.no_grad():
        model.policy_head.bias.copy_(torch.tensor([0.0, 1.0, 2.0]))
    obs = torch.zeros(40_000, 4)
    actions, log_probs, _ = model.act(obs)
    expected = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    frequencies = torch.bincount(actions, minlength=3).float() / len(actions)
    assert torch.allclose(frequencies, expected, atol=0.01)
    assert torch.allclose(log_probs, expected.log()[actions], atol=1e-5)


@pytest.mark.parametrize("obs_space", [spaces.Box(-1, 1, (5,), np.float32),
                                       spaces.Dict({"x": spaces.Box(-1, 1, (3,), np.float32),
                                                    "y": spaces.Discrete(4)})])
def test_a_value_torso_of_its_own_keeps_value_errors_off_the_policys_features(obs_space):
    """shared_torso false: the value loss moves only the value torso and head, the policy
    loss only the policy torso, head and log-std."""
    model = ActorCritic(obs_space, spaces.Box(-1, 1, (2,), np.float32), shared_torso=False)
    obs = {k: torch.as_tensor(np.stack([s.sample() for _ in range(6)])) for k, s in obs_space.items()} \
        if isinstance(obs_space, spaces.Dict) else torch.randn(6, 5)
    params, value = model(obs)
    value.pow(2).sum().backward(retain_graph=True)
    moved = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert moved and all(name.startswith(("value_torso.", "value_head.")) for name in moved), moved
    model.zero_grad(set_to_none=True)
    model.dist(params).log_prob(torch.zeros(6, 2)).sum().backward()
    moved = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert moved and not any(name.startswith(("value_torso.", "value_head.")) for name in moved), moved


@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_log_std_init_is_the_gaussian_policys_starting_log_std(state_dependent_std):
    model = ActorCritic(spaces.Box(-1, 1, (4,), np.float32), spaces.Box(-1, 1, (3,), np.float32),
                        state_dependent_std=state_dependent_std, log_std_init=-1.5)
    std = model.dist(model(torch.zeros(2, 4))[0]).base_dist.scale
    torch.testing.assert_close(std, torch.full((2, 3), math.exp(-1.5)))


@pytest.mark.parametrize("obs_space", [PENDULUM[0], spaces.Dict({"x": PENDULUM[0], "k": spaces.Discrete(3)})],
                         ids=["box", "dict"])
def test_layer_norm_gives_every_hidden_layer_of_both_torsos_zero_mean_unit_variance_inputs(obs_space):
    """Each activation of the policy's and the value's torso gets its layer's pre-activations
    normalized over the layer's units, per sample (LayerNorm starts as the identity affine)."""
    model = ActorCritic(obs_space, PENDULUM[1], hidden_sizes=(16, 8), activation="relu",
                        shared_torso=False, layer_norm=True)
    seen = []
    for module in model.modules():
        if isinstance(module, torch.nn.ReLU):
            module.register_forward_hook(lambda m, inputs, out: seen.append(inputs[0]))
    x = batch(PENDULUM[0]) * 100  # far from unit scale before the first layer
    model(x if obs_space is PENDULUM[0] else {"x": x, "k": torch.tensor([0, 1, 2, 0, 1])})
    assert [h.shape[-1] for h in seen] == [16, 8, 16, 8]  # policy torso, then value torso
    for h in seen:
        torch.testing.assert_close(h.mean(-1), torch.zeros(N), atol=1e-5, rtol=0)
        torch.testing.assert_close(h.var(-1, unbiased=False), torch.ones(N), atol=1e-3, rtol=0)
    plain = ActorCritic(obs_space, PENDULUM[1], hidden_sizes=(16, 8), activation="relu", shared_torso=False)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in plain.modules())


def test_the_first_convolution_scales_its_weights_as_the_input_would_have_been_scaled():
    """A CNN reads byte images unscaled and multiplies its first layer's weights by 1/255:
    the same layer, and the same gradient, as a plain convolution of the scaled input."""
    from a3c.models.torsos import ScaledConv2d
    scaled = ScaledConv2d(4, 32, 8, stride=4, input_scale=1 / 255)
    plain = torch.nn.Conv2d(4, 32, 8, stride=4)
    plain.load_state_dict(scaled.state_dict())
    x = torch.randint(0, 256, (3, 4, 84, 84)).float()
    a, b = scaled(x), plain(x / 255)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    a.square().sum().backward()
    b.square().sum().backward()
    assert (scaled.weight.grad - plain.weight.grad).norm() <= 1e-5 * plain.weight.grad.norm()


def test_a_bfloat16_torso_gives_the_float32_loss_and_gradients_within_bfloat16_rounding():
    """The faster path of the Nature CNN's update (model.precision bfloat16): the same
    batch and weights give a loss within 1 % of float32's, a gradient within 15 % of
    float32's (norm of the difference over float32's norm; 6-8 % seen) and every
    parameter's gradient pointing the same way (cosine >= 0.98; 0.991 seen). bfloat16
    keeps 8 bits of mantissa: 0.4 % per product, before the sums."""
    from a3c.config import Config
    from a3c.learners.batch import Batch
    from a3c.learners.loss import compute_loss
    cfg = Config()
    T, B = 5, 8
    obs = torch.as_tensor(np.stack([ATARI[0].sample() for _ in range((T + 1) * B)])).reshape(T + 1, B, 4, 84, 84)
    batch = Batch(obs=obs[:T], action=torch.randint(0, 6, (T, B)), reward=torch.randn(T, B),
                  logp=torch.full((T, B), -math.log(6)), terminated=torch.zeros(T, B, dtype=torch.bool),
                  truncated=torch.zeros(T, B, dtype=torch.bool), trunc_value=torch.zeros(T, B),
                  version=torch.zeros(T, B, dtype=torch.long), bootstrap_obs=obs[T])
    results = {}
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(0)
        model = ActorCritic(*ATARI, precision=precision)
        loss = compute_loss(model, batch, cfg).total
        loss.backward()
        results[precision] = loss.item(), [p.grad for p in model.parameters()]
    (loss32, grads32), (loss16, grads16) = results["float32"], results["bfloat16"]
    assert loss16 == pytest.approx(loss32, rel=1e-2)
    whole32, whole16 = (torch.cat([g.flatten() for g in grads]) for grads in (grads32, grads16))
    assert (whole16 - whole32).norm() <= 0.15 * whole32.norm()
    for g32, g16 in zip(grads32, grads16):
        assert torch.nn.functional.cosine_similarity(g16.flatten(), g32.flatten(), dim=0) >= 0.98


@pytest.mark.parametrize("spaces_, native, expected", [
    (ATARI, True, torch.bfloat16), (ATARI, False, torch.float32),
    ((spaces.Box(0, 1, (10, 10, 4), bool), spaces.Discrete(6)), True, torch.float32),  # MinAtar: small CNN
    (CARTPOLE, True, torch.float32)], ids=["nature-native", "nature-emulated", "small-cnn", "mlp"])
def test_auto_precision_is_bfloat16_only_for_the_nature_cnn_where_the_hardware_computes_it(
        monkeypatch, spaces_, native, expected):
    from a3c.models import actor_critic
    monkeypatch.setattr(actor_critic, "native_bfloat16", lambda device: native)
    model = ActorCritic(*spaces_, precision="auto")
    assert model.torso_dtype("cpu") == expected
    params, value = model(batch(spaces_[0]))
    assert params.dtype == value.dtype == torch.float32  # the heads are float32 whatever the torso


def test_an_unknown_precision_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="float32, bfloat16, auto"):
        ActorCritic(*ATARI, precision="half")


def test_the_impala_torso_is_fifteen_layers_of_residual_stacks_that_read_frames_of_any_size():
    """model.cnn_arch impala: three stacks (a convolution, a max-pool of stride 2, two
    residual blocks) of 16, 32 and 32 channels, then dense 256; an 84x84 frame leaves it
    11x11, a 10x10 grid 2x2; the policy's outputs are finite and it learns end to end."""
    from a3c.models.torsos import Residual
    for shape, side in (((4, 84, 84), 11), ((10, 10, 4), 2)):
        space = spaces.Box(0, 255, shape, np.uint8)
        model = ActorCritic(space, spaces.Discrete(6), cnn_arch="impala")
        convs = [m for m in model.torso.modules() if isinstance(m, torch.nn.Conv2d)]
        assert len(convs) == 3 * 5 and [c.out_channels for c in convs[::5]] == [16, 32, 32]
        assert sum(isinstance(m, Residual) for m in model.torso.modules()) == 6
        dense = [m for m in model.torso.modules() if isinstance(m, torch.nn.Linear)]
        assert [(d.in_features, d.out_features) for d in dense] == [(32 * side * side, 256)]
        params, value = model(batch(space))
        assert params.shape == (N, 6) and torch.isfinite(params).all() and torch.isfinite(value).all()
        logp, _, value = model.evaluate(batch(space), torch.zeros(N, dtype=torch.long))
        (logp.sum() + value.sum()).backward()
        assert all(p.grad is not None for p in model.torso.parameters())
