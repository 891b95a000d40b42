"""What each metric of a set sees of a batch, and the means fitkit keeps itself.

A metric sees its output and target (one output's, or the whole model's single one) and its
sample weights; fitkit averages a callable metric (`CallableMean`) and one output's loss
(`LossPart`) itself::

    preds, target = select_for(OutputMetric("accuracy", "label").select, outputs, targets)
    mean = CallableMean(my_fn); mean.update(preds, target); mean.compute()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fitkit.adapters.keras_metrics import distributed
from fitkit.adapters.outputs import (
    PREDICTION_KEYS,
    LossParts,
    OutputMetric,
    is_structure,
    output_names,
    pick,
    single_output,
)


class CallableMean:
    """A batch-size-weighted mean of a callable metric, accumulated on the device."""

    higher_is_better = None

    def __init__(self, fn: Callable[..., Any] | None):  # None: `LossPart`, whose `update` calls none
        self.fn = fn
        self.total: torch.Tensor | float = 0.0
        self.count = 0

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        n = preds.shape[0] if preds.dim() else 1
        assert self.fn is not None  # only `LossPart` has none, and it updates otherwise
        value = self.fn(preds, target)
        if not isinstance(value, torch.Tensor):  # a number (fit's first-batch check refused anything else)
            value = torch.tensor(float(value), device=preds.device)
        elif value.dim():  # one value of shape (1,) and the like
            value = value.reshape(())
        self.total = self.total + value.detach().float() * n
        self.count += n

    def compute(self) -> torch.Tensor:
        total = torch.as_tensor(self.total, dtype=torch.float64)
        count = torch.tensor(float(self.count), dtype=torch.float64, device=total.device)
        if distributed():
            both = torch.stack([total.to(count.device), count])
            torch.distributed.all_reduce(both)
            total, count = both[0], both[1]
        return total / count.clamp(min=1)

    def reset(self) -> None:
        self.total, self.count = 0.0, 0


class LossPart(CallableMean):
    """One output's loss (`<output>_loss`), as the compiled loss computed it this batch, averaged
    over the samples like the loss."""

    def __init__(self, parts: LossParts, output: str):
        super().__init__(None)
        self.parts, self.output = parts, output

    def update(self, target: Any) -> None:  # type: ignore[override]
        values = self.parts.parts()
        if not values or self.output not in values:
            return
        value = values[self.output]
        n = _rows(target)
        self.total = self.total + value.float() * n
        self.count += n


def _rows(target: Any) -> int:
    while isinstance(target, (tuple, list, dict)):
        target = next(iter(target.values())) if isinstance(target, dict) else target[0]
    return int(target.shape[0]) if isinstance(target, torch.Tensor) and target.dim() else 1


def whole(outputs: Any, target: Any) -> tuple[Any, Any]:
    """`select_for` for a metric of the whole model's output; one tensor (the common case) directly."""
    if type(outputs) is torch.Tensor:
        return (outputs.detach() if outputs.requires_grad else outputs), target
    return select_for(None, outputs, target)


def select_for(select: Any, outputs: Any, target: Any) -> tuple[Any, Any]:
    """What one metric sees: its output and target (`OutputMetric.select`), or for a metric of
    the whole model the one output matching one target (`single_output`), detached."""
    if select is not None:
        preds, tgt = select(outputs, target)
    else:
        if is_structure(target) and is_structure(outputs) and not (isinstance(outputs, dict) and any(
                k in outputs for k in PREDICTION_KEYS)):
            raise ValueError(
                "`metrics` is a flat list but the module returned several outputs with one target each: pass the metrics "
                "per output, a list of lists in the outputs' order or a dict by output name (Keras 3 asks the same)")
        preds, tgt = single_output(outputs, target, what="metrics"), target
    return (preds.detach() if isinstance(preds, torch.Tensor) else preds), tgt


def weight_picker(spec: Any) -> Callable[[Any, Any], Any]:
    """What picks a weighted metric's sample weights from a batch's: one array weighs every
    output; a list or dict gives each output its own (the first for all when there are fewer
    weights than outputs, as Keras repeats it)."""
    key = spec.key if isinstance(spec, OutputMetric) else None

    def pick_weight(outputs: Any, sample_weight: Any) -> Any:
        if not is_structure(sample_weight):
            return sample_weight
        if key is None or not is_structure(outputs):
            return next(iter(sample_weight.values())) if isinstance(sample_weight, dict) else sample_weight[0]
        names = output_names(outputs)
        if isinstance(sample_weight, (list, tuple)) and len(sample_weight) < len(names):
            return sample_weight[0]
        return pick(sample_weight, key, names, "sample_weight")

    return pick_weight

