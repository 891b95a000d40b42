"""Losses by name, module or callable, with Keras-style sample weights.

A loss adapter is called as `loss(outputs, targets, sample_weight=None) -> scalar tensor`.
With sample weights the per-sample losses are weighted and averaged over the batch
(Keras' "sum over batch size").
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
import torch.nn.functional as F

from fitkit.options import did_you_mean


def _binary_ce(outputs: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    if targets.dim() == outputs.dim() - 1 and outputs.shape[-1] == 1:
        outputs = outputs.squeeze(-1)
    return F.binary_cross_entropy_with_logits(outputs, targets.to(outputs.dtype), reduction=reduction)


def _regression(fn: Callable) -> Callable:
    def loss(outputs: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
        if targets.dim() == outputs.dim() - 1 and outputs.shape[-1] == 1:
            outputs = outputs.squeeze(-1)
        targets = targets.to(outputs.dtype)
        if reduction == "none":
            per = fn(outputs, targets, reduction="none")
            return per.reshape(per.shape[0], -1).mean(dim=1) if per.dim() > 1 else per
        return fn(outputs, targets, reduction=reduction)

    return loss


def _cross_entropy(outputs: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction=reduction)


def _nll(outputs: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    return F.nll_loss(outputs, targets, reduction=reduction)


LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "cross_entropy": _cross_entropy,
    "sparse_categorical_crossentropy": _cross_entropy,
    "categorical_crossentropy": _cross_entropy,  # one-hot / probability targets work with F.cross_entropy
    "binary_crossentropy": _binary_ce,
    "mse": _regression(F.mse_loss),
    "mean_squared_error": _regression(F.mse_loss),
    "mae": _regression(F.l1_loss),
    "mean_absolute_error": _regression(F.l1_loss),
    "huber": _regression(F.huber_loss),
    "nll": _nll,
}


class Loss:
    """A compiled loss. `fn(outputs, targets, reduction)` for named losses, else the user's callable."""

    def __init__(self, spec: Any):
        self.spec = spec
        self.name = spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)
        self._named = LOSSES[spec] if isinstance(spec, str) else None
        self._unreduced: Callable | None = None

    def __call__(self, outputs: Any, targets: Any, sample_weight: torch.Tensor | None = None) -> torch.Tensor:
        if self._named is not None:
            if sample_weight is None:
                return self._named(outputs, targets, "mean")
            per_sample = self._named(outputs, targets, "none")
        else:
            if sample_weight is None:
                return self.spec(outputs, targets)
            per_sample = self._per_sample(outputs, targets)
        if per_sample.dim() > 1:
            per_sample = per_sample.reshape(per_sample.shape[0], -1).mean(dim=1)
        return (per_sample * sample_weight.to(per_sample.dtype)).mean()

    def _per_sample(self, outputs: Any, targets: Any) -> torch.Tensor:
        if self._unreduced is None:
            if isinstance(self.spec, torch.nn.Module) and hasattr(self.spec, "reduction"):
                unreduced = copy.copy(self.spec)
                unreduced.reduction = "none"
                self._unreduced = unreduced
            else:
                raise ValueError(
                    "`sample_weight` / `class_weight` need per-sample losses: use a named loss "
                    f"({', '.join(LOSSES)}) or a torch loss module with a `reduction` attribute, "
                    f"not {self.name!r}"
                )
        return self._unreduced(outputs, targets)


def build_loss(spec: Any) -> Loss | None:
    """`None` means the module returns its own loss (HF style)."""
    if spec is None:
        return None
    if isinstance(spec, str):
        key = spec.lower()
        if key not in LOSSES:
            raise ValueError(
                f"{did_you_mean(spec, LOSSES)}unknown loss {spec!r} for `loss`; valid names are: {', '.join(LOSSES)} "
                "(or pass an nn.Module, a callable (outputs, targets) -> tensor, or None when the "
                "module returns its loss)"
            )
        return Loss(key)
    if isinstance(spec, type) and issubclass(spec, torch.nn.Module):
        return Loss(spec())
    if callable(spec):
        return Loss(spec)
    raise TypeError(f"`loss` must be a name, an nn.Module, a callable or None; got {type(spec).__name__}")
