"""Small helpers over nested outputs (a tensor, or dicts / tuples / lists of them)."""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
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


def map_leaves(fn: Callable[[Any], Any], tree: Any, match: Callable[[Any], bool]) -> Any:
    """Apply `fn` to every value of `tree` that `match`es, through mappings (their own type kept,
    a `defaultdict`'s factory too), lists, tuples, named tuples and dataclass instances (copied),
    as Lightning Fabric walks a collection; other values pass through unchanged::

        map_leaves(lambda t: t.item(), {"a": torch.tensor(1.5), "b": [2]}, lambda v: isinstance(v, torch.Tensor))
        # {"a": 1.5, "b": [2]}
    """
    if match(tree):
        return fn(tree)
    kind = type(tree)
    if isinstance(tree, Mapping):
        items = [(key, map_leaves(fn, value, match)) for key, value in tree.items()]
        if isinstance(tree, defaultdict):
            return kind(tree.default_factory, items)
        return kind(items)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple takes its fields by position
        return kind(*(map_leaves(fn, value, match) for value in tree))
    if isinstance(tree, (list, tuple)):
        return kind([map_leaves(fn, value, match) for value in tree])
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        result = copy.copy(tree)
        for field in dataclasses.fields(tree):  # set directly: a frozen dataclass is walked too
            object.__setattr__(result, field.name, map_leaves(fn, getattr(tree, field.name), match))
        return result
    return tree
