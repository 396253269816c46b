"""Tests of a3c.vtrace against a direct transcription of IMPALA eq. (1)."""

import re

import numpy as np
import pytest
import torch

from a3c.learners import vtrace


def reference_vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
                     clip_rho_threshold, clip_pg_rho_threshold, td_lambda=1.0):
    """Deliberately slow V-trace straight from Espeholt et al. (2018), eq. (1).

    vs_t = V_t + sum_{s>=t} (prod_{i=t}^{s-1} gamma_i c_i) rho_s (r_s + gamma_s V_{s+1} - V_s),
    where gamma^{s-t} is the product of the per-step discounts and c_i = lambda min(1, rho_i).
    No recursion. Returns (vs, pg_advantages, advantages).
    """
    T, B = log_rhos.shape
    ratios = np.exp(log_rhos)
    clip = lambda x, c: x if c is None else np.minimum(c, x)  # noqa: E731
    rhos, cs = clip(ratios, clip_rho_threshold), td_lambda * clip(ratios, 1.0)
    pg_rhos = clip(ratios, clip_pg_rho_threshold)
    values_ext = np.concatenate([values, bootstrap_value[None]], axis=0)  # V_0..V_T

    vs = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total = values[t, b]
            for s in range(t, T):
                weight = 1.0
                for i in range(t, s):
                    weight *= discounts[i, b] * cs[i, b]
                delta = rhos[s, b] * (rewards[s, b] + discounts[s, b] * values_ext[s + 1, b]
                                      - values[s, b])
                total += weight * delta
            vs[t, b] = total
    vs_ext = np.concatenate([vs, bootstrap_value[None]], axis=0)
    advantages = rewards + discounts * vs_ext[1:] - values
    return vs, pg_rhos * advantages, advantages


def random_inputs(T, B, seed=0, log_rho_range=2.5):
    rng = np.random.default_rng(seed)
    return dict(
        log_rhos=rng.uniform(-log_rho_range, log_rho_range, (T, B)),
        discounts=rng.choice([0.0, 0.9, 0.99], size=(T, B), p=[0.1, 0.45, 0.45]),
        rewards=rng.normal(size=(T, B)),
        values=rng.normal(size=(T, B)),
        bootstrap_value=rng.normal(size=(B,)),
    )


def run_vtrace(inputs, **clip):
    result = vtrace.from_importance_weights(
        **{k: torch.as_tensor(v, dtype=torch.float64) for k, v in inputs.items()}, **clip)
    return result.vs.numpy(), result.pg_advantages.numpy()


def assert_matches_reference(inputs, clip_rho, clip_pg_rho, td_lambda=1.0):
    clip = dict(clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho)
    result = vtrace.from_importance_weights(
        **{k: torch.as_tensor(v, dtype=torch.float64) for k, v in inputs.items()}, **clip,
        td_lambda=td_lambda)
    for got, expected in zip(result, reference_vtrace(**inputs, **clip, td_lambda=td_lambda)):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("clip_rho, clip_pg_rho", [(1.0, 1.0), (3.7, 2.2), (None, None)])
def test_matches_paper_formula_with_active_clipping(clip_rho, clip_pg_rho):
    inputs = random_inputs(T=5, B=3)
    # The log-ratio range must exercise both sides of every threshold used.
    ratios = np.exp(inputs["log_rhos"])
    assert (ratios > 3.7).any() and (ratios < 1.0).any()
    assert_matches_reference(inputs, clip_rho, clip_pg_rho)


@pytest.mark.parametrize("td_lambda", [0.0, 0.5, 0.95])
@pytest.mark.parametrize("T, B", [(5, 3), (1, 3), (5, 1)], ids=["T=5,B=3", "T=1", "B=1"])
def test_lambda_traces_match_paper_formula_with_c_scaled_by_lambda(td_lambda, T, B):
    assert_matches_reference(random_inputs(T, B, seed=5), 1.0, 1.0, td_lambda)


def test_lambda_zero_on_policy_gives_one_step_targets():
    inputs = random_inputs(T=4, B=2, seed=6)
    inputs["log_rhos"] = np.zeros_like(inputs["log_rhos"])
    vs, _ = run_vtrace(inputs, td_lambda=0.0)
    next_values = np.concatenate([inputs["values"][1:], inputs["bootstrap_value"][None]])
    np.testing.assert_allclose(vs, inputs["rewards"] + inputs["discounts"] * next_values,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T, B", [(1, 3), (5, 1), (1, 1)], ids=["T=1", "B=1", "T=1,B=1"])
def test_matches_paper_formula_on_degenerate_shapes(T, B):
    assert_matches_reference(random_inputs(T, B, seed=1), 1.0, 1.0)


@pytest.mark.parametrize("clip_rho, clip_pg_rho", [(1.0, 1.0), (None, None)])
def test_on_policy_vs_is_n_step_bootstrapped_return(clip_rho, clip_pg_rho):
    inputs = random_inputs(T=6, B=4, seed=2)
    inputs["log_rhos"] = np.zeros_like(inputs["log_rhos"])
    vs, pg_advantages = run_vtrace(inputs, clip_rho_threshold=clip_rho,
                                   clip_pg_rho_threshold=clip_pg_rho)

    # G_t = r_t + gamma_t r_{t+1} + ... + (prod_{i=t}^{T-1} gamma_i) V(x_T)
    discounts, rewards = inputs["discounts"], inputs["rewards"]
    T = rewards.shape[0]
    returns = np.zeros_like(rewards)
    for t in range(T):
        scale = np.ones(rewards.shape[1])
        for s in range(t, T):
            returns[t] += scale * rewards[s]
            scale = scale * discounts[s]
        returns[t] += scale * inputs["bootstrap_value"]
    np.testing.assert_allclose(vs, returns, rtol=1e-12, atol=1e-12)

    next_returns = np.concatenate([returns[1:], inputs["bootstrap_value"][None]])
    np.testing.assert_allclose(
        pg_advantages, rewards + discounts * next_returns - inputs["values"],
        rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("terminal_step", [0, 2, 4])
def test_termination_cuts_bootstrap(terminal_step):
    inputs = random_inputs(T=5, B=3, seed=3)
    inputs["discounts"] = np.full((5, 3), 0.95)
    inputs["discounts"][terminal_step] = 0.0
    vs, pg_advantages = run_vtrace(inputs)

    # Anything after the terminal step must not leak into targets up to it.
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["bootstrap_value"] += 100.0
    changed["values"][terminal_step + 1:] += 100.0
    changed["rewards"][terminal_step + 1:] += 100.0
    changed_vs, changed_pg_advantages = run_vtrace(changed)

    upto = slice(0, terminal_step + 1)
    np.testing.assert_allclose(vs[upto], changed_vs[upto], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pg_advantages[upto], changed_pg_advantages[upto],
                               rtol=1e-12, atol=1e-12)
    assert_matches_reference(inputs, 1.0, 1.0)


@pytest.mark.parametrize("clip_rho, clip_pg_rho", [(1.0, 1.0), (None, None)])
def test_from_logits_equals_from_importance_weights(clip_rho, clip_pg_rho):
    T, B, A = 5, 3, 4
    generator = torch.Generator().manual_seed(4)
    behaviour_logits = torch.randn(T, B, A, generator=generator, dtype=torch.float64)
    target_logits = 2.0 * torch.randn(T, B, A, generator=generator, dtype=torch.float64)
    actions = torch.randint(A, (T, B), generator=generator)
    rest = {k: torch.as_tensor(v) for k, v in random_inputs(T, B, seed=4).items()
            if k != "log_rhos"}
    clip = dict(clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho)

    out = vtrace.from_logits(behaviour_logits, target_logits, actions, **rest, **clip)

    behaviour_log_probs = torch.distributions.Categorical(logits=behaviour_logits).log_prob(actions)
    target_log_probs = torch.distributions.Categorical(logits=target_logits).log_prob(actions)
    torch.testing.assert_close(out.behaviour_action_log_probs, behaviour_log_probs)
    torch.testing.assert_close(out.target_action_log_probs, target_log_probs)
    torch.testing.assert_close(out.log_rhos, target_log_probs - behaviour_log_probs)
    expected = vtrace.from_importance_weights(out.log_rhos, **rest, **clip)
    torch.testing.assert_close(out.vs, expected.vs)
    torch.testing.assert_close(out.pg_advantages, expected.pg_advantages)


def test_targets_carry_no_gradient():
    inputs = {k: torch.as_tensor(v).requires_grad_() for k, v in random_inputs(4, 2).items()}
    out = vtrace.from_importance_weights(**inputs)
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


@pytest.mark.parametrize("name, bad_shape", [
    ("discounts", (5, 2)),
    ("rewards", (4, 3)),
    ("values", (5,)),
    ("bootstrap_value", (5, 3)),
])
def test_shape_mismatch_raises_value_error_naming_argument(name, bad_shape):
    inputs = {k: torch.as_tensor(v) for k, v in random_inputs(T=5, B=3).items()}
    inputs[name] = torch.zeros(bad_shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"`{name}`.*{re.escape(str(bad_shape))}"):
        vtrace.from_importance_weights(**inputs)


def test_from_logits_rejects_mismatched_actions():
    inputs = {k: torch.as_tensor(v) for k, v in random_inputs(T=5, B=3).items()
              if k != "log_rhos"}
    logits = torch.zeros(5, 3, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`actions`.*\(5, 3\).*\(3, 5\)"):
        vtrace.from_logits(logits, logits, torch.zeros(3, 5, dtype=torch.int64), **inputs)
