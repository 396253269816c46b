"""The recurrent (LSTM) core: unrolls match stepping one observation at a time, resets
where episodes begin, and the state the actor acted from is the one stored."""
import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c.model import build_model

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)


@pytest.mark.parametrize("action_space", [spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32)],
                         ids=["discrete", "continuous"])
def test_a_batched_unroll_with_resets_matches_stepping_one_observation_at_a_time(action_space):
    torch.manual_seed(0)
    model = build_model(OBS, action_space, lstm=8, normalize_obs=True, normalize_value=True)
    T, B = 7, 4
    obs = torch.randn(T, B, 3)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[2, 0] = starts[5, 0] = starts[3, 2] = starts[0, 3] = True  # episodes end inside
    state = torch.randn(B, model.state_size)
    actions = torch.stack([model.act_recurrent(obs[t], state, starts[t])[0] for t in range(T)])

    logp, entropy, values, final = model.evaluate_recurrent(obs, actions, state, starts)

    h = state
    for t in range(T):  # the slow reference: one step at a time, reset by hand
        h = torch.where(starts[t].unsqueeze(-1), torch.zeros_like(h), h)
        x = model.features(obs[t])
        hidden, cell = model.core(x, (h[:, :8], h[:, 8:]))
        h = torch.cat([hidden, cell], -1)
        params, value = model.policy_head(hidden), model.value_head(hidden).squeeze(-1)
        step_logp, step_entropy = model._score(params, actions[t])
        torch.testing.assert_close(logp[t], step_logp)
        torch.testing.assert_close(entropy[t], step_entropy)
        torch.testing.assert_close(values[t], value)
    torch.testing.assert_close(final, h)


def test_a_start_resets_the_state_whatever_it_was():
    model = build_model(OBS, spaces.Discrete(2), lstm=4)
    obs = torch.randn(2, 3)
    starts = torch.tensor([True, True])
    a = model.step(obs, torch.randn(2, model.state_size), starts)
    b = model.step(obs, model.initial_state(2), starts)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)


def test_a_model_without_a_core_is_not_recurrent():
    model = build_model(OBS, spaces.Discrete(2))
    assert not model.is_recurrent and model.state_size == 0
