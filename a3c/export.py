"""Export a trained policy to a file that runs without this project: ONNX (for
onnxruntime, or any ONNX runtime) or TorchScript (for torch alone).

    export("runs/cartpole-20261201-101500", format="onnx")   # -> runs/.../checkpoint.onnx
    export(agent, "cartpole.pt", format="torchscript")        # an A3C agent, or its model

The exported policy is the model's forward pass and nothing else, so it acts as
`A3C.predict` does: observation normalization, PopArt's value scale and the masking of
invalid actions are inside it. Every input and output has a batch axis first, of any size.

Inputs, in this order (ONNX names them; a TorchScript module takes them positionally):

    obs          a plain observation space's batch [N, *shape], in the space's dtype
                 (float32; uint8 images; int64 for Discrete)
    <leaf path>  for a Dict or Tuple observation, one input per leaf, named by its path
                 ("image", "goal.position", "0") in the space's order; a masked policy's
                 "action_mask" (int8 [N, n], 1 where an action is valid) is one of them
    state        a recurrent model's state [N, state_size] (float32): zeros at the start
                 of an episode, then the previous step's next_state

Outputs, in this order (a TorchScript module returns them as a dict):

    action       the greedy action as the environment takes it: a Discrete or
                 MultiDiscrete space's `start` added, a Box action clipped to the bounds
                 (as a3c.envs.env_action does for predict)
    logits       discrete actions (Discrete, MultiDiscrete side by side, MultiBinary):
                 the logits to sample from, -inf where masked; add `start` to a sample
    mean, std    a Box action space: the Gaussian to sample from; clip a sample
    value        the value of each observation [N]
    next_state   a recurrent model: the state to pass with the next observation
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import warnings
from pathlib import Path

import gymnasium as gym
import torch
import torch.nn as nn

from .api import A3C
from .checkpoint import latest_checkpoint
from .envs.spaces import is_composite, leaves, obs_to_torch, stack_obs
from .evaluator import existing_best
from .files import write_atomically
from .models.normalize import PopArt

__all__ = ["FORMATS", "ExportError", "ExportedPolicy", "export", "export_model", "fold_popart", "input_names",
           "output_names"]


class ExportError(ValueError):
    """An export asked for in a way that cannot be done: an unknown format, a run folder
    that is not there, a model of another interface, a file that would overwrite the
    checkpoint. (A missing or unreadable checkpoint is a CheckpointError, as for
    `A3C.load`.)"""


def input_names(model: nn.Module) -> list[str]:
    """The exported policy's inputs: the observation (or each leaf of it), then a recurrent
    model's state."""
    space = model.observation_space
    names = [path for path, _ in leaves(space)] if is_composite(space) else ["obs"]
    return names + (["state"] if model.is_recurrent else [])


def output_names(model: nn.Module) -> list[str]:
    """The exported policy's outputs: the greedy action, what to sample one from, the
    value, then a recurrent model's next state."""
    sampling = ["mean", "std"] if model.is_continuous else ["logits"]
    return ["action", *sampling, "value"] + (["next_state"] if model.is_recurrent else [])


def fold_popart(layer: PopArt) -> nn.Linear:
    """A plain linear layer that outputs what a PopArt layer does now: (w x + b) std + mean
    = (w std) x + (b std + mean). Its statistics become constants, where PopArt's read of
    them would branch on their values (which torch.export cannot trace)."""
    mean, std = layer.stats()
    folded = nn.Linear(layer.in_features, layer.out_features)
    with torch.no_grad():
        folded.weight.copy_(layer.weight * std)
        folded.bias.copy_(layer.bias * std + mean)
    return folded


def frozen(model: nn.Module) -> nn.Module:
    """A copy of `model` on the CPU for inference, with PopArt folded into its value layer;
    the model itself is not changed (a training run may still be using it)."""
    model = copy.deepcopy(model).cpu()
    if hasattr(model, "precision"):  # an exported graph runs in float32, without autocast
        model.precision = "float32"
    if getattr(model, "popart", None) is not None:
        model.value_head = fold_popart(model.value_head)
    return model.eval().requires_grad_(False)


class ExportedPolicy(nn.Module):
    """The model's forward pass as a function of plain tensors (see the module's doc): the
    observation's leaves (and a recurrent state) in, a dict of named outputs out."""

    def __init__(self, model: nn.Module):
        super().__init__()
        for needed in ("observation_space", "action_space", "head", "is_recurrent"):
            if not hasattr(model, needed):
                raise ExportError(f"the model has no {needed}: export takes a3c.models.ActorCritic "
                                  "(or a model with its interface); export a model of your own with "
                                  "torch.onnx.export")
        self.model = frozen(model)
        space = model.observation_space
        self.paths = [path for path, _ in leaves(space)] if is_composite(space) else None
        self.names = output_names(model)
        # a3c.envs.env_action's constants, for the greedy action inside the graph.
        action_space = model.action_space
        self.clips = isinstance(action_space, gym.spaces.Box)
        self.shifts = isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete))
        if self.clips:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))
        if self.shifts:
            self.register_buffer("start", torch.as_tensor(action_space.start, dtype=torch.int64))
        self.eval()  # for inference; the exporters check

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """a3c.envs.env_action in torch: a Box action clipped to the bounds, an index from 0
        shifted to the space's start."""
        if self.clips:
            return torch.minimum(torch.maximum(action, self.low), self.high)  # np.clip's order
        return action + self.start if self.shifts else action

    def forward(self, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        model = self.model
        obs = dict(zip(self.paths, inputs)) if self.paths is not None else inputs[0]
        if model.is_recurrent:
            state = inputs[-1]
            starts = torch.zeros_like(state[:, 0], dtype=torch.bool)  # the caller resets the state
            params, value, next_state = model.step(obs, state, starts)
        else:
            params, value = model(obs)
        greedy, _ = model.head.sample(params, deterministic=True)  # as predict chooses
        if model.is_continuous:
            dist = model.dist(params)
            sampling = [dist.mean, dist.stddev]
        else:
            sampling = [params]
        outputs = [self.env_action(greedy), *sampling, value] + ([next_state] if model.is_recurrent else [])
        return dict(zip(self.names, outputs))


def example_inputs(model: nn.Module, n: int = 2) -> tuple[torch.Tensor, ...]:
    """A batch of `n` observations drawn from the model's observation space (seeded: the
    same file each time), then a recurrent model's initial state: what tracing runs on.
    Their values matter to nothing but the trace."""
    space = copy.deepcopy(model.observation_space)
    space.seed(0)
    obs = obs_to_torch(stack_obs([space.sample() for _ in range(n)], space))
    leaves_in = list(obs.values()) if isinstance(obs, dict) else [obs]
    return tuple(leaves_in) + ((model.initial_state(n).cpu(),) if model.is_recurrent else ())


def _write_onnx(policy: ExportedPolicy, inputs: tuple[torch.Tensor, ...], path: Path) -> None:
    """ONNX through torch.export (torch.onnx's exporter since torch 2.9, which needs
    onnxscript; the older TorchScript-based one is deprecated), with the batch axis of
    every input and output left free."""
    import onnx  # noqa: F401  (the export extra, named by the command line if missing)
    import onnxscript  # noqa: F401

    batch = torch.export.Dim("batch")
    with _quiet("torch.onnx"):
        program = torch.onnx.export(policy, inputs, dynamo=True, verbose=False,
                                    input_names=input_names(policy.model), output_names=policy.names,
                                    dynamic_shapes=(tuple({0: batch} for _ in inputs),))  # *inputs: one tuple
    write_atomically(path, lambda file: file.write(program.model_proto.SerializeToString()))


def _write_torchscript(policy: ExportedPolicy, inputs: tuple[torch.Tensor, ...], path: Path) -> None:
    """TorchScript by tracing (strict=False: the outputs are a dict)."""
    with _quiet("torch.jit"):
        traced = torch.jit.trace(policy, inputs, strict=False)
        write_atomically(path, lambda file: torch.jit.save(traced, file))


@contextlib.contextmanager
def _quiet(package: str):
    """Hold back the notices that torch's exporters print for torch's own developers (its
    deprecations inside `package`, which was asked for by name, missing optional
    operator libraries), which a user of the exported file can do nothing about."""
    logger = logging.getLogger(package)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", "# The axis name", UserWarning)  # one batch axis, shared
            yield
    finally:
        logger.setLevel(level)


# Each format: (its writer, the suffix of a file written next to a checkpoint).
FORMATS = {"onnx": (_write_onnx, ".onnx"), "torchscript": (_write_torchscript, ".torchscript.pt")}


def check_format(format: str) -> None:
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}: use {' or '.join(FORMATS)}")


def export_model(model: nn.Module, path: str | os.PathLike, format: str = "onnx") -> Path:
    """Write `model`'s policy (see the module's doc) to `path` in `format` ("onnx" or
    "torchscript"); returns the path."""
    check_format(format)
    policy = ExportedPolicy(model)
    names = input_names(model) + policy.names
    clash = sorted({name for name in names if names.count(name) > 1})
    if clash:
        raise ExportError(f"the observation's leaves {clash} have the names of the exported policy's "
                          f"other inputs or outputs ({', '.join(names)}); rename them in the environment")
    FORMATS[format][0](policy, example_inputs(model), Path(path))
    return Path(path)


def checkpoint_of(run: str | os.PathLike, best: bool = False) -> Path:
    """The checkpoint file that a run folder (its checkpoint.pt, or with `best` its
    best.pt) or a checkpoint file names."""
    run = Path(run)
    if not run.exists():
        raise ExportError(f"no run folder or checkpoint file at {run}")
    if best:
        return existing_best(run)
    return latest_checkpoint(run) if run.is_dir() else run


def export(agent_or_run, path: str | os.PathLike | None = None, format: str = "onnx", *,
           best: bool = False, env=None) -> Path:
    """Write a policy that runs without this project (see the module's doc); returns the
    file's path.

    `agent_or_run`: an `A3C` agent (or its model), a run folder (its last checkpoint, or
    with `best` its best.pt) or a checkpoint file. `path`: where to write; by default, a
    run's checkpoint's name with the format's suffix (checkpoint.onnx,
    best.torchscript.pt). `env`: the environment factory a run was trained with, if any
    (as `A3C.load` needs it)."""
    check_format(format)
    if isinstance(agent_or_run, (str, os.PathLike)):
        checkpoint = checkpoint_of(agent_or_run, best)
        path = Path(checkpoint.with_name(checkpoint.stem + FORMATS[format][1]) if path is None else path)
        if path.resolve() == checkpoint.resolve():
            raise ExportError(f"{path} is the checkpoint being exported; write the policy to another file")
        model = A3C.load(checkpoint, env=env).model
    else:
        if best or path is None:
            raise ExportError("export(agent, path): an agent needs a path to write to; best=True "
                              "takes a run folder")
        model = getattr(agent_or_run, "model", agent_or_run)  # an A3C, or a model
    return export_model(model, path, format)
