"""Checkpoints: explicit dicts of tensors and plain values, written atomically and read
back with `weights_only=True` (no pickled objects, so loading runs no code); and what a
checkpoint must have in common with the config and model it is loaded into."""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .config import Config, ConfigError, apply_overrides, config_to_dict, load_config
from .envs.preflight import device_available
from .files import excerpt, write_atomically

__all__ = ["CheckpointError", "FORMAT", "check_compatible", "config_here", "latest_checkpoint", "load_checkpoint",
           "load_state", "save_checkpoint"]

FORMAT = "a3c-checkpoint-1"
_KEYS = {"format", "model", "optimizer", "config", "counters"}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or from another config."""


def save_checkpoint(path: str | os.PathLike, model_state: dict, optimizer_state: dict,
                    config: dict, counters: dict, proximal_state: dict | None = None) -> None:
    """Write atomically: a crash never leaves a half-written checkpoint. `proximal_state`:
    the weights of the learners' proximal average (learners.proximal_decay), if any; a
    checkpoint without it (one written before it was saved) resumes with a fresh one."""
    state = {"format": FORMAT, "model": model_state, "optimizer": optimizer_state,
             "config": config, "counters": counters, "proximal": proximal_state}
    write_atomically(path, lambda file: torch.save(state, file))


def load_checkpoint(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; pass a run folder that holds checkpoint.pt")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({type(error).__name__}: {excerpt(error)}); "
            "it may be truncated or corrupt: restore it or start a new run"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not _KEYS <= set(state):
        raise CheckpointError(f"{path} is not an a3c checkpoint (format {FORMAT} expected)")
    if state.get("proximal") is not None and not _same_shapes(state["proximal"], state["model"]):
        raise CheckpointError(f"{path}: its proximal average (learners.proximal_decay) does not match its "
                              "model's weights; the checkpoint is corrupt: restore it or start a new run")
    return state


def _same_shapes(tensors, like) -> bool:
    """Whether `tensors` and `like` are dicts of tensors of the same names and shapes."""
    return (isinstance(tensors, dict) and isinstance(like, dict) and tensors.keys() == like.keys()
            and all(isinstance(t, torch.Tensor) and t.shape == getattr(like[name], "shape", None)
                    for name, t in tensors.items()))


def latest_checkpoint(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoint.pt"


def config_here(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's config dict with a learner device this host has: a run trained on a
    GPU (or on cuda:N) evaluates and resumes on a host without it, its learner on the CPU."""
    device = str(saved.get("learners", {}).get("device", "cpu"))
    # A malformed device stays as it is, for the config's validation to report.
    if re.fullmatch(r"cuda(:\d+)?", device) and not device_available(device):
        return apply_overrides(saved, {"learners.device": "cpu"})
    return dict(saved)


def check_compatible(cfg: Config, state: dict) -> None:
    """A checkpoint must come from the same environment, model and optimizer as the
    config. The saved config is validated first, so that fields added since it was
    written take their defaults instead of counting as differences."""
    try:
        saved = config_to_dict(load_config(config_here(state["config"])))
    except ConfigError as error:
        raise CheckpointError(f"the checkpoint's config is not valid here: {error}") from None
    current = config_to_dict(cfg)
    for section, names in (("env", None), ("model", None), ("optim", ["name"])):
        then, now = saved[section], current[section]
        differ = [name for name in names or now if then.get(name) != now[name]]
        if not differ:
            continue
        if (section, differ) != ("env", ["factory"]):
            fix = "use the run's own config.yaml"
        elif then["factory"] is None:
            fix = f"it was trained on env.id {then['id']!r}: load it without env="
        else:
            fix = f"pass the callable it was trained with: A3C.load(path, env={then['factory']})"
        raise CheckpointError(f"the checkpoint was trained with {_settings(section, then, differ)} but the "
                              f"config has {_settings(section, now, differ)}; {fix}")


def _settings(section: str, values: dict, names: list[str]) -> str:
    """`section.name = value, ...` for the named fields of one config section."""
    return ", ".join(f"{section}.{name} = {values.get(name)!r}" for name in names)


def load_state(state: dict, model: torch.nn.Module | None = None, optimizer=None,
               average: torch.nn.Module | None = None) -> None:
    """Load a checkpoint's weights, optimizer state and proximal average (where it has
    one), or say why they do not fit."""
    try:
        if model is not None:
            model.load_state_dict(state["model"])
        if optimizer is not None:
            optimizer.load_state_dict(state["optimizer"])
        if average is not None and state.get("proximal") is not None:
            average.load_state_dict(state["proximal"])
    except (KeyError, RuntimeError, ValueError) as error:
        raise CheckpointError(
            f"the checkpoint does not fit this model or optimizer ({excerpt(error)}); "
            "resume with the run's own config.yaml; a run trained with a model of your own "
            "needs that model again: A3C.load(path, model=...)"
        ) from None
