"""The learner on an accelerator (`learners.device: cuda`): learner threads train a
`DeviceCopy` of the shared model, with no wait for the device inside a gradient step, and
publish it to the shared model the actors read every `learners.publish_every` steps.

The logic is the device's on any device, so it is checked here on the CPU: a batch moved
whole and cut into fields equals one copied field by field; a learner training a copy
ends exactly where one training the shared model ends; a non-finite loss skipped on the
device changes nothing. Where CUDA is visible, a run trains on it and a batch's waits for
the device do not grow with its gradient steps (skipped, with the reason, elsewhere)."""
import copy
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c.actors.loop import fragment_dtype
from a3c.config import ConfigError, load_config
from a3c.learners.batch import Batch, batch_from_fragments
from a3c.learners.source import _records
from a3c.learners.updater import Updater, step_queue
from a3c.learners.workers import DeviceCopy
from a3c.models import ActorCritic
from a3c.learners.optim import build_optimizer
from a3c.trainer import COUNTERS, TIMERS
from replay import Counters

OBS, ACTIONS, T, B = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), 4, 4
ROOT = Path(__file__).resolve().parents[1]
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device is visible")


def config(**learners):
    return load_config({"learners": {"batch_size": B, "epochs": 2, "minibatches": 1, **learners},
                        "optim": {"lr_schedule": "constant"}})


def random_records(dtype: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    """n records with every leaf field drawn at random for its type."""
    records = np.zeros(n, dtype)

    def fill(array):
        if array.dtype.names:
            for name in array.dtype.names:
                fill(array[name])
        elif array.dtype == np.bool_:
            array[...] = rng.random(array.shape) < 0.5
        elif np.issubdtype(array.dtype, np.integer):
            array[...] = rng.integers(0, 100, array.shape)
        else:
            array[...] = rng.normal(size=array.shape)
    fill(records)
    return records


SPACES = {
    "box": (OBS, ACTIONS, 0),
    "image": (spaces.Box(0, 255, (10, 10, 3), np.uint8), spaces.MultiBinary(3), 0),
    "dict": (spaces.Dict({"pos": spaces.Box(-1, 1, (2,)), "grid": spaces.Box(0, 1, (5, 5, 2), np.uint8),
                          "key": spaces.Discrete(3)}), spaces.MultiDiscrete([3, 2]), 0),
    "recurrent": (OBS, spaces.Box(-1, 1, (2,)), 6),
}


def leaves(batch: Batch):
    for name, field in zip(Batch._fields, batch):
        for key, value in (field.items() if isinstance(field, dict) else [("", field)]):
            yield f"{name}{'.' + key if key else ''}", value


@pytest.mark.parametrize("n", [1, B])  # one record: a contiguous slice at an odd offset
@pytest.mark.parametrize("space", SPACES)
def test_a_batch_moved_whole_and_cut_into_fields_equals_one_copied_field_by_field(space, n):
    obs_space, action_space, state_size = SPACES[space]
    records = random_records(fragment_dtype(obs_space, action_space, T, state_size), n,
                             np.random.default_rng(0))
    by_field = dict(leaves(batch_from_fragments(records, whole=False)))
    whole = dict(leaves(batch_from_fragments(records, whole=True)))
    assert by_field.keys() == whole.keys()
    for name, expected in by_field.items():
        if expected is None:
            assert whole[name] is None, name
            continue
        assert whole[name].dtype == expected.dtype and whole[name].shape == expected.shape, name
        assert torch.equal(whole[name], expected), name


def batches(n, seed=0, reward=None):
    """n batches of B random fragments acted by policy version 0 (rewards: `reward` if given)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, B), fragment_dtype(OBS, ACTIONS, T))
    out["obs"] = rng.uniform(-1, 1, out["obs"].shape)
    out["last_obs"] = rng.uniform(-1, 1, out["last_obs"].shape)
    out["reward"] = rng.normal(size=out["reward"].shape) if reward is None else reward
    out["action"] = rng.integers(0, 2, out["action"].shape)
    out["logp"] = np.log(0.5)
    return out


def tiny_model():
    torch.manual_seed(0)
    return ActorCritic(OBS, ACTIONS, hidden_sizes=(8,), normalize_obs=True, normalize_value=True)


class Run:
    """An Updater on a tiny shared model, or on a DeviceCopy of it (on the CPU)."""

    def __init__(self, cfg, on_copy: bool):
        self.shared = tiny_model()
        self.optimizer = build_optimizer(self.shared, cfg.optim)  # as the trainer builds it
        self.counters, self.steps = Counters(COUNTERS, TIMERS), step_queue()
        self.copy = DeviceCopy(cfg, self.shared, self.optimizer, device="cpu") if on_copy else None
        model, optimizer = (self.copy.model, self.copy.optimizer) if on_copy else (self.shared, self.optimizer)
        self.updater = Updater(cfg, model, optimizer, self.counters, self.steps, threading.Lock(),
                               publish=self.copy.publish if on_copy else None)

    def train(self, records):
        """One fresh batch, made as a learner makes it for its device."""
        self.updater.train(batch_from_fragments(records, self.updater.device), True)

    def close(self):
        self.counters.close()
        self.steps.close()


@pytest.fixture
def runs():
    made = []
    yield lambda *args: made.append(Run(*args)) or made[-1]
    for run in made:
        run.close()


def assert_same(mine: dict, theirs: dict, what: str):
    for (name, a), b in zip(mine.items(), theirs.values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=lambda m, name=name: f"{what} {name}: {m}")


@pytest.mark.parametrize("split", ["fragments", "steps"])
def test_a_learner_training_a_device_copy_ends_where_one_training_the_shared_model_ends(runs, split):
    """The same batches: the copy's parameters, statistics and Adam moments equal the
    direct learner's; the shared model receives them at a publish (every 3 steps here:
    after 10 steps it lags, until the learner's last publish), and the policy version
    counts every step once published."""
    cfg = config(publish_every=3, minibatch_split=split)
    direct, device = runs(cfg, False), runs(cfg, True)
    for i, records in enumerate(batches(5)):  # 10 gradient steps
        for run in (direct, device):
            torch.manual_seed(i)  # the same minibatches of steps for both
            run.train(records)
    assert_same(direct.shared.state_dict(), device.copy.model.state_dict(), "copy")
    for name, tensors in direct.optimizer.state.items():
        for a, b in zip(tensors, device.copy.optimizer.state[name], strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=0, msg=f"optimizer {name}")
    assert device.counters["updates"] == direct.counters["updates"] == 10
    assert device.counters["policy_version"] == 9  # 3 publishes of 3 steps
    assert not torch.equal(device.shared.policy_head.weight, device.copy.model.policy_head.weight)
    device.updater.flush()  # what run_learner does as it ends
    assert device.counters["policy_version"] == 10
    assert_same(direct.shared.state_dict(), device.shared.state_dict(), "shared")
    assert len(device.steps.get_many(100, block=False)) == 10  # every step reported


def test_target_kl_ends_the_same_passes_on_a_device_copy_as_on_the_shared_model(runs):
    cfg = config(publish_every=3, minibatches=2, target_kl=1e-4)
    cfg.optim.lr = 0.05  # steps that move the policy past the bound
    direct, device = runs(cfg, False), runs(cfg, True)
    for i, records in enumerate(batches(5)):
        for run in (direct, device):
            torch.manual_seed(i)
            run.train(records)
    assert direct.counters["kl_stops"] == device.counters["kl_stops"] > 0
    assert direct.counters["updates"] == device.counters["updates"] < 5 * 4
    device.updater.flush()
    assert_same(direct.shared.state_dict(), device.shared.state_dict(), "shared")


def test_with_synchronous_actors_a_device_learner_publishes_each_batch_before_counting_it(runs):
    """Synchronous actors act once a fresh batch is counted: by then the shared model
    must be the copy's, though 2 steps a batch do not fill a publish of 3."""
    def load(sync):
        return load_config({"learners": {"batch_size": B, "epochs": 2, "minibatches": 1, "publish_every": 3},
                            "actors": {"num": 1, "envs_per_actor": B, "sync": sync},
                            "optim": {"lr_schedule": "constant"}})

    class Watched:  # the counters, looking at the shared model as a fresh batch is counted
        def __init__(self, counters):
            self.counters, self.published = counters, []

        def __getitem__(self, name):
            return self.counters[name]

        def add(self, name, value=1):
            if name == "fresh_batches":
                self.published.append(all(torch.equal(a, b) for a, b in zip(
                    run.copy.model.state_dict().values(), run.shared.state_dict().values(), strict=True)))
            self.counters.add(name, value)

    run, unsynced = runs(load(True), True), runs(load(False), True)
    run.updater.counters = watched = Watched(run.counters)
    for records in batches(2):
        run.train(records)
        unsynced.train(records)
    assert watched.published == [True, True]
    assert run.counters["fresh_batches"] == unsynced.counters["fresh_batches"] == 2
    assert run.counters["policy_version"] == 4 and unsynced.counters["policy_version"] == 3


def test_a_non_finite_loss_on_the_device_is_skipped_there_changes_nothing_and_is_counted(runs):
    run = runs(config(), True)
    before = copy.deepcopy(run.copy.model.state_dict())
    run.train(batches(1, reward=np.nan)[0])
    after = run.copy.model.state_dict()
    for name, value in before.items():
        if "obs_norm" not in name:  # observations are finite, and counted before any step
            torch.testing.assert_close(after[name], value, rtol=0, atol=0, msg=name)
    assert all((t == 0).all() for name, ts in run.copy.optimizer.state.items() if name != "step" for t in ts)
    assert run.counters["nonfinite_losses"] == 2 and run.counters["updates"] == 0


def test_process_learners_on_cuda_are_refused_with_what_to_use():
    with pytest.raises(ConfigError, match="learners.mode: process with learners.device 'cuda' is not supported"):
        load_config({"learners": {"mode": "process", "device": "cuda"}})


@CUDA
def test_a_batch_on_cuda_waits_for_the_device_no_more_often_with_more_gradient_steps(runs):
    """Waits for the device (torch's sync debug mode counts them) per batch with 2 and
    with 16 gradient steps: the same number, so none is inside a step. The batches lie
    in pinned memory, as a learner's do."""
    def waits(cfg):
        shared = tiny_model()
        copy_ = DeviceCopy(cfg, shared, build_optimizer(shared, cfg.optim))
        counters, steps = Counters(COUNTERS, TIMERS), step_queue()
        try:
            updater = Updater(cfg, copy_.model, copy_.optimizer, counters, steps, threading.Lock(),
                              publish=copy_.publish)
            data = _records(2 * B, batches(1).dtype, pinned=True).reshape(2, B)
            data[...] = batches(2)
            updater.train(batch_from_fragments(data[0], "cuda"), True)  # warm up: allocations, the first publish
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                updater.train(batch_from_fragments(data[1], "cuda"), True)
            return sum("synchroniz" in str(w.message) for w in caught)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            counters.close()
            steps.close()

    few = waits(config(device="cuda", epochs=1, minibatches=2, publish_every=1000))
    many = waits(config(device="cuda", epochs=4, minibatches=4, publish_every=1000))
    assert many == few, f"{few} waits with 2 gradient steps, {many} with 16"


@CUDA
def test_cartpole_trains_with_the_learner_on_cuda_and_its_checkpoint_loads(tmp_path):
    """The shared model (what actors read and the checkpoint holds) receives what the
    GPU learner learned: a short run ends above a random policy's return of about 22."""
    from a3c import A3C
    from a3c.api import evaluate
    agent = A3C(ROOT / "configs" / "cartpole.yaml", learners__device="cuda", total_timesteps=30_000,
                logging__run_root=str(tmp_path), logging__progress=False)
    agent.learn()
    assert agent.num_timesteps >= 30_000 and agent.counters["updates"] > 0
    loaded = A3C.load(agent.run_dir)
    assert all(p.device.type == "cpu" for p in loaded.model.parameters())
    assert evaluate(loaded.model, loaded.config, episodes=5).mean() > 50


def test_a_checkpoint_holds_the_proximal_average_the_device_learners_moved(tmp_path):
    """The average of learners.proximal_decay lives beside the device copy, where the
    learners move it; a checkpoint reads it back from there, as it reads the weights."""
    from a3c.checkpoint import load_checkpoint
    from a3c.trainer import Trainer
    cfg = load_config(ROOT / "configs" / "cartpole.yaml", {"learners.proximal_decay": 0.9})
    trainer = Trainer(cfg, tmp_path)
    try:
        trainer.device_copy = DeviceCopy(cfg, trainer.model, trainer.optimizer, device="cpu",
                                         average=trainer.average)
        with torch.no_grad():
            for p in trainer.device_copy.average.parameters():
                p.add_(1.0)  # as the learners' steps move it
        trainer.save(tmp_path / "checkpoint.pt")
    finally:
        trainer.counters.close()
    saved = load_checkpoint(tmp_path / "checkpoint.pt")["proximal"]
    assert_same(trainer.device_copy.average.state_dict(), saved, "average")
    assert not torch.equal(saved["policy_head.weight"], trainer.model.policy_head.weight)
