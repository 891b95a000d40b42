"""`Batch`: one batch as the loop sees it, and `split_batch`, which makes one from what a
loader or iterable yields::

    split_batch((x, y))                      # Batch(inputs=(x,), target=y, sample_weight=None, size=len(x))
    split_batch({"input_ids": ids, "labels": y})   # keyword inputs, target from "labels"

Any `Mapping` batch (a dict, or the `BatchEncoding` HF's collators return) is a keyword batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from fitkit.common.options import LABEL_KEYS


class Batch(NamedTuple):
    """`inputs` are the module's positional (a tuple) or keyword (a dict) arguments; `size` is
    the number of samples."""

    inputs: tuple | dict
    target: Any
    sample_weight: torch.Tensor | None
    size: int


def first_leaf(tree) -> torch.Tensor:
    """The first tensor of an input: itself, a dict's first value or a sequence's first item."""
    if isinstance(tree, dict):
        return next(iter(tree.values()))
    if isinstance(tree, (tuple, list)):
        return tree[0]
    return tree


def batch_size_of(tree) -> int:
    t = first_leaf(tree)
    return int(t.shape[0]) if isinstance(t, torch.Tensor) and t.dim() else 1


def split_batch(batch: Any) -> Batch:
    """Normalise one batch from a loader or iterable into `Batch`."""
    if type(batch) in (tuple, list) and len(batch) == 2 and type(batch[0]) is torch.Tensor and batch[0].dim():
        return Batch((batch[0],), batch[1], None, batch[0].shape[0])  # the common (x, y) case, first
    if isinstance(batch, Mapping):  # a dict, or HF's BatchEncoding (a UserDict): keyword inputs
        named = dict(batch)
        sw = named.pop("sample_weight", None)
        target = None
        for key in LABEL_KEYS:
            if key in named:
                target = named.pop(key)
                break
        return Batch(named, target, sw, batch_size_of(named))
    if isinstance(batch, (tuple, list)):
        if len(batch) == 1:
            return Batch((batch[0],), None, None, batch_size_of(batch[0]))
        if len(batch) in (2, 3):
            x = batch[0]
            inputs = dict(x) if isinstance(x, Mapping) else (tuple(x) if isinstance(x, (tuple, list)) else (x,))
            return Batch(inputs, batch[1], batch[2] if len(batch) == 3 else None, batch_size_of(x))
        raise ValueError(
            f"a batch must be x, (x,), (x, y), (x, y, sample_weight) or a dict; got a sequence of {len(batch)} items"
        )
    return Batch((batch,), None, None, batch_size_of(batch))


def keras_x(inputs: tuple | dict) -> Any:
    """The `x` of a batch as Keras hands it to a step: the tensor itself for one input."""
    if isinstance(inputs, tuple) and len(inputs) == 1:
        return inputs[0]
    return inputs


def as_data(batch: Batch) -> Any:
    """A batch as the data yields it: `(x, y)`, `(x, y, sample_weight)`, `(x,)` or a dict
    (targets under "labels", weights under "sample_weight")."""
    if isinstance(batch.inputs, dict):
        data = dict(batch.inputs)
        if batch.target is not None:
            data["labels"] = batch.target
        if batch.sample_weight is not None:
            data["sample_weight"] = batch.sample_weight
        return data
    x = keras_x(batch.inputs)
    if batch.target is None:
        return (x,)
    if batch.sample_weight is None:
        return (x, batch.target)
    return (x, batch.target, batch.sample_weight)
