"""Running statistics: observation normalisation merged batch by batch, and PopArt's
value normalisation, each against a slow reference."""
import threading
import time

import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c.models import ActorCritic
from a3c.models.normalize import ObservationNorm, PopArt, merge_moments
from waiting import wait_until


def test_statistics_merged_batch_by_batch_equal_those_of_all_samples_at_once():
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=3.0, scale=s, size=(n, 3)) for n, s in [(1, 1.0), (7, 5.0), (64, 0.1)]]
    count, mean, var = 0.0, torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for batch in batches:
        count, mean, var = merge_moments(count, mean, var, torch.from_numpy(batch))
    everything = np.concatenate(batches)
    assert count == len(everything)
    np.testing.assert_allclose(mean.numpy(), everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), everything.var(0), rtol=1e-12)


def test_observation_statistics_from_several_learner_threads_merge_to_the_whole_stream():
    """Learners update the shared statistics under one lock; the result is the same as
    one pass over every observation, whatever the order."""
    norm = ObservationNorm((2,))
    rng = np.random.default_rng(1)
    batches = [rng.uniform(-50, 50, size=(int(rng.integers(1, 40)), 2)).astype(np.float32)
               for _ in range(40)]
    lock = threading.Lock()

    def learner(mine):
        for batch in mine:
            with lock:
                norm.update(torch.from_numpy(batch))

    threads = [threading.Thread(target=learner, args=(batches[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = np.concatenate(batches).astype(np.float64)
    assert int(norm.count) == len(everything)
    np.testing.assert_allclose(norm.mean.numpy(), everything.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), everything.var(0), rtol=1e-5)
    x = torch.from_numpy(everything[:5].astype(np.float32))
    expected = np.clip((everything[:5] - everything.mean(0)) / np.sqrt(everything.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_normalized_observations_are_clipped():
    norm = ObservationNorm((1,), clip=5.0)
    norm.update(torch.tensor([[-1.0], [1.0]]))
    assert norm(torch.tensor([[1e6], [-1e6]])).flatten().tolist() == [5.0, -5.0]


def reference_popart(targets_per_update, beta):
    """Debiased exponential moving averages of E[x] and E[x^2], written out."""
    first = second = debias = 0.0
    for targets in targets_per_update:
        first = beta * first + (1 - beta) * np.mean(targets)
        second = beta * second + (1 - beta) * np.mean(np.square(targets))
        debias = beta * debias + (1 - beta)
    mean = first / debias
    return mean, np.sqrt(max(second / debias - mean**2, 1e-4))


def test_popart_statistics_are_the_debiased_moving_averages_of_the_targets():
    layer = PopArt(4, beta=0.9)
    assert [float(x) for x in layer.stats()] == [0.0, 1.0]  # before the first update
    rng = np.random.default_rng(2)
    updates = [rng.normal(-300.0, 40.0, size=32) for _ in range(25)]
    for targets in updates:
        layer.update(torch.from_numpy(targets))
    mean, std = layer.stats()
    ref_mean, ref_std = reference_popart(updates, 0.9)
    assert float(mean) == pytest.approx(ref_mean, rel=1e-5)
    assert float(std) == pytest.approx(ref_std, rel=1e-4)


def test_popart_update_preserves_the_values_it_outputs():
    torch.manual_seed(3)
    layer = PopArt(8, beta=0.5)
    features = torch.randn(16, 8)
    for targets in ([-500.0, -480.0], [3.0, 2000.0], [0.0, 0.0]):
        before = layer(features).detach().clone()
        layer.update(torch.tensor(targets))
        torch.testing.assert_close(layer(features), before, rtol=1e-4, atol=1e-3)


def test_value_targets_of_hundreds_weigh_like_unit_targets_in_the_loss():
    """With PopArt the value error is divided by the targets' std: the same relative
    error gives the same value loss at any scale of return."""
    from a3c.learners.batch import batch_from_fragments
    from a3c.learners.loss import compute_loss
    from a3c.actors.loop import fragment_dtype
    from a3c.config import load_config

    obs_space, action_space = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    cfg = load_config({"learners": {"batch_size": 2, "minibatches": 1}, "actors": {"queue_capacity": 4}})
    losses = []
    for scale in (1.0, 300.0):
        torch.manual_seed(4)
        model = ActorCritic(obs_space, action_space, normalize_value=True)
        torch.nn.init.zeros_(model.value_head.weight)  # every value is then linear in `scale`
        torch.nn.init.zeros_(model.value_head.bias)
        f = np.zeros(2, fragment_dtype(obs_space, action_space, 5))
        f["obs"] = np.random.default_rng(5).uniform(-1, 1, f["obs"].shape)
        f["reward"] = -scale
        f["terminated"][:, -1] = True
        batch = batch_from_fragments(f)
        model.popart.update(torch.full((10,), -2.0 * scale))  # targets seen so far
        model.popart.update(torch.full((10,), -4.0 * scale))
        losses.append(float(compute_loss(model, batch, cfg).stats.value))
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_models_normalize_only_vector_observations():
    image = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2),
                       normalize_obs=True).obs_norm is not None
    assert ActorCritic(image, spaces.Discrete(6), normalize_obs=True).obs_norm is None
    assert ActorCritic(spaces.Discrete(5), spaces.Discrete(2), normalize_obs=True).obs_norm is None
    assert ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)).popart is None


def test_normalizer_statistics_are_in_the_state_dict():
    model = ActorCritic(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2),
                        normalize_obs=True, normalize_value=True)
    keys = set(model.state_dict())
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count", "value_head.first",
            "value_head.second", "value_head.debias"} <= keys


def test_learner_threads_of_one_model_update_its_statistics_one_at_a_time(monkeypatch):
    """run_learner takes the model's statistics lock however it is started: an update
    that pauses midway (as a thread switch could) never overlaps another learner's."""
    from a3c.actors.loop import fragment_dtype
    from a3c.config import load_config
    from a3c.learners.updater import step_queue
    from a3c.learners.workers import run_learner
    from a3c.learners.optim import SharedAdam
    from a3c.trainer import COUNTERS, TIMERS
    from replay import ArrayQueue, Counters

    obs_space, action_space = spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2)
    model = ActorCritic(obs_space, action_space, normalize_obs=True, normalize_value=True)
    model.share_memory()
    cfg = load_config({"learners": {"batch_size": 2, "epochs": 1, "minibatches": 1}})
    inside, overlaps, updates = [], [], []
    original = ObservationNorm.update

    def pausing_update(self, obs):
        overlaps.append(len(inside))
        inside.append(1)
        time.sleep(0.005)  # lets another learner thread run here
        original(self, obs)
        inside.pop()
        updates.append(len(obs))

    monkeypatch.setattr(ObservationNorm, "update", pausing_update)
    fragments = ArrayQueue(64, fragment_dtype(obs_space, action_space, 3))
    counters, stop, steps = Counters(COUNTERS, TIMERS), threading.Event(), step_queue()
    threads = [threading.Thread(target=run_learner,
                                args=(cfg, model, SharedAdam(model.parameters(), 1e-3), fragments,
                                      counters, steps, stop))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    batch = np.zeros(24, fragments.dtype)
    batch["obs"] = np.random.default_rng(0).uniform(-1, 1, batch["obs"].shape)
    fragments.put_many(batch)
    wait_until(lambda: len(updates) == 12, what="12 statistics updates")
    stop.set()
    fragments.close()
    for thread in threads:
        thread.join(10)
    counters.close()
    steps.close()
    assert overlaps == [0] * 12
    assert int(model.obs_norm.count) == 24 * 3
