"""The learner: the V-trace loss on hand-made batches, batching of fragments, the shared
optimizers, and the learner loop's handling of partial batches and non-finite losses."""
import copy
import math
import queue
import threading
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as tmp
import torch.nn as nn
from gymnasium import spaces
from torch.distributions import Categorical

from a3c.learners import updater as learner
from a3c.actors.loop import fragment_dtype
from a3c.config import load_config
from a3c.learners.batch import Batch, batch_from_fragments
from a3c.learners.loss import (approx_kl, batch_targets, compute_loss, evaluate_batch, mean_excess, step_minibatches, vtrace_returns, _explained_variance)
from a3c.learners.source import BatchSource, replay_buffer
from a3c.learners.updater import STEP_DTYPE, Updater, step_queue
from a3c.learners.workers import run_learner
from a3c.models import ActorCritic
from a3c.learners.optim import SharedAdam, SharedRMSprop, build_optimizer
from a3c.trainer import COUNTERS, TIMERS
from replay import ArrayQueue, Counters

OBS_SPACE = spaces.Box(-np.inf, np.inf, (1,), np.float32)
ACTION_SPACE = spaces.Discrete(2)

# The fixed policy of FixedModel: probabilities 1/4 and 3/4.
P = (0.25, 0.75)
LOGP = tuple(math.log(p) for p in P)
ENTROPY = -sum(p * math.log(p) for p in P)


class FixedModel(nn.Module):
    """A model whose outputs the test controls: the policy is fixed by `logits`
    (probabilities P), and the value of an observation is its first component times
    `scale` (1.0). `nan` adds NaN to every value, to produce a non-finite loss."""

    is_continuous = False
    action_shape = ()
    action_dtype = np.int64

    def __init__(self, nan: bool = False):
        super().__init__()
        self.logits = nn.Parameter(torch.tensor([0.0, math.log(3.0)]))
        self.scale = nn.Parameter(torch.tensor(1.0))
        self.nan = nan

    def forward(self, obs):
        obs = obs.float().reshape(len(obs), -1)
        value = obs[:, 0] * self.scale
        if self.nan:
            value = value + float("nan")
        return self.logits.expand(len(obs), -1), value

    def dist(self, params):
        return Categorical(logits=params)

    @torch.no_grad()
    def act(self, obs, deterministic=False):
        params, value = self(obs)
        dist = self.dist(params)
        action = params.argmax(-1) if deterministic else dist.sample()
        return action, dist.log_prob(action), value

    def evaluate(self, obs, actions):
        params, value = self(obs)
        dist = self.dist(params)
        return dist.log_prob(actions.long()), dist.entropy(), value


def config(**learners):
    """IMPALA's loss (no clipping, raw advantages, lambda 1), one step per batch, unless
    the test asks for more."""
    return load_config({"learners": {"gamma": 0.9, "vf_coef": 0.5, "ent_coef": 0.01, "batch_size": 4,
                                     "epochs": 1, "minibatches": 1, "clip_coef": None,
                                     "normalize_advantages": False, **learners},
                        "vtrace": {"td_lambda": 1.0},
                        "actors": {"queue_capacity": 16}})


def fragments(T, B):
    return np.zeros(B, fragment_dtype(OBS_SPACE, ACTION_SPACE, T))


def hand_batch(values, rewards, actions, bootstrap, terminated=None, truncated=None,
               trunc_value=None, behaviour_logp=None):
    """A batch from per-column lists [B][T]; the observation is the value V(x_t)."""
    B, T = len(values), len(values[0])
    f = fragments(T, B)
    f["obs"][..., 0] = values
    f["last_obs"][:, 0] = bootstrap
    f["reward"] = rewards
    f["action"] = actions
    f["logp"] = behaviour_logp if behaviour_logp is not None else np.asarray(LOGP)[np.asarray(actions)]
    if terminated is not None:
        f["terminated"] = terminated
    if truncated is not None:
        f["truncated"] = truncated
    if trunc_value is not None:
        f["trunc_value"] = trunc_value
    return batch_from_fragments(f)


# ------------------------------------------------------------------------------ compute_loss
def test_on_policy_loss_is_the_n_step_actor_critic_loss_with_cut_and_bootstrapped_episode_ends():
    """On-policy (behaviour log-probabilities equal the model's), V-trace reduces to n-step
    returns. Column 0 runs through, column 1 terminates at t=1 (no bootstrap), column 2 is
    truncated at t=1 and bootstraps from trunc_value = 10."""
    g = 0.9
    V = [0.5, 0.25, 0.125]  # V(x_0..x_2), the same in every column
    r = [1.0, 2.0, 3.0]
    boot = 4.0  # V(x_3)
    actions = [[0, 1, 1], [1, 0, 1], [1, 1, 0]]
    batch = hand_batch([V] * 3, [r] * 3, actions, [boot] * 3,
                       terminated=[[0, 0, 0], [0, 1, 0], [0, 0, 0]],
                       truncated=[[0, 0, 0], [0, 0, 0], [0, 1, 0]],
                       trunc_value=[[0, 0, 0], [0, 0, 0], [0, 10.0, 0]])
    # The returns, by hand, backwards from x_3:
    G2 = 3 + g * 4                                  # every column: bootstrap from V(x_3)
    run_through = [1 + g * (2 + g * G2), 2 + g * G2, G2]
    terminated = [1 + g * 2, 2, G2]                 # t=1 ends the episode: G1 = r1
    truncated = [1 + g * (2 + g * 10), 2 + g * 10, G2]  # t=1 bootstraps from trunc_value
    G = np.array([run_through, terminated, truncated])  # [B, T]
    adv = G - np.array([V] * 3)
    logp = np.asarray(LOGP)[np.asarray(actions)]
    policy = -np.mean(logp * adv)
    value = 0.5 * np.mean(adv ** 2)
    expected = policy + 0.5 * value - 0.01 * ENTROPY

    model = FixedModel()
    loss, stats, *_ = compute_loss(model, batch, config(gamma=g))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats.policy == pytest.approx(policy, rel=1e-5)
    assert stats.value == pytest.approx(value, rel=1e-5)
    assert stats.entropy == pytest.approx(ENTROPY, rel=1e-5)

    # The targets carry no gradient: d loss / d scale comes from the value loss alone,
    # vf_coef * mean((G - V) * -obs), with obs = V since scale = 1.
    loss.backward()
    assert model.scale.grad.item() == pytest.approx(0.5 * np.mean(-adv * np.array([V] * 3)), rel=1e-5)


def test_loss_does_not_depend_on_the_bootstrap_value_after_a_terminal_last_step():
    model = FixedModel()
    common = dict(values=[[0.5, 0.5]], rewards=[[1.0, 1.0]], actions=[[0, 1]], terminated=[[0, 1]])
    low = compute_loss(model, hand_batch(bootstrap=[0.0], **common), config())[0]
    high = compute_loss(model, hand_batch(bootstrap=[1e6], **common), config())[0]
    assert low.item() == pytest.approx(high.item(), rel=1e-6)
    assert low.item() == pytest.approx(  # G = [1 + 0.9, 1], V = 0.5
        -np.mean(np.array(LOGP) * np.array([1.9 - 0.5, 0.5]))
        + 0.5 * 0.5 * np.mean(np.array([1.4, 0.5]) ** 2) - 0.01 * ENTROPY, rel=1e-5)


@pytest.mark.parametrize("clip", [1.0, None], ids=["clipped", "unclipped"])
def test_off_policy_loss_weights_by_clipped_importance_ratios(clip):
    """One step; the behaviour policy gave probability 0.5 to each action, so rho is
    0.75 / 0.5 = 1.5 for action 1 (clipped to 1.0 if asked) and 0.25 / 0.5 = 0.5 for 0."""
    g, V, r, boot = 0.9, 0.5, 1.0, 4.0
    batch = hand_batch([[V], [V]], [[r], [r]], [[1], [0]], [boot, boot],
                       behaviour_logp=[[math.log(0.5)], [math.log(0.5)]])
    cfg = config(gamma=g)
    cfg.vtrace.clip_rho_threshold = cfg.vtrace.clip_pg_rho_threshold = clip
    delta = r + g * boot - V
    rho = np.array([1.5 if clip is None else 1.0, 0.5])
    vs = V + rho * delta
    adv = rho * delta
    expected = (-np.mean(np.array([LOGP[1], LOGP[0]]) * adv) + 0.5 * 0.5 * np.mean((vs - V) ** 2)
                - 0.01 * ENTROPY)
    loss = compute_loss(FixedModel(), batch, cfg).total
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_clipped_objective_is_ppos_on_vtrace_advantages_and_stops_the_gradient_past_the_clip():
    """pi/mu is 1.5 for action 1 (beyond 1 + 0.2: its term is clipped, no gradient) and
    0.5 for action 0 (below 1 - 0.2, but with a positive advantage min() keeps the
    unclipped term). The advantage is r + gamma V(x_1) - V(x_0) for both."""
    g, V, r, boot = 0.9, 0.5, 1.0, 4.0
    batch = hand_batch([[V], [V]], [[r], [r]], [[1], [0]], [boot, boot],
                       behaviour_logp=[[math.log(0.5)], [math.log(0.5)]])
    cfg = config(gamma=g, clip_coef=0.2)
    model = FixedModel()
    loss, stats, *_ = compute_loss(model, batch, cfg)
    A = r + g * boot - V
    assert stats.policy == pytest.approx(-(1.2 * A + 0.5 * A) / 2, rel=1e-5)
    assert stats.clip_fraction == 1.0
    rho = np.array([1.0, 0.5])  # V-trace's value targets still use the clipped rho
    assert stats.value == pytest.approx(0.5 * np.mean((rho * A) ** 2), rel=1e-5)

    loss.backward()
    expected = FixedModel()  # only action 0's unclipped term carries a gradient
    ratio0 = torch.exp(torch.log_softmax(expected.logits, -1)[0] - math.log(0.5))
    (-(ratio0 * A) / 2 - 0.01 * Categorical(logits=expected.logits).entropy()).backward()
    torch.testing.assert_close(model.logits.grad, expected.logits.grad)


def test_proximal_clip_is_centred_on_the_proximal_policy_and_weighted_by_its_capped_ratio_to_the_behaviour():
    """PPO-EWMA: the ratio is pi over the proximal policy, and each step's term is weighted by
    proximal/behaviour, capped at vtrace.clip_pg_rho_threshold (1). Action 1: pi/prox is
    0.75/0.6 = 1.25, clipped to 1.2 (no gradient), its weight 0.6/0.5 = 1.2 capped to 1.
    Action 0: pi/prox is 0.25/0.3 inside the clip, its weight 0.3/0.5 = 0.6."""
    g, V, r, boot = 0.9, 0.5, 1.0, 4.0
    batch = hand_batch([[V], [V]], [[r], [r]], [[1], [0]], [boot, boot],
                       behaviour_logp=[[math.log(0.5)], [math.log(0.5)]])
    batch = batch._replace(prox_logp=torch.log(torch.tensor([[0.6, 0.3]])))
    cfg = config(gamma=g, clip_coef=0.2, proximal_decay=0.9)
    model = FixedModel()
    loss, stats, *_ = compute_loss(model, batch, cfg)
    A = r + g * boot - V
    assert stats.policy == pytest.approx(-(1.2 * A + 0.6 * (0.25 / 0.3) * A) / 2, rel=1e-5)
    assert stats.clip_fraction == 0.5

    loss.backward()
    expected = FixedModel()  # only action 0's term carries a gradient, weighted by 0.6
    ratio0 = torch.exp(torch.log_softmax(expected.logits, -1)[0] - math.log(0.3))
    (-(0.6 * ratio0 * A) / 2 - 0.01 * Categorical(logits=expected.logits).entropy()).backward()
    torch.testing.assert_close(model.logits.grad, expected.logits.grad)


def test_proximal_policy_averages_the_models_weights_and_reads_its_statistics_as_they_are_now():
    model = ActorCritic(OBS_SPACE, ACTION_SPACE, hidden_sizes=(4,), normalize_obs=True)
    proximal = learner.ProximalPolicy(model, 0.9)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    proximal.update()
    for mine, old, new in zip(proximal.model.parameters(), before, model.parameters()):
        torch.testing.assert_close(mine, 0.9 * old + 0.1 * new)
        assert not mine.requires_grad

    batch = step_batch()
    model.obs_norm.update(torch.full((64, 1), 5.0))  # statistics move, the average does not hold them
    average = copy.deepcopy(model)
    with torch.no_grad():
        for mine, p in zip(average.parameters(), proximal.model.parameters()):
            mine.copy_(p)
    torch.testing.assert_close(proximal.logp(batch), evaluate_batch(average, batch)[0].detach())


def test_a_learner_centres_each_batch_on_its_proximal_average_and_moves_it_after_every_gradient_step(monkeypatch):
    """Two batches of 3 passes in 2 minibatches: each minibatch's proximal log-probs are
    the average's when its batch began, and the average after the 12 steps is the
    exponential average of the parameters each step left."""
    cfg = config(minibatches=2, epochs=3, clip_coef=0.2, proximal_decay=0.8)
    cfg.optim.lr = 0.05
    torch.manual_seed(0)
    model, batch = FixedModel(), step_batch()
    counters, stats = Counters(COUNTERS, TIMERS), step_queue()
    updater = Updater(cfg, model, SharedAdam(model.parameters(), cfg.optim.lr), counters, stats)
    average = [p.detach().clone() for p in model.parameters()]
    centres, steps = [], updater.optimizer.step

    def recording(local, part, cfg, returns=None):
        centres.append((part, [p.clone() for p in average]))
        return compute_loss(local, part, cfg, returns)

    def step(*args, **kwargs):
        steps(*args, **kwargs)
        for mine, p in zip(average, model.parameters()):
            mine.mul_(0.8).add_(0.2 * p.detach())

    monkeypatch.setattr(learner, "compute_loss", recording)
    monkeypatch.setattr(updater.optimizer, "step", step)
    try:
        for _ in range(2):
            updater.train(batch, True)
    finally:
        counters.close()
        stats.close()
    assert len(centres) == 12
    for i, (part, _) in enumerate(centres):
        logits = centres[i - i % 6][1][0]  # the average as the minibatch's batch began
        expected = torch.log_softmax(logits, -1)[part.action.long()]
        torch.testing.assert_close(part.prox_logp, expected)
    for mine, expected in zip(updater.proximal.model.parameters(), average):
        torch.testing.assert_close(mine, expected)


def test_learners_given_one_average_move_it_once_for_each_step_any_of_them_takes(monkeypatch):
    """Two learners of one shared model, each with 2 gradient steps a batch, given the
    run's average: after a batch each, it is the exponential average over all 4 steps, as
    if one learner had taken them, and each learner's average is that one."""
    cfg = config(minibatches=2, clip_coef=0.2, proximal_decay=0.8)
    cfg.optim.lr = 0.05
    torch.manual_seed(0)
    model = FixedModel()
    optimizer = SharedAdam(model.parameters(), cfg.optim.lr)
    average = learner.proximal_average(model)
    expected = [p.detach().clone() for p in model.parameters()]
    steps = optimizer.step

    def step(*args, **kwargs):
        steps(*args, **kwargs)
        for mine, p in zip(expected, model.parameters()):
            mine.mul_(0.8).add_(0.2 * p.detach())

    monkeypatch.setattr(optimizer, "step", step)
    counters, stats = Counters(COUNTERS, TIMERS), step_queue()
    try:
        updaters = [Updater(cfg, model, optimizer, counters, stats, average=average) for _ in range(2)]
        for updater in updaters:
            updater.train(step_batch(), True)
        assert counters["updates"] == 4 and all(u.proximal.model is average for u in updaters)
    finally:
        counters.close()
        stats.close()
    for mine, want, now in zip(average.parameters(), expected, model.parameters()):
        torch.testing.assert_close(mine, want)
        assert not torch.equal(mine, now)  # it trails the model


def test_explained_variance_is_one_for_an_exact_critic_zero_for_a_constant_one_negative_for_a_worse():
    targets = torch.tensor([1.0, 3.0, -2.0, 6.0])
    assert _explained_variance(targets, targets.clone()).item() == pytest.approx(1.0)
    assert _explained_variance(targets, torch.full((4,), 7.0)).item() == pytest.approx(0.0, abs=1e-6)
    assert _explained_variance(targets, -targets).item() == pytest.approx(1 - 4.0)  # Var(2y) / Var(y)
    same = torch.full((4,), 100.0)  # a solved CartPole: every target alike, the critic exact
    assert _explained_variance(same, same.clone()).item() == pytest.approx(1.0)
    # In the loss: FixedModel's values are one constant, whatever the V-trace targets.
    batch = hand_batch([[0.5], [0.5]], [[1.0], [1.0]], [[1], [0]], [4.0, 4.0],
                       behaviour_logp=[[math.log(0.5)], [math.log(0.5)]])
    stats = compute_loss(FixedModel(), batch, config(gamma=0.9, clip_coef=0.2)).stats
    assert stats.explained_variance.item() == pytest.approx(0.0, abs=1e-6)


def test_approx_kl_is_zero_for_the_acting_policy_and_estimates_kl_mu_pi_from_mus_samples():
    torch.manual_seed(0)
    mu, pi = torch.distributions.Normal(0.0, 1.0), torch.distributions.Normal(0.3, 0.8)
    actions = mu.sample((200_000,))
    log_rhos = pi.log_prob(actions) - mu.log_prob(actions)
    exact = torch.distributions.kl_divergence(mu, pi).item()
    assert approx_kl(log_rhos).item() == pytest.approx(exact, rel=0.02)
    assert approx_kl(torch.zeros(5)).item() == 0.0
    assert math.isfinite(approx_kl(torch.tensor([100.0, 0.0])).item())  # e^100 overflows float32
    # In the loss, with pi/mu known: FixedModel's action 1 has probability 0.75, mu's 0.5.
    batch = hand_batch([[0.5], [0.5]], [[1.0], [1.0]], [[1], [1]], [4.0, 4.0],
                       behaviour_logp=[[math.log(0.5)], [math.log(0.5)]])
    stats = compute_loss(FixedModel(), batch, config(gamma=0.9, clip_coef=0.2)).stats
    assert stats.approx_kl.item() == pytest.approx(1.5 - 1 - math.log(1.5))


def test_normalized_advantages_have_zero_mean_and_unit_std_in_the_loss():
    g, V = 0.9, 0.5
    actions = [[1], [0], [1], [0]]
    behaviour = [[math.log(0.7)], [LOGP[0]], [math.log(0.7)], [LOGP[0]]]  # ratios 0.75/0.7 and 1
    batch = hand_batch([[V]] * 4, [[1.0], [2.0], [-3.0], [10.0]], actions, [4.0] * 4,
                       behaviour_logp=behaviour)
    cfg = config(gamma=g, clip_coef=0.2, normalize_advantages=True)
    adv = np.array([1.0, 2.0, -3.0, 10.0]) + g * 4.0 - V
    adv = (adv - adv.mean()) / adv.std(ddof=1)
    ratio = np.array([0.75 / 0.7, 1.0, 0.75 / 0.7, 1.0])
    assert compute_loss(FixedModel(), batch, cfg).stats.policy == pytest.approx(
        -np.mean(ratio * adv), rel=1e-5)


# ------------------------------------------------------------------------- step_minibatches
def step_batch():
    """3 fragments of 4 steps whose observations (the values) are all different, with an
    episode end in each of two, and behaviour policies other than the learner's."""
    rng = np.random.default_rng(0)
    values = (np.arange(12).reshape(3, 4) / 8).tolist()  # exact in float32
    actions = rng.integers(0, 2, (3, 4))
    return hand_batch(values, rng.normal(size=(3, 4)), actions, bootstrap=[0.5, 0.2, -0.1],
                      terminated=[[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
                      truncated=[[0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]],
                      trunc_value=[[0, 0, 0, 0], [0, 0, 3, 0], [0, 0, 0, 0]],
                      behaviour_logp=np.log(rng.uniform(0.2, 0.8, (3, 4))))


def test_minibatches_of_steps_hold_every_step_once_with_the_whole_batchs_vtrace_targets():
    batch, cfg, model = step_batch(), config(minibatch_split="steps", minibatches=5), FixedModel()
    logp, _, values, bootstrap = evaluate_batch(model, batch)  # V-trace along whole fragments:
    whole = vtrace_returns(batch, (logp - batch.logp).detach(), values.detach(), bootstrap, cfg)
    parts = step_minibatches(model, batch, cfg)
    assert [part.reward.shape for part, _ in parts] == [(1, 3), (1, 3), (1, 2), (1, 2), (1, 2)]
    obs = torch.cat([part.obs.reshape(-1) for part, _ in parts])
    assert sorted(obs.tolist()) == pytest.approx(batch.obs.reshape(-1).sort().values.tolist())
    where = {float(v): (t, b) for (t, b), v in np.ndenumerate(batch.obs[..., 0].numpy())}
    for part, returns in parts:
        assert part.bootstrap_obs is None and part.state is None
        for i, v in enumerate(part.obs[0, :, 0].tolist()):
            t, b = where[v]  # every field of the step, and its target, from one step
            for name in ("action", "reward", "logp", "terminated", "truncated", "trunc_value", "version"):
                assert getattr(part, name)[0, i] == getattr(batch, name)[t, b], name
            for name, target in returns._asdict().items():
                assert target[0, i].item() == pytest.approx(getattr(whole, name)[t, b].item()), name


def test_a_minibatch_of_steps_without_its_targets_is_refused_with_what_gives_them():
    ((part, _),) = step_minibatches(FixedModel(), step_batch(), config(minibatch_split="steps"))
    with pytest.raises(ValueError, match="needs its V-trace returns, as step_minibatches gives them"):
        compute_loss(FixedModel(), part, config())


def test_one_minibatch_of_steps_has_the_loss_of_the_whole_batch():
    batch, model = step_batch(), FixedModel()
    cfg = config(minibatch_split="steps", clip_coef=0.2, normalize_advantages=True)
    ((part, returns),) = step_minibatches(model, batch, cfg)
    assert compute_loss(model, part, cfg, returns).total.item() == pytest.approx(
        compute_loss(model, batch, cfg).total.item(), rel=1e-5)


def targets_per_step(batch, split, fixed, monkeypatch):
    """Train FixedModel on `batch` (3 passes in 2 minibatches of `split`), whose shared
    parameters moved after its learner copied them, and return per gradient step its value
    targets by step {obs: vs}, its policy loss, and the policy loss on the advantages of
    the shared model before the first step; with those targets by step."""
    cfg = config(minibatch_split=split, minibatches=2, epochs=3, fixed_targets=fixed)
    cfg.optim.lr = 0.05  # steps that move the values enough to move the targets
    model = FixedModel()
    counters, stats = Counters(COUNTERS, TIMERS), step_queue()
    updater = Updater(cfg, model, SharedAdam(model.parameters(), cfg.optim.lr), counters, stats)
    with torch.no_grad():
        model.scale.fill_(1.5)  # another learner's step: the targets are the shared model's
    before = batch_targets(model, batch, cfg)
    vs, advantages = (dict(zip(batch.obs[..., 0].flatten().tolist(), x.flatten().tolist()))
                      for x in (before.vs, before.pg_advantages))
    steps = []

    def recording(local, part, cfg, returns=None):
        loss = compute_loss(local, part, cfg, returns)
        obs = part.obs[..., 0].flatten().tolist()
        logp = evaluate_batch(local, part)[0].detach().flatten()  # config(): IMPALA's loss, raw advantages
        expected = -(logp * torch.tensor([advantages[o] for o in obs])).mean().item()
        steps.append((dict(zip(obs, loss.value_targets.flatten().tolist())), loss.stats.policy.item(), expected))
        return loss

    monkeypatch.setattr(learner, "compute_loss", recording)
    try:
        updater.train(batch, True)
    finally:
        counters.close()
        stats.close()
    assert model.scale.item() != 1.5  # the values moved
    return steps, vs


@pytest.mark.parametrize("split", ["fragments", "steps"])
def test_fixed_targets_are_the_batchs_before_its_first_step_in_every_pass_and_no_longer_without(
        split, monkeypatch):
    batch = step_batch()
    steps, before = targets_per_step(batch, split, True, monkeypatch)
    assert len(steps) == 6 and sum(len(targets) for targets, *_ in steps) == 3 * 12  # each step once a pass
    for targets, policy, expected in steps:
        assert targets == pytest.approx({obs: before[obs] for obs in targets})
        assert policy == pytest.approx(expected, rel=1e-5)
    steps, before = targets_per_step(batch, split, False, monkeypatch)
    targets, policy, expected = steps[-1]
    assert targets != pytest.approx({obs: before[obs] for obs in targets})
    assert policy != pytest.approx(expected, rel=1e-5)


def kl_bounded_update(target_kl, split, monkeypatch):
    """Train FixedModel on step_batch (3 passes in 2 minibatches of `split`) with
    `target_kl`; return per minibatch its approx KL from the policy before the update, and
    the counters."""
    cfg = config(minibatch_split=split, minibatches=2, epochs=3, target_kl=target_kl, clip_coef=0.2)
    cfg.optim.lr = 0.05  # steps that move the policy
    torch.manual_seed(0)  # the minibatches' draw
    model, batch = FixedModel(), step_batch()
    start = {obs: logp for obs, logp in zip(batch.obs[..., 0].flatten().tolist(),
                                            evaluate_batch(model, batch)[0].detach().flatten().tolist())}
    counters, stats = Counters(COUNTERS, TIMERS), step_queue()
    updater = Updater(cfg, model, SharedAdam(model.parameters(), cfg.optim.lr), counters, stats)
    kls = []

    def recording(local, part, cfg, returns=None):
        loss = compute_loss(local, part, cfg, returns)
        if target_kl is not None:  # the learner's start is the model's before the update
            expected = [start[obs] for obs in part.obs[..., 0].flatten().tolist()]
            assert part.start_logp.flatten().tolist() == pytest.approx(expected)
            kls.append(approx_kl(loss.logp - part.start_logp).item())
        return loss

    monkeypatch.setattr(learner, "compute_loss", recording)
    try:
        updater.train(batch, True)
        return kls, counters.snapshot()
    finally:
        counters.close()
        stats.close()


@pytest.mark.parametrize("split", ["fragments", "steps"])
def test_target_kl_ends_the_update_at_the_first_minibatch_past_one_and_a_half_times_it(split, monkeypatch):
    _, unbounded = kl_bounded_update(None, split, monkeypatch)
    assert unbounded["updates"] == 6 and unbounded["kl_stops"] == 0
    kls, counts = kl_bounded_update(1e-3, split, monkeypatch)
    assert kls[0] == pytest.approx(0.0, abs=1e-7)  # the first step is always taken
    assert 1 <= counts["updates"] < 6 and counts["kl_stops"] == 1
    assert len(kls) == counts["updates"] + 1  # every minibatch checked, the last one not stepped
    assert max(kls[:-1]) <= 1.5e-3 < kls[-1]
    assert counts["fresh_batches"] == 1  # an early end is still a trained batch
    kls, counts = kl_bounded_update(10.0, split, monkeypatch)
    assert counts["updates"] == 6 and counts["kl_stops"] == 0 and max(kls) < 15


# A bounded range, a range 4 wide off zero, and an unbounded dimension.
BOX = spaces.Box(np.array([-1.0, 0.0, -np.inf], np.float32), np.array([1.0, 4.0, np.inf], np.float32))


def gaussian(mean, state_dependent_std=False):
    """A Gaussian policy on BOX whose mean is `mean` in every state, with a gradient."""
    model = ActorCritic(OBS_SPACE, BOX, state_dependent_std=state_dependent_std)
    with torch.no_grad():
        model.policy_head.weight.zero_()
        model.policy_head.bias[:3] = torch.tensor(mean)
    return model


def box_batch(T=2, B=3):
    return batch_from_fragments(np.zeros(B, fragment_dtype(OBS_SPACE, BOX, T)))


@pytest.mark.parametrize("state_dependent_std", [False, True])
def test_mean_excess_is_zero_inside_the_bounds_and_the_squared_half_widths_beyond(state_dependent_std):
    def excess(mean):
        params, _ = gaussian(mean, state_dependent_std)(torch.zeros(6, 1))
        return mean_excess(params, BOX)

    inside = excess([0.9, 3.9, 100.0])
    torch.testing.assert_close(inside, torch.zeros(6))
    # 1.5 is half a half-width past 1; -2 is one half-width (2) below 0; the third is unbounded.
    beyond = excess([1.5, -2.0, -100.0])
    torch.testing.assert_close(beyond, torch.full((6,), 0.5 ** 2 + 1.0 ** 2))


def test_bound_coef_adds_the_mean_excess_to_the_loss_and_pulls_the_mean_back_inside():
    batch, model = box_batch(), gaussian([1.5, -2.0, 0.5])
    plain = compute_loss(model, batch, load_config({}))
    bounded = compute_loss(model, batch, load_config({"learners": {"bound_coef": 0.5}}))
    torch.testing.assert_close(bounded.total - plain.total, torch.tensor(0.5 * 1.25))
    (bounded.total - plain.total).backward()
    grad = model.policy_head.bias.grad
    assert grad[0] > 0 and grad[1] < 0 and grad[2] == 0  # a gradient step moves each mean inwards


# ------------------------------------------------------------------------ batch_from_fragments
def test_batch_from_fragments_is_time_major_and_aligned_with_the_fragments():
    T, B = 5, 3
    obs_space = spaces.Box(-np.inf, np.inf, (2, 3), np.float32)
    f = np.zeros(B, fragment_dtype(obs_space, ACTION_SPACE, T))
    rng = np.random.default_rng(0)
    for name in ("obs", "last_obs", "reward", "logp", "trunc_value"):
        f[name] = rng.normal(size=f[name].shape)
    f["action"] = rng.integers(0, 2, f["action"].shape)
    f["version"] = rng.integers(0, 100, f["version"].shape)
    f["terminated"] = rng.random(f["terminated"].shape) < 0.3
    f["truncated"] = rng.random(f["truncated"].shape) < 0.3

    batch = batch_from_fragments(f)
    assert isinstance(batch, Batch)
    assert batch.obs.shape == (T, B, 2, 3)
    assert batch.bootstrap_obs.shape == (B, 2, 3)
    for name in ("action", "reward", "logp", "terminated", "truncated", "trunc_value", "version"):
        tensor = getattr(batch, name)
        assert tensor.shape == (T, B), name
        assert tensor.dtype == torch.from_numpy(f[name].copy()).dtype, name
    for t in range(T):
        for b in range(B):
            for name in ("obs", "action", "reward", "logp", "terminated", "truncated", "trunc_value",
                         "version"):
                np.testing.assert_array_equal(getattr(batch, name)[t, b].numpy(), f[name][b][t], name)
    np.testing.assert_array_equal(batch.bootstrap_obs.numpy(), f["last_obs"])


@pytest.mark.parametrize("replay", [False, True], ids=["in-place", "with-replay"])
def test_a_batch_read_in_the_queues_slots_equals_one_copied_out(replay):
    """A learner's two ways to a fresh batch: a whole batch lent where it lies in the queue
    (without replay), and one copied out (with replay, which keeps records in one piece;
    and the second batch, whose first loan stops at the end of the ring after 2 of 4
    fragments, get_many taking the rest). Both give the tensors the records give, and
    keep them after the slots are written again; every fragment counts once, and reaches
    the replay buffer if there is one."""
    cfg = load_config({"learners": {"batch_size": 4, "minibatches": 1},
                       "replay": {"ratio": 1.0 if replay else 0.0}})
    f = fragments(3, 8)
    rng = np.random.default_rng(0)
    for name in ("obs", "last_obs", "reward", "logp", "trunc_value"):
        f[name] = rng.normal(size=f[name].shape)
    f["obs"][:, 0, 0] = np.arange(8)  # marks, for the replay buffer's record
    q, counters = ArrayQueue(6, f.dtype), Counters(COUNTERS, TIMERS)
    buffer = RecordingReplay(replay_buffer(cfg, f.dtype)) if replay else None
    copies = []  # get_many calls per batch

    class Queue:  # the queue, counting get_many calls
        def __getattr__(self, name):
            return getattr(q, name)

        def get_many(self, *args, **kwargs):
            copies[-1] += 1
            return q.get_many(*args, **kwargs)

    source = BatchSource(cfg, Queue(), buffer, counters)
    try:
        batches = []
        for part in (f[:4], f[4:]):  # positions 0-3, then 4-7: slots 4, 5, 0, 1
            q.put_many(part)
            copies.append(0)
            batch, fresh = source.next()
            assert fresh
            batches.append(batch)
        q.put_many(np.zeros(6, f.dtype))  # every slot written again
        for part, batch in zip((f[:4], f[4:]), batches):
            for name, got, expected in zip(Batch._fields, batch, batch_from_fragments(part)):
                assert got is None and expected is None or torch.equal(got, expected), name
        assert copies == ([1, 1] if replay else [0, 1])  # without replay, the first in place
        assert counters["queue_gets"] == 8
        if replay:
            assert buffer.added == list(range(8))
    finally:
        q.close()
        counters.close()
        if replay:
            buffer.buffer.close()


# ---------------------------------------------------------------------------- shared optimizers
def _shared_param(n=3):
    return nn.Parameter(torch.zeros(n)).share_memory_()


def _in_thread(fn, *args):
    thread = threading.Thread(target=fn, args=args)
    thread.start()
    thread.join()


G1, G2 = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])


def test_rmsprop_square_avg_is_shared_by_steps_from_two_threads():
    param = _shared_param()
    opt = SharedRMSprop([param], lr=0.1, alpha=0.9, eps=1e-5)
    assert all(t.is_shared() for t in opt.state["square_avg"])
    _in_thread(opt.step, [G1])
    _in_thread(opt.step, [G2])
    expected = 0.9 * 0.1 * G1 ** 2 + 0.1 * G2 ** 2
    torch.testing.assert_close(opt.state["square_avg"][0], expected)
    assert (param < 0).all()  # both steps moved the parameter against positive gradients


def test_adam_moments_and_step_count_are_shared_by_steps_from_two_threads():
    param = _shared_param()
    opt = SharedAdam([param], lr=0.1, betas=(0.9, 0.99), eps=1e-5)
    assert all(t.is_shared() for ts in opt.state.values() for t in ts)
    _in_thread(opt.step, [G1])
    _in_thread(opt.step, [G2])
    assert opt.state["step"][0].item() == 2
    torch.testing.assert_close(opt.state["exp_avg"][0], 0.9 * 0.1 * G1 + 0.1 * G2)
    torch.testing.assert_close(opt.state["exp_avg_sq"][0], 0.99 * 0.01 * G1 ** 2 + 0.01 * G2 ** 2)


def _steps_beside_torch(shared, reference, kwargs, steps=8):
    """Step a shared optimizer and torch's `reference` (same keyword arguments) side by side
    on the same gradients, in float64 so that only the formulas can differ: three tensors,
    gradients whose scale varies per step and tensor from 1e-4 to 10 (where epsilon
    matters and where it does not). Yields both parameter lists after each step and the
    optimizers."""
    rng = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (5,), (2, 2, 3)]
    start = [torch.randn(shape, generator=rng, dtype=torch.float64) for shape in shapes]
    ours = [nn.Parameter(t.clone()) for t in start]
    theirs = [nn.Parameter(t.clone()) for t in start]
    opt, ref = shared(ours, **kwargs), reference(theirs, **kwargs)
    for _ in range(steps):
        grads = [torch.randn(shape, generator=rng, dtype=torch.float64)
                 * 10.0 ** torch.randint(-4, 2, (), generator=rng).item() for shape in shapes]
        opt.step(grads)
        for p, g in zip(theirs, grads):
            p.grad = g.clone()
        ref.step()
        yield [p - p0 for p, p0 in zip(ours, start)], [p - p0 for p, p0 in zip(theirs, start)], opt, ref


@pytest.mark.parametrize("shared, reference, kwargs", [
    (SharedRMSprop, torch.optim.RMSprop, dict(lr=0.01, alpha=0.9, eps=1e-5)),
    (SharedRMSprop, torch.optim.RMSprop, dict(lr=0.003, alpha=0.99, eps=1e-3)),
    (SharedAdam, torch.optim.Adam, dict(lr=0.01, betas=(0.9, 0.99), eps=1e-5)),
    (SharedAdam, torch.optim.Adam, dict(lr=0.001, betas=(0.8, 0.999), eps=1e-3)),
], ids=["rmsprop", "rmsprop-large-eps", "adam", "adam-large-eps"])
def test_shared_optimizers_take_torchs_steps_on_the_same_gradients(shared, reference, kwargs):
    """SharedRMSprop is torch.optim.RMSprop with its defaults momentum=0, centered=False and
    weight_decay=0 (options SharedRMSprop does not have): epsilon added to sqrt(square_avg).
    SharedAdam is torch.optim.Adam: epsilon added to the bias-corrected sqrt(v). Each step's
    displacement of every parameter from its start matches to 1e-9 relative, and so do the
    statistics."""
    for step, (moved, expected, opt, ref) in enumerate(_steps_beside_torch(shared, reference, kwargs), 1):
        for i, (mine, theirs) in enumerate(zip(moved, expected)):
            torch.testing.assert_close(mine, theirs, rtol=1e-9, atol=0,
                                       msg=lambda m: f"step {step}, parameter {i}: {m}")
        for name, tensors in opt.state.items():
            if name == "step":
                assert tensors[0].item() == step
                continue
            for p, mine in zip(ref.param_groups[0]["params"], tensors):
                torch.testing.assert_close(mine, ref.state[p][name], rtol=1e-9, atol=0)


def _step_in_child(opt, grad):
    opt.step([grad])


def test_optimizer_statistics_and_parameters_are_shared_with_a_child_process():
    param = _shared_param()
    rms = SharedRMSprop([param], lr=0.1, alpha=0.9)
    other = _shared_param()
    adam = SharedAdam([other], lr=0.1, betas=(0.9, 0.99))
    ctx = tmp.get_context("spawn")
    for opt in (rms, adam):
        child = ctx.Process(target=_step_in_child, args=(opt, G1))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        opt.step([G2])  # the parent's step builds on the child's
    torch.testing.assert_close(rms.state["square_avg"][0], 0.9 * 0.1 * G1 ** 2 + 0.1 * G2 ** 2)
    assert (param < 0).all()
    assert adam.state["step"][0].item() == 2
    torch.testing.assert_close(adam.state["exp_avg"][0], 0.9 * 0.1 * G1 + 0.1 * G2)


class TwoHeads(nn.Module):
    """Policy and value modules named, and interleaved, as ActorCritic's are."""

    def __init__(self):
        super().__init__()
        self.torso, self.value_torso = nn.Linear(2, 2), nn.Linear(2, 2)
        self.policy_head, self.value_head = nn.Linear(2, 1), nn.Linear(2, 1)


@pytest.mark.parametrize("name", ["adam", "rmsprop"])
def test_value_lr_steps_the_value_torso_and_head_at_their_own_rate_and_the_rest_at_lr(name):
    """Adam's first step moves each parameter by its learning rate (m / sqrt(v) is 1), and
    RMSprop's by lr / sqrt(1 - alpha) for a gradient of ones: with optim.value_lr ten times
    lr, the value's parameters move ten times as far as the policy's."""
    model = TwoHeads()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, load_config({"optim": {"name": name, "lr": 1e-3, "value_lr": 1e-2}}).optim)
    opt.step([torch.ones_like(p) for p in opt.params])
    moved = {n: (before[n] - p.detach()).abs().mean().item() for n, p in model.named_parameters()}
    for n, distance in moved.items():
        assert distance > 0, n
        ratio = distance / moved["torso.weight"]
        assert ratio == pytest.approx(10.0 if n.startswith("value_") else 1.0, rel=1e-3), n


def test_value_lr_left_out_steps_every_parameter_at_lr():
    opt = build_optimizer(TwoHeads(), load_config({"optim": {"lr": 1e-3}}).optim)
    assert opt.lr == 1e-3 and set(opt.lr_scales) == {1.0}


def test_value_lr_keeps_the_models_parameter_order_so_saved_statistics_load_in_place():
    model = TwoHeads()
    opt = build_optimizer(model, load_config({"optim": {"value_lr": 1e-2}}).optim)
    assert [id(p) for p in opt.params] == [id(p) for p in model.parameters()]


def test_value_lr_for_a_model_without_value_modules_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="value_lr: null"):
        build_optimizer(nn.Linear(2, 2), load_config({"optim": {"value_lr": 1e-2}}).optim)


# --------------------------------------------------------------------------------- run_learner
class LearnerHarness:
    """run_learner threads on a FixedModel, fed through a real queue."""

    def __init__(self, cfg, model, num=1):
        self.cfg, self.model = cfg, model
        model.share_memory()
        self.optimizer = (SharedAdam if cfg.optim.name == "adam" else SharedRMSprop)(
            model.parameters(), cfg.optim.lr)
        dtype = fragment_dtype(OBS_SPACE, ACTION_SPACE, 3)
        self.fragments = ArrayQueue(cfg.actors.queue_capacity, dtype)
        buffer = replay_buffer(cfg, dtype)
        self.replay = RecordingReplay(buffer) if buffer is not None else None
        self.counters = Counters(COUNTERS, TIMERS)
        self.steps = step_queue()
        self._reported: list[np.ndarray] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=run_learner, args=(cfg, model, self.optimizer, self.fragments,
                                                                   self.counters, self.steps, self.stop,
                                                                   self.replay))
                        for _ in range(num)]
        for thread in self.threads:
            thread.start()

    @property
    def stats(self) -> np.recarray:
        """The gradient steps the learners reported so far (STEP_DTYPE records)."""
        while True:
            try:
                self._reported.append(self.steps.get_many(1024, block=False))
            except queue.Empty:
                return np.concatenate([np.zeros(0, STEP_DTYPE), *self._reported]).view(np.recarray)

    def put(self, n, mark=0.5, version=0):
        """n fragments whose observations are all `mark`, acted by policy `version` (an int,
        or [n, T] per step)."""
        f = fragments(3, n)
        f["obs"][..., 0] = mark
        f["reward"] = 1.0
        f["action"] = 1
        f["logp"] = LOGP[1]
        f["version"] = version
        self.fragments.put_many(f)

    def wait_for(self, name, value, timeout=20.0):
        deadline = time.monotonic() + timeout
        while self.counters[name] < value and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.counters[name]

    def close(self):
        self.stop.set()
        self.fragments.close()
        for thread in self.threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in self.threads)
        self.counters.close()
        self.steps.close()
        if self.replay is not None:
            self.replay.buffer.close()


class RecordingReplay:
    """A learner's ReplayBuffer that records the mark of every fragment added and drawn."""

    def __init__(self, buffer):
        self.buffer = buffer
        self.added: list[float] = []  # marks, in the order added
        self.draws: list[tuple[list[float], int]] = []  # (marks drawn, len(added) then)

    def add_many(self, items):
        self.buffer.add_many(items)
        self.added += items["obs"][:, 0, 0].tolist()

    def sample(self, n, **kw):
        out = self.buffer.sample(n, **kw)
        self.draws.append((out["obs"][:, 0, 0].tolist(), len(self.added)))
        return out


@pytest.fixture
def harnesses():
    made = []
    yield lambda *args, **kw: made.append(LearnerHarness(*args, **kw)) or made[-1]
    for harness in made:
        harness.close()


def test_non_finite_loss_is_skipped_counted_and_leaves_parameters_unchanged(harnesses):
    model = FixedModel(nan=True)
    before = [p.detach().clone() for p in model.parameters()]
    h = harnesses(config(), model)
    h.put(8)
    assert h.wait_for("nonfinite_losses", 2) == 2
    assert h.counters["updates"] == 0
    assert h.counters["policy_version"] == 0
    for p, p0 in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), p0)
    assert all((t == 0).all() for ts in h.optimizer.state.values() for t in ts)  # no step taken
    assert len(h.stats) == 0


def test_a_learner_splitting_by_steps_takes_a_gradient_step_per_minibatch_beyond_the_fragments(harnesses):
    h = harnesses(config(minibatch_split="steps", minibatches=6, epochs=2), FixedModel())
    h.put(4)  # one batch: 4 fragments of 3 steps
    assert h.wait_for("updates", 12) == 12
    assert h.counters["policy_version"] == 12


def test_a_batch_filled_across_queue_timeouts_loses_no_fragment(harnesses):
    """The learner waits for fragments in 0.2 s slices; fragments that arrive in
    separate slices still make one batch."""
    model = FixedModel()
    h = harnesses(config(batch_size=4), model)
    h.put(1)
    time.sleep(0.6)  # several empty slices while the batch holds one fragment
    h.put(3)
    assert h.wait_for("updates", 1) == 1
    assert h.counters["queue_gets"] == 4
    assert h.fragments.qsize() == 0
    assert len(h.stats) == 1


def test_two_learner_threads_update_one_shared_model_and_optimizer(harnesses):
    cfg = config(batch_size=4)
    cfg.optim.name = "adam"
    model = FixedModel()
    before = [p.detach().clone() for p in model.parameters()]
    h = harnesses(cfg, model, num=2)
    h.put(8)
    assert h.wait_for("updates", 2) == 2
    assert h.optimizer.state["step"][0].item() == 2
    assert h.counters["policy_version"] == 2
    assert h.counters["queue_gets"] == 8
    assert any(not torch.equal(p.detach(), p0) for p, p0 in zip(model.parameters(), before))
    assert all(step.lr == cfg.optim.lr and not step.replayed for step in h.stats)
    # Every fragment was acted at version 0, so a step's lag is the version it read: 0 for
    # the first read (no update yet), 0 or 1 for the other.
    lags = sorted(step.lag_max for step in h.stats)
    assert lags[0] == 0 and lags[1] in (0, 1)
    assert all(step.lag_mean == step.lag_max for step in h.stats)


def test_a_step_reports_the_gradient_norm_before_the_clip(harnesses):
    """The same batch with the clip far below the gradient's norm and far above it: the
    reported norm is the unclipped one both times."""
    reported = []
    for max_norm in (1e-6, 1e6):
        h = harnesses(config(max_grad_norm=max_norm), FixedModel())
        h.put(4)
        assert h.wait_for("updates", 1) == 1
        reported.append(h.stats[0].grad_norm)
    assert reported[0] == pytest.approx(reported[1], rel=1e-5)
    assert reported[0] > 1e-3


def test_policy_lag_is_the_learners_version_minus_the_version_that_acted_each_step(harnesses):
    """A batch acted by versions 4 to 10 reaches a learner at version 10; its second pass
    is one update later, so one version more behind."""
    h = harnesses(config(batch_size=4, epochs=2), FixedModel())
    h.counters.add("policy_version", 10)
    acted = np.array([[10, 10, 10], [9, 9, 10], [7, 8, 8], [4, 5, 6]])  # [B, T]
    h.put(4, version=acted)
    assert h.wait_for("updates", 2) == 2
    first, second = h.stats
    lag = 10 - acted
    assert (first.lag_max, first.lag_mean) == (lag.max(), lag.mean()) == (6, 2.0)
    assert (second.lag_max, second.lag_mean) == (lag.max() + 1, lag.mean() + 1)
    assert h.counters["policy_version"] == 12


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the learner's error
def test_a_learner_that_dies_stops_the_run_with_an_error_instead_of_hanging(tmp_path):
    from a3c.metrics import MemorySink
    from a3c.trainer import Trainer, build_default_model

    cfg = load_config({"actors": {"mode": "thread", "num": 1, "envs_per_actor": 2, "unroll_length": 5,
                                  "queue_capacity": 16},
                       "learners": {"batch_size": 4, "minibatches": 1}, "total_timesteps": 100_000,
                       "logging": {"progress": False, "interval_s": 0.5, "run_root": str(tmp_path)},
                       "checkpoint": {"interval_s": 0}})
    model = build_default_model(cfg)

    def broken_evaluate(obs, actions):
        raise ValueError("broken model")

    model.evaluate = broken_evaluate
    trainer = Trainer(cfg, tmp_path / "run", model, sink=MemorySink())
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(pytest.raises(RuntimeError, trainer.train)))
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the run hangs when its learner dies"
    (info,) = outcome
    assert "learner thread died" in str(info.value)
    assert trainer.counters["updates"] == 0
    assert (tmp_path / "run" / "checkpoint.pt").is_file()  # the usual shutdown still ran


# ------------------------------------------------------------------------------------ replay
REPLAY_BASE = {"learners": {"batch_size": 4, "epochs": 1, "minibatches": 1}, "actors": {"queue_capacity": 16}}


def test_an_idle_learner_replays_up_to_the_replay_ratio_and_no_further(harnesses):
    ratio, B, fresh = 2.0, 4, 16
    h = harnesses(load_config({**REPLAY_BASE, "replay": {"ratio": ratio, "window": 16}}), FixedModel())
    h.put(fresh)
    assert h.wait_for("queue_gets", fresh) == fresh
    # The buffer's limit: drawn + B <= ratio * (added - B) + error_buffer (2 * ratio).
    limit = int(ratio * (fresh - B) + 2 * ratio)
    assert h.wait_for("replayed", limit) == limit
    time.sleep(0.5)  # the actors are idle and the learner could replay more: it must not
    assert h.counters["replayed"] == limit
    assert h.counters["updates"] == (fresh + limit) // B
    assert sum(step.replayed for step in h.stats) == limit // B


def test_a_learner_counts_the_fresh_batches_it_trained_on_and_not_the_replayed_ones(harnesses):
    """Synchronous actors wait for this count (a3c.actors.local.SyncGate)."""
    B, fresh = 4, 8
    h = harnesses(load_config({**REPLAY_BASE, "replay": {"ratio": 2.0, "window": 16}}), FixedModel())
    h.put(fresh)
    h.wait_for("replayed", 2 * B)
    assert h.wait_for("updates", fresh // B + 2) >= fresh // B + 2  # the replayed batches trained too
    assert h.counters["fresh_batches"] == fresh // B


def test_no_fragment_is_replayed_after_it_left_the_window(harnesses):
    window, B = 8, 4
    h = harnesses(load_config({**REPLAY_BASE, "replay": {"ratio": 8.0, "window": window}}), FixedModel())
    for mark in range(1, 9):  # batch after batch, the learner replaying in between
        h.put(B, mark=float(mark))
        h.wait_for("queue_gets", mark * B)
        h.wait_for("replayed", 1 + h.counters["replayed"], timeout=2.0)
    draws = list(h.replay.draws)
    assert len(draws) >= 8
    for marks, added in draws:
        assert set(marks) <= set(h.replay.added[max(0, added - window):added]), \
            f"drew {sorted(set(marks))} when the window held {h.replay.added[added - window:added]}"
    assert {m for marks, _ in draws for m in marks} >= {6.0, 7.0, 8.0}  # recent ones are drawn


def test_reward_clip_clips_the_rewards_the_targets_are_made_of_and_nothing_else():
    """learners.reward_clip: V-trace's targets from clipped rewards equal the targets of
    the same batch whose rewards were clipped by hand; the batch keeps the game's rewards,
    which the actors' episode returns are summed from."""
    batch, model = step_batch(), FixedModel()
    batch = batch._replace(reward=batch.reward * 3)  # some beyond [-1, 1]
    assert batch.reward.abs().max() > 1
    logp, _, values, bootstrap = (x.detach() for x in evaluate_batch(model, batch))
    clipped = vtrace_returns(batch, logp - batch.logp, values, bootstrap, config(reward_clip=1.0))
    by_hand = vtrace_returns(batch._replace(reward=batch.reward.clamp(-1, 1)), logp - batch.logp, values,
                             bootstrap, config())
    unclipped = vtrace_returns(batch, logp - batch.logp, values, bootstrap, config())
    for a, b in zip(clipped, by_hand):
        torch.testing.assert_close(a, b)
    assert not torch.allclose(clipped.vs, unclipped.vs)
    assert batch.reward.abs().max() > 1  # untouched
