"""Optimizers by name, class or factory, and the learning-rate schedules."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from fitkit.options import did_you_mean

#: name -> (class, Keras default learning rate)
OPTIMIZERS: dict[str, tuple[type, float]] = {
    "adam": (torch.optim.Adam, 1e-3),
    "adamw": (torch.optim.AdamW, 1e-3),
    "sgd": (torch.optim.SGD, 1e-2),
    "rmsprop": (torch.optim.RMSprop, 1e-3),
    "adagrad": (torch.optim.Adagrad, 1e-3),
}


def check_optimizer(spec: Any) -> None:
    """Fail early (at `compile`) on an optimizer that cannot be built."""
    if isinstance(spec, str):
        if spec.lower() not in OPTIMIZERS:
            raise ValueError(
                f"{did_you_mean(spec, OPTIMIZERS)}unknown optimizer {spec!r} for `optimizer`; valid names are: {', '.join(OPTIMIZERS)} "
                "(or pass a torch.optim.Optimizer subclass or a callable params -> optimizer)"
            )
    elif not (isinstance(spec, torch.optim.Optimizer) or callable(spec)):
        raise TypeError(
            f"`optimizer` must be a name, a torch.optim.Optimizer subclass or instance, or a callable "
            f"params -> optimizer; got {type(spec).__name__}"
        )


#: Named optimizers whose `eps` would vanish in float16 (1e-8 underflows): used with "16-true".
_EPS_FP16 = {"adam": 1e-4, "adamw": 1e-4, "rmsprop": 1e-4, "adagrad": 1e-4}


def build_optimizer(
    spec: Any, params: Iterable[torch.nn.Parameter], learning_rate: float | None, weight_decay: float | None,
    precision: str | None = None,
) -> torch.optim.Optimizer:
    """Build the optimizer over `params` (the parameters of the module as set up by Fabric)."""
    check_optimizer(spec)
    if isinstance(spec, torch.optim.Optimizer):
        return spec
    kwargs: dict[str, Any] = {}
    if weight_decay is not None:
        kwargs["weight_decay"] = weight_decay
    if isinstance(spec, str):
        cls, default_lr = OPTIMIZERS[spec.lower()]
        kwargs["lr"] = default_lr if learning_rate is None else learning_rate
        if str(precision) in ("16-true", "16") and spec.lower() in _EPS_FP16:
            kwargs["eps"] = _EPS_FP16[spec.lower()]  # pure float16 weights: keep the denominator representable
        return cls(params, **kwargs)
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        if learning_rate is not None:
            kwargs["lr"] = learning_rate
        return spec(params, **kwargs)
    optimizer = spec(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"the `optimizer` callable must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if learning_rate is not None:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
    return optimizer


def build_scheduler(
    spec: str | Callable, optimizer: torch.optim.Optimizer, num_training_steps: int, warmup_steps: int
):
    """A step-wise scheduler, or None when the rate is constant (nothing to do per step)."""
    if callable(spec) and not isinstance(spec, str):
        return spec(optimizer, num_training_steps)
    if spec == "constant" and warmup_steps == 0:
        return None
    total = max(num_training_steps, 1)

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if spec == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(total - warmup_steps, 1)
        progress = min(progress, 1.0)
        if spec == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
