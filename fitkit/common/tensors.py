"""Small helpers over nested outputs (a tensor, or dicts / tuples / lists of them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def map_tensors(fn: Callable[[torch.Tensor], Any], tree: Any) -> Any:
    """Apply `fn` to every tensor in `tree`, keeping its structure; other values pass through."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: map_tensors(fn, v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(map_tensors(fn, v) for v in tree)
    return tree


def to_cpu(tree: Any) -> Any:
    """Detached CPU copies of every tensor in `tree`."""
    return map_tensors(lambda t: t.detach().cpu(), tree)


def tensors_of(tree: Any) -> list[torch.Tensor]:
    """The tensors in `tree`, depth first."""
    found: list[torch.Tensor] = []
    map_tensors(found.append, tree)
    return found
