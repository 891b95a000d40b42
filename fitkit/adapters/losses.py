"""Losses by name, module or callable, with Keras-style sample weights and reduction.

A loss adapter is called as `loss(outputs, targets, sample_weight=None) -> scalar tensor`.
A callable whose first two parameters are `y_true, y_pred` is called in Keras' order. Values
with a shape are reduced as Keras' "sum over batch size" does; with sample weights the
per-sample losses are weighted and averaged over the batch.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from fitkit.adapters.outputs import OutputLosses, is_structure, single_output
from fitkit.common.options import did_you_mean


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


def sparse_targets(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Class indices as Keras' `sparse_categorical_crossentropy` reads them: integer targets with
    a trailing axis of 1 beside outputs of the same rank lose it (`(N, 1)` -> `(N,)` for outputs
    `(N, C)`), as Keras squeezes them; any other targets as they are."""
    if (targets.dim() == outputs.dim() > 1 and targets.shape[-1] == 1 and not targets.is_floating_point()
            and targets.shape[:-1] == (outputs.shape[0], *outputs.shape[2:])):
        return targets.squeeze(-1)
    return targets


def _sparse_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    return F.cross_entropy(outputs, sparse_targets(outputs, targets), reduction=reduction)


def _nll(outputs: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    return F.nll_loss(outputs, targets, reduction=reduction)


#: The named losses: name -> (function, the rule its targets follow: "class" indices or
#: probabilities, "binary" values in [0, 1], "regression" values of the outputs' shape). The
#: first-batch checks (`fitkit.engine.checks`) read the rules from here.
_TABLE: dict[str, tuple[Callable[..., torch.Tensor], str]] = {
    "cross_entropy": (_cross_entropy, "class"),
    "sparse_categorical_crossentropy": (_sparse_cross_entropy, "class"),  # (N, 1) indices too, as Keras
    "categorical_crossentropy": (_cross_entropy, "class"),  # one-hot / probability targets work with F.cross_entropy
    "binary_crossentropy": (_binary_ce, "binary"),
    "mse": (_regression(F.mse_loss), "regression"),
    "mean_squared_error": (_regression(F.mse_loss), "regression"),
    "mae": (_regression(F.l1_loss), "regression"),
    "mean_absolute_error": (_regression(F.l1_loss), "regression"),
    "huber": (_regression(F.huber_loss), "regression"),
    "nll": (_nll, "class"),
}
LOSSES: dict[str, Callable[..., torch.Tensor]] = {name: fn for name, (fn, _) in _TABLE.items()}
#: The named losses whose mean is one torch function: called directly (one Python call less a step;
#: not `sparse_categorical_crossentropy`, which squeezes `(N, 1)` targets first).
_MEAN: dict[str, Callable[..., torch.Tensor]] = {
    **dict.fromkeys(("cross_entropy", "categorical_crossentropy"),
                    partial(F.cross_entropy, reduction="mean")),
    "nll": partial(F.nll_loss, reduction="mean"),
}
LOSS_KINDS: dict[str, str] = {name: kind for name, (_, kind) in _TABLE.items()}


def keras_order(fn: Any) -> bool:
    """True when `fn`'s first two parameters are named `y_true, y_pred` (Keras' order)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: fitkit's order
        return False
    return params[:2] == ["y_true", "y_pred"]


def same_rank(values: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`values` and `weight` brought to the same rank as Keras does before weighting: a trailing
    axis of size 1 on one side is dropped, or a rank-1 side gains one (`(N,)` against `(N, 1)`)."""
    if values.dim() == weight.dim() + 1 and values.shape[-1] == 1:
        if weight.dim() == 1:
            weight = weight.unsqueeze(-1)
        else:
            values = values.squeeze(-1)
    elif weight.dim() == values.dim() + 1 and weight.shape[-1] == 1:
        if values.dim() == 1:
            values = values.unsqueeze(-1)
        else:
            weight = weight.squeeze(-1)
    return values, weight


def reduce_loss(values: torch.Tensor, sample_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Keras' `sum_over_batch_size` reduction of the values a loss returned: their mean; with
    `sample_weight`, the values times the weights (shapes matched as Keras matches them: `(N,)`,
    `(N, 1)`, or one weight per element such as per time step), summed and divided by the
    number of values::

        reduce_loss(torch.tensor([1.0, 3.0]))                                 # 2.0
        reduce_loss(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 0.0]))       # 0.5
        reduce_loss(torch.tensor([1.0, 3.0]), torch.tensor([[1.0], [0.0]]))   # 0.5 as well
    """
    if sample_weight is None or values.dim() == 0:
        return values if values.dim() == 0 else values.mean()
    values, weight = same_rank(values, sample_weight.to(values.dtype))
    if weight.dim() < values.dim():  # (N,) weights on (N, T) values: one weight a sample
        weight = weight.reshape(*weight.shape, *([1] * (values.dim() - weight.dim())))
    weighted = values * weight
    if weighted.shape != values.shape:
        raise ValueError(f"`sample_weight` of shape {tuple(sample_weight.shape)} does not match the loss values of "
                         f"shape {tuple(values.shape)}: pass one weight per sample, shape (N,) or (N, 1)")
    return weighted.sum() / max(values.numel(), 1)


class Loss:
    """A compiled loss, called as `loss(outputs, targets, sample_weight=None) -> scalar`.

    A name runs fitkit's own function. A callable (or an object with a Keras-style
    `call(y_true, y_pred)`) whose first two parameters are `y_true, y_pred` is called in Keras'
    order, any other as `fn(outputs, targets)`. Values with a shape (one per sample, or per
    element) are reduced as Keras does (`reduce_loss`)::

        def custom_mse(y_true, y_pred):             # Keras' order, one value per sample
            return ((y_true - y_pred) ** 2).mean(dim=-1)
        Loss(custom_mse)(outputs, targets, sample_weight=w)
    """

    structured = False  # True once it has seen several outputs with one target each (see `__call__`)
    _multi: Any = None

    def __init__(self, spec: Any):
        self.spec = spec
        self.name = spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)
        self._named = LOSSES[spec] if isinstance(spec, str) else None
        self._mean = _MEAN.get(spec) if isinstance(spec, str) else None
        self._unreduced: Callable | None = None
        call = getattr(spec, "call", None)
        if self._named is None and not isinstance(spec, torch.nn.Module) and callable(call) and keras_order(call):
            self.fn, self.keras_order = call, True  # a keras.losses.Loss-like object: its unreduced `call`
        else:
            self.fn, self.keras_order = spec, self._named is None and keras_order(spec)

    def __call__(self, outputs: Any, targets: Any, sample_weight: torch.Tensor | None = None) -> torch.Tensor:
        if type(outputs) is not torch.Tensor:
            if is_structure(targets) and is_structure(outputs):  # Keras 3: the loss on every output
                if self._multi is None:
                    self._multi, self.structured = OutputLosses(self, build=lambda loss: loss), True
                return self._multi(outputs, targets, sample_weight)
            outputs = single_output(outputs, targets)
        if self._named is not None:
            if sample_weight is None:
                mean = self._mean
                return mean(outputs, targets) if mean is not None else self._named(outputs, targets, "mean")
            return reduce_loss(self._named(outputs, targets, "none"), sample_weight)
        if sample_weight is not None and isinstance(self.spec, torch.nn.Module) and hasattr(self.spec, "reduction"):
            return reduce_loss(self._unreduced_module()(outputs, targets), sample_weight)
        value = self.fn(targets, outputs) if self.keras_order else self.fn(outputs, targets)
        if not isinstance(value, torch.Tensor):
            return value  # the first-batch check says what is wrong with it
        if sample_weight is not None and (value.dim() == 0 or value.shape[0] != sample_weight.shape[0]):
            raise ValueError(
                "`sample_weight` / `class_weight` need per-sample losses: return one value per sample from "
                f"{self.name!r} (Keras reduces them), use a named loss ({', '.join(LOSSES)}), or a torch loss "
                f"module with a `reduction` attribute; {self.name!r} returned shape {tuple(value.shape)}"
            )
        return reduce_loss(value, sample_weight)

    @property
    def parts(self) -> dict[str, torch.Tensor] | None:
        """Each output's loss after the last call, when it was applied to several (else None)."""
        return self._multi.parts if self._multi is not None else None

    def _unreduced_module(self) -> Callable:
        if self._unreduced is None:
            unreduced = copy.copy(self.spec)
            unreduced.reduction = "none"
            self._unreduced = unreduced
        return self._unreduced


def build_loss(spec: Any, loss_weights: Any = None) -> Loss | OutputLosses | None:
    """`None` means the module returns its own loss (HF style). A list or dict (one loss per
    output, Keras 3), or `loss_weights`, give an `OutputLosses`."""
    if isinstance(spec, (list, tuple, dict)) or loss_weights is not None:
        if spec is None:
            raise ValueError("`loss_weights` weigh the compiled losses: pass `loss=` too")
        if isinstance(spec, (list, tuple, dict)) and not spec:
            raise ValueError("`loss` is an empty list or dict: pass one loss per output (None for an output without)")
        if loss_weights is not None and not isinstance(loss_weights, (list, tuple, dict, int, float)):
            raise TypeError(f"`loss_weights` must be a list (one per output) or a dict by output name; got "
                            f"{type(loss_weights).__name__}")
        return OutputLosses(spec, loss_weights, build=build_loss)
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
    if callable(spec) or (callable(getattr(spec, "call", None)) and keras_order(spec.call)):
        return Loss(spec)
    raise TypeError(f"`loss` must be a name, an nn.Module, a callable, None, or a list or dict of them (one per output); "
                    f"got {type(spec).__name__}")
