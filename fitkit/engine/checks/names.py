"""How the checks' messages name things: a source's features and targets (`_Names`), shapes,
dtypes and layers, and the module facts the messages quote (its first layer, its dtype).

    names = _Names("validation_data", in_memory=True)
    names.y   # 'the targets of `validation_data`'
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.adapters.losses import Loss
from fitkit.engine.data.batch import Batch

IGNORE_INDEX = -100  # a class label that F.cross_entropy and F.nll_loss skip
_INDEX_DTYPES = (torch.int64, torch.uint8)  # the class index dtypes F.cross_entropy takes
_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


def keeps_float64(module: torch.nn.Module) -> bool:
    """True when `module` computes in float64: its float64 input is then not cast to float32."""
    param = next(module.parameters(), None)
    return param is not None and param.dtype == torch.float64


def first_layer(module: torch.nn.Module) -> torch.nn.Module | None:
    """The first submodule (in registration order) holding parameters of its own."""
    for sub in module.modules():
        if next(sub.parameters(recurse=False), None) is not None:
            return sub
    return None


class _Names:
    """How messages name the features and targets of a source: `x` / `y` for in-memory training
    data, "the inputs of `validation_data`" and so on otherwise."""

    def __init__(self, name: str, in_memory: bool):
        self.name = name
        self.x = f"`{name}`" if name == "x" else f"the inputs of `{name}`"
        self.y = "`y`" if name == "x" and in_memory else f"the targets of `{name}`"
        self.s = "s" if name == "x" else ""  # `x` holds, the inputs of `validation_data` hold
        self.ys = "s" if self.y == "`y`" else ""

    def for_output(self, output: str) -> _Names:
        """The names for one output's targets: "the targets of output 'cls' in `y`"."""
        names = _Names(self.name, False)
        names.x, names.s = self.x, self.s
        names.y, names.ys = f"the targets of output {output!r} in {self.y}", ""
        return names


# -- small helpers -------------------------------------------------------------------------------
def _named(loss: Loss | None) -> str | None:
    spec = getattr(loss, "spec", None)
    return spec if isinstance(spec, str) else None


def _single_input(batch: Batch) -> torch.Tensor | None:
    inputs = batch.inputs
    if isinstance(inputs, tuple) and len(inputs) == 1 and isinstance(inputs[0], torch.Tensor):
        return inputs[0]
    return None


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _layer(layer: torch.nn.Module | None) -> str:
    if layer is None:
        return "the module itself"
    extra = layer.extra_repr().splitlines()
    return f"{type(layer).__name__}({extra[0] if len(extra) == 1 else ''})"


def _describe(value: Any) -> str:
    """`of shape (32, 8) dtype torch.float32`, or each part of a tuple or dict of them."""
    if isinstance(value, torch.Tensor):
        return f"of shape {_shape(value)} dtype {value.dtype}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            return _describe(value[0])
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return f"of type {type(value).__name__}"
