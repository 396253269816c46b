"""Batches: fragments (the actor's records) as time-major tensors, and the minibatches a
pass over a batch is split into.

A fragment is T steps of one environment; a batch is B fragments as [T, B, ...] tensors
(per-fragment fields, the bootstrap observation and a recurrent state, as [B, ...]).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..envs.spaces import Obs, tree_map
from . import vtrace

__all__ = ["Batch", "batch_from_fragments", "fragment_minibatches", "step_parts"]


class Batch(NamedTuple):
    """A batch of B fragments as [T, B, ...] tensors (bootstrap_obs is [B, ...]). The
    observations of a Dict or Tuple space are a dict of such tensors, one per leaf."""

    obs: Obs
    action: torch.Tensor
    reward: torch.Tensor
    logp: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    trunc_value: torch.Tensor
    version: torch.Tensor
    bootstrap_obs: Obs
    state: torch.Tensor | None = None  # [B, state_size]: a recurrent policy's state at obs[0]
    # [T, B]: log pi of the learner's policy before this batch's first gradient step (with
    # learners.target_kl, which bounds how far an update moves it from there).
    start_logp: torch.Tensor | None = None
    # [T, B]: log pi of the learners' proximal average (learners.proximal_decay), the centre of the clip.
    prox_logp: torch.Tensor | None = None


def batch_from_fragments(fragments: np.ndarray, device: torch.device | str = "cpu",
                         whole: bool | None = None) -> Batch:
    """Fragments [B] of the actor's dtype -> time-major tensors [T, B, ...] on `device`.

    On the CPU each field is copied out of the record array once (fields are strided).
    For an accelerator (or `whole`) the records go over whole, in one transfer
    (asynchronous when they lie in pinned memory, as a learner's batches do), and each
    field is cut out of them there: one host-to-device copy per batch, not one per field."""
    device = torch.device(device)
    if not (device.type != "cpu" if whole is None else whole):
        def column(*path: str) -> torch.Tensor:
            array = fragments
            for name in path:
                array = array[name]
            # A copy, always: numpy calls a field of one record contiguous whatever its
            # strides, which torch cannot take.
            return torch.from_numpy(np.array(array, order="C"))
    else:
        raw = torch.from_numpy(fragments.view(np.uint8).reshape(len(fragments), -1))
        column = _columns(raw.to(device, non_blocking=True), fragments.dtype)

    def obs(name: str) -> Obs:
        names = fragments.dtype[name].base.names
        return {leaf: column(name, leaf) for leaf in names} if names else column(name)

    def time_major(name: str) -> torch.Tensor:
        return column(name).transpose(0, 1)

    return Batch(
        obs=tree_map(lambda x: x.transpose(0, 1), obs("obs")),
        action=time_major("action"),
        reward=time_major("reward"),
        logp=time_major("logp"),
        terminated=time_major("terminated"),
        truncated=time_major("truncated"),
        trunc_value=time_major("trunc_value"),
        version=time_major("version"),
        bootstrap_obs=obs("last_obs"),
        state=column("state") if "state" in fragments.dtype.names else None,
    )


def _columns(raw: torch.Tensor, dtype: np.dtype):
    """For records as bytes [B, itemsize] (a tensor on any device): a function from a
    field's path to its values [B, ...], cut out of the bytes and reinterpreted there. A
    path may pass through a sub-array of records (a Dict observation's T steps)."""
    def column(*path: str) -> torch.Tensor:
        values, lead, sub = raw, (len(raw),), dtype
        for name in path:
            field, at = sub.fields[name][:2]
            values = values[..., at:at + field.itemsize]
            sub = field
            if field.shape and field.base.names:  # unfold the sub-array: [..., n, record]
                lead += field.shape
                values = values.reshape(*lead, field.base.itemsize)
                sub = field.base
        base = torch.from_numpy(np.empty(0, sub.base)).dtype
        # A copy on the device, always: a slice that is contiguous already (one record)
        # may start at an offset the field's type cannot be read from.
        values = values.clone(memory_format=torch.contiguous_format)
        return values.view(base).reshape(*lead, *sub.shape)
    return column


# The Batch fields that are [B, ...]; the others are [T, B, ...].
_PER_FRAGMENT = frozenset({"bootstrap_obs", "state"})


def fragment_minibatches(batch: Batch, n: int, returns: vtrace.VTraceReturns | None = None
                 ) -> list[tuple[Batch, vtrace.VTraceReturns | None]]:
    """The batch's fragments in `n` random parts of (nearly) equal size, split by
    fragment, never inside one, each with its fragments' part of `returns` [T, B] (None
    without)."""
    if n == 1:
        return [(batch, returns)]
    parts = torch.randperm(batch.reward.shape[1], device=batch.reward.device).tensor_split(n)

    def part(name: str, field, idx):  # whole fragments: recurrent unrolls stay intact
        if field is None:
            return None
        if name in _PER_FRAGMENT:
            return tree_map(lambda t: t[idx], field)
        return tree_map(lambda t: t[:, idx], field)

    return [(Batch(*(part(name, field, idx) for name, field in zip(Batch._fields, batch))),
             None if returns is None else vtrace.VTraceReturns(*(x[:, idx] for x in returns)))
            for idx in parts]


def step_parts(batch: Batch, returns: vtrace.VTraceReturns, n: int) -> list[tuple[Batch, vtrace.VTraceReturns]]:
    """`batch` [T, B] in `n` random parts of single steps drawn from all its fragments,
    each a Batch [1, N] without per-fragment fields, with its part of `returns` [T, B]."""
    T, B = batch.reward.shape

    def flat(field: torch.Tensor) -> torch.Tensor:  # [T, B, ...] -> [T * B, ...], copied once a pass
        return field.reshape(T * B, *field.shape[2:])

    fields = [None if name in _PER_FRAGMENT or field is None else tree_map(flat, field)
              for name, field in zip(Batch._fields, batch)]
    targets = [flat(x) for x in returns]

    def part(idx: torch.Tensor) -> tuple[Batch, vtrace.VTraceReturns]:
        def take(x: torch.Tensor) -> torch.Tensor:  # the steps idx, as [1, N, ...]
            return x[idx].unsqueeze(0)
        return (Batch(*(None if field is None else tree_map(take, field) for field in fields)),
                vtrace.VTraceReturns(*map(take, targets)))

    return [part(idx) for idx in torch.randperm(T * B, device=batch.reward.device).tensor_split(n)]
