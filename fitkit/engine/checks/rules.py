"""The rules the named losses set for targets against the module's outputs (class indices in
range, binary targets in [0, 1], regression targets of the outputs' shape), the metric
callables' contract, and the likely fix for a module that raised: each broken rule is an error
naming the argument, the shapes and the fix (docs/common-errors.md lists them).

    for named, out, target, names in _loss_pairs(loss, outputs, targets, names):
        _check_rules(named, out, target, names, stats)
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from fitkit.adapters.keras_metrics import Weighted, is_keras_metric
from fitkit.adapters.losses import LOSS_KINDS, OutputLosses, keras_order, sparse_targets
from fitkit.adapters.metric_specs import metric_name
from fitkit.adapters.outputs import LossParts, OutputMetric, is_structure, output_names, pick, single_output
from fitkit.common.options import error_line
from fitkit.engine.checks.names import (
    _EMBEDDINGS,
    _INDEX_DTYPES,
    IGNORE_INDEX,
    _describe,
    _layer,
    _named,
    _Names,
    _shape,
    _single_input,
    first_layer,
)
from fitkit.engine.data.batch import Batch


def _module_hint(module: torch.nn.Module, batch: Batch, names: _Names, own_loss: bool) -> str:
    """The likely fix for an exception from the module's forward on `batch`."""
    if own_loss and batch.target is not None:
        return ("with `loss=None` the module is called as module(x, y) (module(**inputs, labels=y) for dict inputs) "
                "and must return its loss: pass `loss=` to compile (e.g. loss='cross_entropy') if it does not")
    layer, x = first_layer(module), _single_input(batch)
    param = next(module.parameters(), None)
    if x is None or layer is None:
        return f"make {names.x} match the arguments of the module's forward (their number or names, shapes, dtypes)"
    if isinstance(layer, torch.nn.Linear) and x.dim() and x.shape[-1] != layer.in_features:
        return (f"the module's first layer, {_layer(layer)}, takes {layer.in_features} features in the last "
                f"dimension, not the {x.shape[-1]} of {names.x}: pass data with {layer.in_features} features, or build "
                f"the module with in_features={x.shape[-1]}")
    conv = isinstance(layer, torch.nn.modules.conv._ConvNd)
    if conv and x.dim() >= 2 and x.shape[1] != layer.in_channels:
        return (f"the module's first layer, {_layer(layer)}, takes {layer.in_channels} channels in dimension 1, "
                f"not the {x.shape[1]} of {names.x} (shape {_shape(x)}): pass channels-first data (N, C, ...) with "
                f"{layer.in_channels} channels")
    if isinstance(layer, _EMBEDDINGS) and not x.is_floating_point() and x.device.type == "cpu" and x.numel():
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= layer.num_embeddings:
            return (f"the module's first layer, {_layer(layer)}, takes indices in [0, {layer.num_embeddings}) but "
                    f"{names.x} hold{names.s} indices from {low} to {high}: build the Embedding with "
                    f"num_embeddings={high + 1}, or map the indices into range")
    if param is not None and x.dtype != param.dtype and (x.is_floating_point() or param.is_floating_point()):
        return f"cast {names.x} to the module's dtype, {param.dtype} (e.g. `x.to({param.dtype})`)"
    return f"give {names.x} the shape and dtype the module's forward expects"


def _loss_pairs(loss: Any, outputs: Any, targets: Any, names: _Names) -> list[tuple[str | None, Any, Any, _Names]]:
    """(named loss, output, target, names) for each output a loss applies to, for the rules."""
    if isinstance(loss, OutputLosses) or (is_structure(targets) and is_structure(outputs)):
        plan = loss.losses_for(outputs) if isinstance(loss, OutputLosses) else [
            (i, n, loss, 1.0) for i, n in enumerate(output_names(outputs))]
        all_names = output_names(outputs)
        pairs = []
        for index, name, one, _ in plan:
            target = pick(targets, name if isinstance(targets, dict) else index, all_names) if is_structure(
                targets) else targets
            pairs.append((_named(one), pick(outputs, index), target, names.for_output(name)))
        return pairs
    return [(_named(loss), single_output(outputs, targets), targets, names)]


def _check_rules(named: str | None, outputs: Any, target: Any, names: _Names, stats: dict[str, float]) -> None:
    kind = LOSS_KINDS.get(named or "")
    if not (kind and named and isinstance(outputs, torch.Tensor) and isinstance(target, torch.Tensor)):
        return  # (a kind is a named loss's)
    if kind == "class":
        _check_class_targets(named, outputs, target, names, stats)
        return
    _check_same_shape(named, outputs, target, names)
    if kind == "binary":
        _check_binary_range(named, stats, names)


def _check_class_targets(named: str, outputs: torch.Tensor, target: torch.Tensor, names: _Names,
                         stats: dict[str, float]) -> None:
    """Class indices of shape (N, d1...) in [0, C), or class probabilities of the outputs' shape."""
    loss = f"`loss`={named!r}"
    if outputs.dim() < 2:
        raise ValueError(
            f"{loss} needs outputs of shape (N, C), one score per class, but the module returned shape "
            f"{_shape(outputs)}: make its last layer output C class scores (or use loss='binary_crossentropy' for "
            "one logit per sample)"
        )
    classes, wanted = outputs.shape[1], (outputs.shape[0], *outputs.shape[2:])
    if named == "sparse_categorical_crossentropy":  # Keras' name takes (N, 1) indices too: the loss squeezes them
        target = sparse_targets(outputs, target)
    if target.is_floating_point():
        if target.shape == outputs.shape:  # class probabilities (one-hot rows)
            return
        raise ValueError(
            f"{names.y} hold{names.ys} floats of shape {_shape(target)} but {loss} needs integer class indices of shape "
            f"{tuple(wanted)} or class probabilities of the outputs' shape {_shape(outputs)}; likely fix: pass "
            "`y.long()` (NumPy: `y.astype('int64')`)"
        )
    if tuple(target.shape) != tuple(wanted):
        column = target.dim() == outputs.dim() and target.shape[-1] == 1 and target.shape[:-1] == wanted
        fix = f"reshape y to {tuple(wanted)} with `y.reshape(-1)`" if column else f"pass labels of shape {tuple(wanted)}"
        raise ValueError(
            f"{names.y} ha{'s' if names.ys else 've'} shape {_shape(target)} but {loss} needs one class index per sample, shape "
            f"{tuple(wanted)}, for outputs of shape {_shape(outputs)}; likely fix: {fix}"
        )
    if target.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{names.y} hold{names.ys} {target.dtype} class labels but {loss} needs torch.int64 class indices: "
                        "pass `y.long()` (NumPy: `y.astype('int64')`)")
    low, high = stats.get("y_min"), stats.get("y_max")
    if low is not None and low < 0:
        raise ValueError(
            f"{names.y} hold{names.ys} negative class labels (down to {int(low)}) but {loss} needs labels in [0, {classes}) "
            f"({IGNORE_INDEX} marks a sample to ignore); likely fix: map the labels to 0..{classes - 1}"
        )
    if high is not None and high >= classes:
        raise ValueError(
            f"{names.y} hold{names.ys} class labels up to {int(high)} but the module outputs {classes} class scores (outputs "
            f"of shape {_shape(outputs)}), so {loss} needs labels in [0, {classes}); likely fix: make the last layer "
            f"output {int(high) + 1} classes, or map the labels to 0..{classes - 1}"
        )


def _check_same_shape(named: str, outputs: torch.Tensor, target: torch.Tensor, names: _Names) -> None:
    """Binary and regression losses compare outputs and targets element by element."""
    if target.shape == outputs.shape:
        return
    if target.dim() == outputs.dim() - 1 and outputs.shape[-1] == 1 and target.shape == outputs.shape[:-1]:
        return  # outputs (N, 1), targets (N,): the loss squeezes the outputs, as Keras does
    out, got = _shape(outputs), _shape(target)
    if target.dim() == outputs.dim() - 1 and outputs.shape[-1] == 1 and target.shape == outputs.shape[:-1]:
        fix = f"reshape y to {out} with `y.reshape(-1, 1)` (or `y[:, None]`)" if target.dim() == 1 else (
            f"reshape y to {out} with `y.unsqueeze(-1)`")
    elif outputs.dim() == target.dim() - 1 and target.shape[-1] == 1 and target.shape[:-1] == outputs.shape:
        fix = f"reshape y to {out} with `y.reshape(-1)`, or make the module output shape {got}"
    else:
        fix = f"pass targets of shape {out}, or make the module output shape {got}"
    raise ValueError(
        f"{names.y} ha{'s' if names.ys else 've'} shape {got} but the module's outputs have shape {out}: `loss`={named!r} needs targets of the "
        f"outputs' shape (it does not broadcast); likely fix: {fix}"
    )


def _check_binary_range(named: str, stats: dict[str, float], names: _Names) -> None:
    low, high = stats.get("y_min"), stats.get("y_max")
    if low is not None and high is not None and (low < 0 or high > 1):  # read together
        raise ValueError(
            f"{names.y} hold{names.ys} values from {low:g} to {high:g} but `loss`={named!r} needs targets in [0, 1] (0/1 labels "
            "or probabilities); likely fix: for class indices use loss='cross_entropy' with one output per class"
        )


def _check_metrics(specs: Any, outputs: Any, target: Any, names: _Names) -> None:
    """Metric callables (not names, not metric objects) return a scalar tensor or a number."""
    for spec in specs:
        if isinstance(spec, LossParts):
            continue
        if isinstance(spec, OutputMetric):
            preds, tgt = spec.select(outputs, target)
            spec, metric_names = spec.spec, names.for_output(spec.output)
        else:
            preds, tgt, metric_names = outputs, target, names
            if is_structure(preds) and not is_structure(target):
                preds = single_output(preds, target, what="metrics")
        preds = preds.detach() if isinstance(preds, torch.Tensor) else preds
        _check_metric(spec, preds, tgt, metric_names)


def _check_metric(spec: Any, preds: Any, target: Any, names: _Names) -> None:
    if isinstance(spec, Weighted):
        spec = spec.spec
    if isinstance(spec, str) or not callable(spec) or (hasattr(spec, "update") and hasattr(spec, "compute")):
        return
    if is_keras_metric(spec) or keras_order(spec):  # Keras' objects and per-sample functions: run as Keras runs them
        return
    name = metric_name(spec)
    try:
        value = spec(preds, target)
    except Exception as err:
        raise ValueError(
            f"metric `{name}` in `metrics` raised on the first batch of `{names.name}`: predictions "
            f"{_describe(preds)}, {names.y} {_describe(target)}; likely fix: make it take (predictions, targets) "
            f"of these shapes and return one number ({error_line(err)})"
        ) from err
    tensor = isinstance(value, torch.Tensor)
    if (tensor and value.numel() == 1) or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        return
    got = f"a tensor of shape {_shape(value)}" if tensor else type(value).__name__
    raise TypeError(
        f"metric `{name}` in `metrics` returned {got} on the first batch of `{names.name}`: a metric callable "
        "must return a scalar tensor or a number (reduce per-sample values, e.g. with `.mean()`)"
    )


