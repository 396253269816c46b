"""Checkpoints: explicit dicts of tensors and plain values, written atomically and read
back with `weights_only=True` (no pickled objects, so loading runs no code)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .files import write_atomically

__all__ = ["CheckpointError", "FORMAT", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

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
            f"{path} is not a readable checkpoint ({type(error).__name__}: {str(error)[:200]}); "
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
