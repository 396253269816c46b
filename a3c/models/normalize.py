"""Running statistics that keep inputs and value targets near unit scale.

Both are modules whose statistics are buffers: they live in the model, so they are in
shared memory with its parameters (actors read them with the weights), in every
checkpoint, and used by `predict` and `evaluate` without any extra step. Only learners
update them, from fresh batches.

- `ObservationNorm`: running mean and variance of observations, merged batch by batch
  with the parallel formula of Chan, Golub and LeVeque (1979), so that the statistics
  of several batches equal those of their concatenation.
- `PopArt`: running mean and scale of value targets (van Hasselt et al. 2016, "Learning
  values across many orders of magnitude"). The value head predicts normalised values;
  when the statistics move, the head's last layer is rescaled so that the values it
  outputs stay the same ("preserving outputs precisely").
"""
from __future__ import annotations

import torch
import torch.nn as nn


__all__ = ["LeafNorms", "ObservationNorm", "PopArt", "merge_moments"]


def merge_moments(count: float | torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                  batch: torch.Tensor) -> tuple[float | torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, mean, var) of the samples so far merged with `batch` [N, ...] (population
    variance; Chan et al. 1979, eq. 2.1b). `count` may be a tensor on the batch's device,
    so that nothing waits for the device."""
    n = batch.shape[0]
    batch_mean = batch.mean(0)
    batch_var = batch.var(0, unbiased=False)
    total = count + n
    delta = batch_mean - mean
    new_mean = mean + delta * (n / total)
    m2 = var * count + batch_var * n + delta.pow(2) * (count * n / total)
    return total, new_mean, m2 / total


class ObservationNorm(nn.Module):
    """(obs - mean) / sqrt(var + eps), clipped to [-clip, clip]."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return ((obs - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Merge a batch of observations [N, *shape] into the statistics."""
        obs = obs.reshape(-1, *self.mean.shape).to(self.mean.device, torch.float64)
        count, mean, var = merge_moments(self.count, self.mean.double(), self.var.double(), obs)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)


class PopArt(nn.Linear):
    """A linear value layer that outputs unnormalised values `(w x + b) std + mean`,
    with adaptive statistics of the value targets.

    The statistics are exponential moving averages of the targets' first and second
    moments (`beta` per update), debiased as Adam's are so that the first batches are
    not pulled towards zero."""

    def __init__(self, in_features: int, beta: float = 0.99, min_std: float = 1e-2):
        super().__init__(in_features, 1)
        self.beta, self.min_std = beta, min_std
        self.register_buffer("first", torch.zeros(()))   # EMA of E[target]
        self.register_buffer("second", torch.zeros(()))  # EMA of E[target^2]
        self.register_buffer("debias", torch.zeros(()))  # 1 - beta^updates

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mean, std = self.stats()
        return super().forward(features) * std + mean

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the targets; (0, 1) before the first update."""
        return self._stats(self.first, self.second, self.debias)

    def _stats(self, first: torch.Tensor, second: torch.Tensor, debias: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if debias.device.type == "cpu":  # reading a value on the CPU costs no wait
            if float(debias) == 0.0:
                return torch.zeros_like(first), torch.ones_like(first)
            mean = first / debias
            return mean, (second / debias - mean.pow(2)).clamp(min=self.min_std**2).sqrt()
        # On an accelerator, decided by tensor ops: reading the statistics never waits.
        started = debias > 0
        debias = torch.where(started, debias, 1.0)
        mean = first / debias
        std = (second / debias - mean.pow(2)).clamp(min=self.min_std**2).sqrt()
        return mean, torch.where(started, std, 1.0)

    @torch.no_grad()
    def update(self, targets: torch.Tensor, ok: torch.Tensor | None = None) -> None:
        """Move the statistics towards a batch of targets and rescale the layer so that
        its unnormalised outputs do not change; where `ok` (a boolean tensor) is false,
        change nothing (decided on the device: see SharedOptimizer.step)."""
        old_mean, old_std = self.stats()
        targets = targets.to(self.first.device, torch.float32)
        first = self.first * self.beta + targets.mean() * (1 - self.beta)
        second = self.second * self.beta + targets.pow(2).mean() * (1 - self.beta)
        debias = self.debias * self.beta + (1 - self.beta)
        new_mean, new_std = self._stats(first, second, debias)
        # w' = w std / std',  b' = (std b + mean - mean') / std'
        weight = self.weight * (old_std / new_std)
        bias = (self.bias * old_std + old_mean - new_mean) / new_std
        # Each tensor written once; where `ok` is false, with its own value.
        for mine, new in ((self.first, first), (self.second, second), (self.debias, debias),
                          (self.weight, weight), (self.bias, bias)):
            mine.copy_(new if ok is None else torch.where(ok, new, mine))


class LeafNorms(nn.Module):
    """An `ObservationNorm` for each named leaf of a dict observation (Dict and Tuple
    spaces, see a3c.envs.spaces); the other leaves pass through unchanged."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        self.paths = list(shapes)
        # Module names cannot hold dots, which leaf paths may.
        self.norms = nn.ModuleDict({_module_name(p): ObservationNorm(s) for p, s in shapes.items()})

    @torch.no_grad()
    def update(self, obs: dict[str, torch.Tensor]) -> None:
        for path in self.paths:
            self.norms[_module_name(path)].update(obs[path])

    def forward(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {path: self.norms[_module_name(path)](value) if path in self.paths else value
                for path, value in obs.items()}


def _module_name(path: str) -> str:
    return path.replace(".", "__")
