"""`a3c export` and a3c.export: the exported ONNX and TorchScript policies act as
`A3C.predict` does and output the model's logits (or Gaussian means and stds), values and
recurrent states, for the kinds of observations and actions the model takes; bad input is
a one-line error. The models are built untrained, with normalization statistics moved
away from their initial values so that the export must carry them."""
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from a3c import A3C
from a3c.envs import make_env
from a3c.envs.spaces import obs_to_torch, stack_obs
from a3c.export import ExportError, export, fold_popart
from a3c.models.normalize import PopArt

from conftest import assert_one_line_error

ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install -e '.[export]'")
pytest.importorskip("onnxscript", reason="the export extra: pip install -e '.[export]'")

# Running a TorchScript file is what its format is for; that torch deprecates it, the docs say.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[1]
OLD_RUN = ROOT / "tests" / "data" / "run-saved-before-the-move"  # CartPole, normalized observations and PopArt
FORMATS = ["onnx", "torchscript"]


# ------------------------------------------------------------ environments, as users write them
class Frames(gym.Env):
    """Small camera frames, [10, 10, 4] bytes channels last, and three actions numbered
    from 1."""

    observation_space = spaces.Box(0, 255, (10, 10, 4), np.uint8)
    action_space = spaces.Discrete(3, start=1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class Rooms(gym.Env):
    """A Dict observation (a room number, a position, a small map) and two action
    components, the second numbered from -1."""

    observation_space = spaces.Dict({"room": spaces.Discrete(3), "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
                                     "map": spaces.Box(0, 255, (6, 6, 1), np.uint8)})
    action_space = spaces.MultiDiscrete([2, 3], start=[0, -1])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


class Thrusters(gym.Env):
    """Continuous actions bounded to [-1, 1] on two thrusters."""

    observation_space = spaces.Box(-5.0, 5.0, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.normal(size=3).astype(np.float32), {}

    def step(self, action):
        return self.np_random.normal(size=3).astype(np.float32), 0.0, False, False, {}


class Doors(gym.Env):
    """Four doors, some locked at each step: the observation says which are open in its
    "action_mask" entry (1: open)."""

    observation_space = spaces.Dict({"observation": spaces.Box(-1.0, 1.0, (4,), np.float32),
                                     "action_mask": spaces.MultiBinary(4)})
    action_space = spaces.Discrete(4)

    def _obs(self):
        mask = self.np_random.integers(0, 2, 4).astype(np.int8)
        mask[self.np_random.integers(1, 4)] = 1  # door 0 is often locked, another always open
        return {"observation": self.np_random.uniform(-1, 1, 4).astype(np.float32), "action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.0, False, False, {}


NORMALIZED = {"model__normalize_obs": True, "model__normalize_value": True, "logging__progress": False}


def agent_for(env, **overrides):
    """An untrained agent on `env` (a registered id or a factory), its normalization
    statistics moved away from the identity."""
    if isinstance(env, str):
        agent = A3C({"env": {"id": env}}, **NORMALIZED, **overrides)
    else:
        agent = A3C({"env": {"id": env.__name__}}, env=env, **NORMALIZED, **overrides)
    model, batch = agent.model, observations(agent, 64)
    with torch.no_grad():
        if model.obs_norm is not None:
            model.obs_norm.update({k: v.float() * 3 + 1 for k, v in batch.items()} if isinstance(batch, dict)
                                  else batch.float() * 3 + 1)
        model.popart.update(torch.randn(256, generator=torch.Generator().manual_seed(0)) * 10 + 5)
    return agent


def observations(agent, n, seed=0):
    """`n` observations of the agent's environment, as its model reads them (a batch of
    tensors), from episodes of random actions."""
    env = make_env(agent.config.env, env_factory=agent.env_factory)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    seen = []
    for _ in range(n):
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return obs_to_torch(stack_obs(seen, env.observation_space))


def as_numpy(obs):
    """A batch of observations as predict takes it: an array, or one per leaf."""
    return {k: v.numpy() for k, v in obs.items()} if isinstance(obs, dict) else obs.numpy()


def as_inputs(obs, state=None) -> dict[str, np.ndarray]:
    """A batch of observations as the exported policy's named inputs."""
    inputs = as_numpy(obs) if isinstance(obs, dict) else {"obs": obs.numpy()}
    return inputs if state is None else {**inputs, "state": np.asarray(state, np.float32)}


def load_exported(path):
    """The exported policy as a function of named inputs to named outputs, run by
    onnxruntime, or by torch.jit alone."""
    if Path(path).suffix == ".onnx":
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        return lambda inputs: dict(zip(names, session.run(None, inputs)))
    module = torch.jit.load(str(path))
    return lambda inputs: {name: out.numpy() for name, out in module(*map(torch.from_numpy, inputs.values())).items()}


def run_exported(path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return load_exported(path)(inputs)


def exported(agent, fmt, tmp_path):
    return export(agent, tmp_path / f"policy.{fmt}", format=fmt)


def assert_matches_the_model(out, params, value, model):
    """The exported sampling outputs and value are the model's: logits, or the Gaussian's
    mean and std."""
    if model.is_continuous:
        with torch.no_grad():
            dist = model.dist(params)
        np.testing.assert_allclose(out["mean"], dist.mean.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(out["std"], dist.stddev.numpy(), rtol=0, atol=1e-5)
    else:
        np.testing.assert_allclose(out["logits"], params.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(out["value"], value.numpy(), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------ the policies
CASES = {"mlp": "CartPole-v1", "cnn": Frames, "dict": Rooms, "gaussian": Thrusters}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(CASES))
def test_the_exported_policy_acts_as_predict_and_outputs_the_models_logits_and_value(case, fmt, tmp_path):
    agent = agent_for(CASES[case])
    if case == "gaussian":  # means beyond the bounds: the greedy action must be clipped as predict clips it
        with torch.no_grad():
            agent.model.policy_head.bias.copy_(torch.tensor([3.0, -0.2]))
    obs = observations(agent, 7, seed=1)  # a batch of another size than the export traced
    out = run_exported(exported(agent, fmt, tmp_path), as_inputs(obs))
    expected, _ = agent.predict(as_numpy(obs))
    np.testing.assert_allclose(out["action"], expected, rtol=0, atol=1e-5)
    assert out["action"].dtype == expected.dtype
    with torch.no_grad():
        params, value = agent.model(obs)
    assert_matches_the_model(out, params, value, agent.model)
    if case == "gaussian":
        assert out["action"][:, 0].max() == 1.0 and out["mean"][:, 0].min() > 1.0


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_exported_recurrent_policy_carries_its_state_as_predict_does(fmt, tmp_path):
    agent = agent_for("CartPole-v1", model__lstm=16)
    policy = load_exported(exported(agent, fmt, tmp_path))
    state = np.zeros((1, agent.model.state_size), np.float32)  # the start of an episode
    predicted_state = None
    for obs in observations(agent, 10):  # one at a time, each from the state the last one left
        obs = obs[None]
        out = policy(as_inputs(obs, state))
        action, predicted_state_next = agent.predict(obs.numpy(), state=predicted_state)
        with torch.no_grad():
            params, value, _ = agent.model.step(obs, torch.from_numpy(state), torch.zeros(1, dtype=torch.bool))
        np.testing.assert_array_equal(out["action"], action)
        assert_matches_the_model(out, params, value, agent.model)
        np.testing.assert_allclose(out["next_state"], predicted_state_next, rtol=0, atol=1e-5)
        state, predicted_state = out["next_state"], predicted_state_next
    assert np.abs(state).max() > 0.01  # the state moved: it was carried, not reset


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_exported_masked_policy_never_chooses_a_masked_action(fmt, tmp_path):
    agent = agent_for(Doors)
    if getattr(agent.model, "mask_key", None) is None:
        pytest.skip("ActorCritic reads no action masks yet (model.mask_key)")
    with torch.no_grad():  # the unmasked policy prefers door 0 above all
        agent.model.policy_head.bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))
    obs = observations(agent, 40, seed=2)
    mask = obs["action_mask"].numpy().astype(bool)
    assert not mask[:, 0].all() and mask[:, 0].any()
    out = run_exported(exported(agent, fmt, tmp_path), as_inputs(obs))
    assert mask[np.arange(len(mask)), out["action"]].all()
    assert (out["action"][mask[:, 0]] == 0).all()  # where door 0 is open, the greedy policy takes it
    assert np.isneginf(out["logits"][~mask]).all() and np.isfinite(out["logits"][mask]).all()
    expected, _ = agent.predict(as_numpy(obs))
    np.testing.assert_array_equal(out["action"], expected)
    with torch.no_grad():
        params, value = agent.model(obs)
    assert_matches_the_model(out, params, value, agent.model)


def test_a_folded_popart_layer_outputs_what_the_layer_does():
    layer = PopArt(5)
    layer.update(torch.randn(100) * 7 - 3)
    x = torch.randn(4, 5)
    with torch.no_grad():
        torch.testing.assert_close(fold_popart(layer)(x), layer(x), rtol=0, atol=1e-5)


def test_export_leaves_the_agents_own_model_as_it_was(tmp_path):
    agent = agent_for("CartPole-v1")
    before = {name: value.clone() for name, value in agent.model.state_dict().items()}
    export(agent, tmp_path / "policy.pt", format="torchscript")
    assert agent.model.popart is not None and agent.model.training
    for name, value in agent.model.state_dict().items():
        assert torch.equal(value, before[name]), name


# --------------------------------------------------------------------- run folders, the CLI
@pytest.fixture
def old_run(tmp_path):
    return Path(shutil.copytree(OLD_RUN, tmp_path / "run"))


@pytest.fixture
def a3c_export(a3c_in_process):
    """`a3c export ...` run in this process: (exit code, stdout, stderr)."""
    return lambda *args: a3c_in_process("export", *args)


def test_a3c_export_writes_the_runs_last_checkpoint_as_onnx_beside_it(old_run, a3c_export):
    code, out, err = a3c_export(old_run, "--format", "onnx")
    assert code == 0, err
    path = old_run / "checkpoint.onnx"
    assert str(path) in out
    agent = A3C.load(old_run)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    expected, _ = agent.predict(obs)
    np.testing.assert_array_equal(run_exported(path, {"obs": obs})["action"], expected)


def test_best_exports_the_runs_best_checkpoint(old_run, tmp_path):
    shutil.copy(old_run / "checkpoint.pt", old_run / "best.pt")
    (old_run / "checkpoint.pt").unlink()  # so that only best.pt can have been read
    path = export(old_run, format="torchscript", best=True)
    assert path == old_run / "best.torchscript.pt" and path.is_file()
    to = export(old_run, tmp_path / "elsewhere" / "best.pt", format="torchscript", best=True)
    assert to.is_file()


def test_an_unknown_format_is_a_one_line_error(old_run, a3c_export):
    code, _, err = a3c_export(old_run, "--format", "tflite")
    assert_one_line_error(code, err, "unknown export format 'tflite'", "onnx or torchscript")
    assert sorted(p.name for p in old_run.iterdir()) == ["checkpoint.pt", "config.yaml"]  # nothing written


def test_a_missing_run_folder_is_a_one_line_error(tmp_path, a3c_export):
    code, _, err = a3c_export(tmp_path / "no-such-run")
    assert_one_line_error(code, err, "no run folder or checkpoint file at", "no-such-run")


def test_best_without_best_pt_is_a_one_line_error(old_run, a3c_export):
    code, _, err = a3c_export(old_run, "--best")
    assert_one_line_error(code, err, "no best.pt in", "evaluated while training")
    assert sorted(p.name for p in old_run.iterdir()) == ["checkpoint.pt", "config.yaml"]


def test_an_agent_without_a_path_is_an_error():
    with pytest.raises(ExportError, match="needs a path"):
        export(agent_for("CartPole-v1"))


def test_writing_over_the_checkpoint_being_exported_is_an_error(old_run):
    with pytest.raises(ExportError, match="is the checkpoint being exported"):
        export(old_run, old_run / "checkpoint.pt", format="torchscript")
    assert A3C.load(old_run).model is not None  # still a checkpoint


def test_an_observation_leaf_named_like_an_output_is_an_error(tmp_path):
    from a3c.models import ActorCritic

    space = spaces.Dict({"value": spaces.Box(-1.0, 1.0, (2,), np.float32), "x": spaces.Discrete(2)})
    with pytest.raises(ExportError, match=r"leaves \['value'\]"):
        export(ActorCritic(space, spaces.Discrete(2)), tmp_path / "policy.onnx")
    assert not list(tmp_path.iterdir())
