"""The checks of a batch that need no forward: targets given where the loss needs them, the
features' dtype against the module's first layer, and the values read back from the batch
(finite, the targets' range) in one transfer.

    stats = check_batch(batch, module, loss, names, training=True)
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from fitkit.adapters.losses import LOSS_KINDS
from fitkit.common.tensors import tensors_of
from fitkit.engine.checks.names import _EMBEDDINGS, IGNORE_INDEX, _layer, _named, _Names, _shape, first_layer
from fitkit.engine.data.batch import Batch


def check_batch(batch: Batch, module: torch.nn.Module, loss: Any, names: _Names, *, training: bool,
                with_loss: bool, kept: tuple | None = None) -> dict[str, float]:
    """Raise for missing targets or integer features (naming the argument and the fix), warn for
    non-finite values; the values read (for the loss rules) are returned (`kept`: the (batch,
    values) read before, by a search's earlier trial: not read again)."""
    if with_loss:
        _check_targets_given(batch, loss, names, training)
    _check_features(batch, module, names)
    stats = _read_stats(batch, loss) if kept is None else kept[1]
    _warn_non_finite(stats, names)
    return stats


def _check_targets_given(batch: Batch, loss: Any, names: _Names, training: bool) -> None:
    if batch.target is not None or loss is None:
        return
    if training:
        raise ValueError("training needs targets: pass `y`, or batches of (x, y), or a module that returns its loss")
    if names.name != "x":  # validation data
        raise ValueError(
            f"`{names.name}` has no targets, so no validation loss can be computed: pass "
            "`validation_data=(x_val, y_val)` (or (x_val, y_val, sample_weight)), or a Dataset / DataLoader whose "
            "batches are (x, y)"
        )


def _check_features(batch: Batch, module: torch.nn.Module, names: _Names) -> None:
    """Integer features for a module that takes floats (one input; an Embedding first is fine)."""
    inputs = batch.inputs
    if not (isinstance(inputs, tuple) and len(inputs) == 1 and isinstance(inputs[0], torch.Tensor)):
        return
    x = inputs[0]
    if x.is_floating_point() or x.is_complex():
        return
    param, layer = next(module.parameters(), None), first_layer(module)
    if param is None or not param.is_floating_point() or isinstance(layer, _EMBEDDINGS):
        return
    raise TypeError(
        f"{names.x} hold{names.s} integer values ({x.dtype}, shape {_shape(x)}) but the module's first layer, "
        f"{_layer(layer)}, takes floating-point inputs ({param.dtype}): pass float features, e.g. `x.float()` "
        "(NumPy: `x.astype('float32')`); integer inputs suit a module whose first layer is an Embedding"
    )


def _read_stats(batch: Batch, loss: Any) -> dict[str, float]:
    """What the value checks compare, read back to the host in one transfer: whether features and
    targets are finite, and the targets' range when the named loss has rules for it."""
    parts: dict[str, torch.Tensor] = {}
    floats = [t for t in tensors_of(batch.inputs) if t.is_floating_point()]
    if floats:
        finite = [torch.isfinite(t).all() for t in floats]
        parts["x_finite"] = finite[0] if len(finite) == 1 else torch.stack(finite).all()
    y, named = batch.target, loss if isinstance(loss, str) else _named(loss)
    kind = LOSS_KINDS.get(named or "")
    if isinstance(y, torch.Tensor) and y.numel() and not y.is_complex():
        if y.is_floating_point():
            parts["y_finite"] = torch.isfinite(y).all()
        if y.dtype != torch.bool and kind in ("class", "binary"):
            # masking the ignored label with 0 keeps the maximum (unless all are ignored: then 0 fits)
            kept = y.masked_fill(y == IGNORE_INDEX, 0) if kind == "class" and not y.is_floating_point() else y
            parts["y_min"], parts["y_max"] = torch.aminmax(kept)
    if not parts:
        return {}
    device = next(iter(parts.values())).device
    values = torch.stack([v.to(device) for v in parts.values()]).tolist()  # one dtype by promotion
    return dict(zip(parts, values))


def _warn_non_finite(stats: dict[str, float], names: _Names) -> None:
    for key, who, s in (("x_finite", names.x, names.s), ("y_finite", names.y, names.ys)):
        if stats.get(key, 1.0) == 0.0:
            warnings.warn(
                f"{who} hold{s} NaN or infinite values in its first batch: the loss, then the weights, will turn NaN; "
                "clean them (e.g. `torch.nan_to_num`) or drop those samples",
                UserWarning, stacklevel=5,
            )


def _probe_safe(module: torch.nn.Module) -> bool:
    """False for a module the probe would change: compiled (a new graph) or lazy (initialised)."""
    if hasattr(module, "_orig_mod"):  # torch.compile's OptimizedModule
        return False
    return not any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in module.modules())

