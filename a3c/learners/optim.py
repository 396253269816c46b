"""Shared optimizers for Hogwild updates (A3C paper, Mnih et al. 2016, section 4 and
"shared RMSProp" in its supplementary material).

The statistics live in shared memory next to the parameters, so every learner reads and
writes the same ones, without a lock. `step(grads)` takes each learner's gradients
explicitly rather than through `param.grad`, so two learners stepping at once never mix
each other's gradients; only the in-place updates of parameters and statistics
interleave, which is what Hogwild tolerates.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["SharedOptimizer", "SharedRMSprop", "SharedAdam", "build_optimizer", "value_lr_problem"]


class SharedOptimizer:
    """Base: holds the parameters, the learning rate and named shared state tensors.

    `params` are tensors, or torch's parameter groups: dicts of "params" and "lr_scale",
    a group's learning rate as a multiple of `lr` (which the schedule sets)."""

    def __init__(self, params, lr: float, eps: float):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.params: list[torch.Tensor] = []
        self.lr_scales: list[float] = []  # per parameter: its group's multiple of lr
        for group in groups:
            kept = [p for p in group["params"] if p.requires_grad]
            self.params += kept
            self.lr_scales += [float(group.get("lr_scale", 1.0))] * len(kept)
        self.lr = lr
        self.eps = eps
        self.state: dict[str, list[torch.Tensor]] = {}

    def _shared_zeros(self, name: str, like: Sequence[torch.Tensor]) -> None:
        self.state[name] = [torch.zeros_like(t).share_memory_() for t in like]

    @torch.no_grad()
    def step(self, grads: Sequence[torch.Tensor], ok: torch.Tensor | None = None) -> None:
        """One update with these gradients. `ok`, a boolean tensor on the parameters'
        device, decides there whether the step happens: when it is false, the parameters
        and the moments keep their values (Adam's step count still advances). A learner
        on an accelerator passes `isfinite(loss)`, so that skipping a non-finite loss
        never waits for the device to say whether the loss was finite.

        With `ok` each tensor is still written once, in place, as without it: the step's
        factors are picked on the device (a factor of 1 and a zero gradient leave a
        moment as it is), so a learner that reads the tensors meanwhile never sees a
        half-taken step, and a skipped step lets NaN into none of them."""
        if ok is not None:
            grads = [torch.where(ok, g, 0.0) for g in grads]  # a non-finite loss's are NaN
        self._step(grads, ok)

    def _step(self, grads: Sequence[torch.Tensor], ok: torch.Tensor | None) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The learning rate and the statistics, copied to the CPU (what a checkpoint holds)."""
        return {"lr": self.lr, **{k: [t.to("cpu", copy=True) for t in v] for k, v in self.state.items()}}

    def load_state_dict(self, state: dict) -> None:
        missing = set(self.state) - set(state)
        if missing:
            raise KeyError(f"optimizer state lacks {sorted(missing)}")
        self.lr = float(state["lr"])
        with torch.no_grad():
            for name, tensors in self.state.items():
                for mine, saved in zip(tensors, state[name], strict=True):
                    mine.copy_(saved)


class SharedRMSprop(SharedOptimizer):
    """RMSprop with one shared running average of squared gradients (A3C's choice)."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-5):
        super().__init__(params, lr, eps)
        self.alpha = alpha
        self._shared_zeros("square_avg", self.params)

    def _step(self, grads: Sequence[torch.Tensor], ok: torch.Tensor | None) -> None:
        alpha = self.alpha if ok is None else torch.where(ok, self.alpha, 1.0)
        for p, g, sq, scale in zip(self.params, grads, self.state["square_avg"], self.lr_scales,
                                   strict=True):
            sq.mul_(alpha).addcmul_(g, g, value=1 - self.alpha)
            p.addcdiv_(g, sq.sqrt().add_(self.eps), value=-self.lr * scale)  # g is 0 when skipped


class SharedAdam(SharedOptimizer):
    """Adam whose moments and step count are shared by all learners. The step is
    torch.optim.Adam's: `eps` is added to the bias-corrected sqrt(v)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-5):
        super().__init__(params, lr, eps)
        self.betas = tuple(betas)
        self._shared_zeros("exp_avg", self.params)
        self._shared_zeros("exp_avg_sq", self.params)
        # On the CPU wherever the parameters are: the step size is computed from it on the
        # host, with no wait for a device.
        self.state["step"] = [torch.zeros(1, dtype=torch.float64).share_memory_()]

    def _step(self, grads: Sequence[torch.Tensor], ok: torch.Tensor | None) -> None:
        beta1, beta2 = self.betas
        count = self.state["step"][0]
        count.add_(1)  # shared: bias correction follows the total number of updates
        t = float(count.item())
        step_size = self.lr / (1 - beta1**t)
        # Bias-correct sqrt(v) before adding eps, so that eps means what it means in torch.
        # (Folding the correction into the step size instead, the Adam paper's eps-hat
        # variant, makes eps act 1/sqrt(1 - beta2^t) times larger: 32x at the first step
        # and still 1.26x after 1000 with beta2 0.999.)
        v_correction = math.sqrt(1 - beta2**t)
        decay1, decay2 = (beta1, beta2) if ok is None else (torch.where(ok, beta1, 1.0),
                                                            torch.where(ok, beta2, 1.0))
        for p, g, m, v, scale in zip(self.params, grads, self.state["exp_avg"], self.state["exp_avg_sq"],
                                     self.lr_scales, strict=True):
            m.mul_(decay1).add_(g, alpha=1 - beta1)
            v.mul_(decay2).addcmul_(g, g, value=1 - beta2)
            p.addcdiv_(m if ok is None else torch.where(ok, m, 0.0),
                       v.sqrt().div_(v_correction).add_(self.eps), value=-step_size * scale)


def value_lr_problem(model: torch.nn.Module, cfg) -> str | None:
    """Why an `OptimConfig`'s `value_lr` cannot apply to `model`, or None."""
    if cfg.value_lr is None or any(name.startswith("value_") for name, _ in model.named_parameters()):
        return None
    return ("optim.value_lr is set, but the model has no parameters under a module named value_* "
            "for it to apply to: name the value's modules so, or set optim.value_lr: null")


def build_optimizer(model: torch.nn.Module, cfg) -> SharedOptimizer:
    """The optimizer named by an `OptimConfig`, over `model`'s parameters: those of the
    value's own torso and head (the modules named value_*) at `cfg.value_lr`, the rest at
    `cfg.lr`."""
    problem = value_lr_problem(model, cfg)
    if problem:
        raise ValueError(problem)
    value_scale = 1.0 if cfg.value_lr is None else cfg.value_lr / cfg.lr
    # A group per parameter, in the model's order: the statistics keep the order a
    # checkpoint stored them in.
    params = [(p, name.startswith("value_")) for name, p in model.named_parameters()]
    groups = [{"params": [p], "lr_scale": value_scale if is_value else 1.0} for p, is_value in params]
    if cfg.name == "adam":
        return SharedAdam(groups, cfg.lr, cfg.betas, cfg.eps)
    return SharedRMSprop(groups, cfg.lr, cfg.alpha, cfg.eps)
