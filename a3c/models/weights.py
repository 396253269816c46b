"""Copies of a model's weights: an actor's private policy, and the in-place copy that
keeps it (or a learner's working copy) current."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

__all__ = ["WeightCopy", "clone_policy"]


class WeightCopy:
    """Copies the parameters and buffers of `src` into `dst` (same architecture) in place
    when called: much cheaper than a state_dict round trip. The tensors are listed once,
    as the copy runs once per fragment in actors and once per gradient step in learners."""

    def __init__(self, dst: nn.Module, src: nn.Module):
        self.dst = [*dst.parameters(), *dst.buffers()]
        self.src = [*src.parameters(), *src.buffers()]
        if [t.shape for t in self.dst] != [t.shape for t in self.src]:
            raise ValueError("WeightCopy: the two models have different architectures")

    @torch.no_grad()
    def __call__(self) -> None:
        for mine, theirs in zip(self.dst, self.src):
            mine.copy_(theirs)


def clone_policy(model: torch.nn.Module) -> torch.nn.Module:
    """A private copy for acting, so reading weights never races a learner's update
    in the middle of a forward pass."""
    local = copy.deepcopy(model)
    for p in local.parameters():
        p.requires_grad_(False)
    return local
