"""Hugging Face's `remove_unused_columns`: the columns of a dataset that the module's `forward`
does not name are dropped before collation, so that a tokenized dataset that still holds `text`
and `idx` trains as it does under the HF Trainer::

    ds = datasets.Dataset.from_dict({"text": [...], "label": [...], "idx": [...]}).map(tokenize, batched=True)
    kept = drop_unused_columns(ds, bert, args)      # input_ids, token_type_ids, attention_mask, label

Label columns are always kept (`label`, `labels`, `label_ids`, fitkit's other target keys,
`args.label_names`), and `sample_weight` too. The names dropped are logged once, at info level,
on the "fitkit" logger. What is dropped: a `datasets.Dataset`'s columns (`remove_columns`, no
copy of the data), or the keys of per-sample dicts (a list of dicts, or a map-style torch
`Dataset` yielding dicts, read through a view), or of the dicts an iterable dataset yields (a
torch or `datasets` `IterableDataset`, filtered as they are yielded, as HF's
`RemoveColumnsCollator` does for it; the dataset's own attributes, its `state_dict` among them,
stay reachable). A forward that names no parameter (only `*args` / `**kwargs`), a `DataLoader`
and in-memory tensors are left as they are; `remove_unused_columns=False` keeps every column.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fitkit.common.options import LABEL_KEYS
from fitkit.engine.data.collate import SampleList, is_sample_list

logger = logging.getLogger("fitkit")

#: Keys kept whatever the forward takes: HF's label columns, fitkit's target keys, sample weights.
ALWAYS_KEPT = ("label", "labels", "label_ids", *LABEL_KEYS, "sample_weight")

_logged: set[tuple] = set()  # (argument, module class, dropped names) already logged


def forward_names(module: torch.nn.Module) -> set[str] | None:
    """The parameter names `module.forward` takes by name (not `*args` / `**kwargs`), or None
    when there are none or the signature cannot be read (then nothing is dropped)."""
    inner = getattr(module, "_orig_mod", module)  # a torch.compile'd module: its original's forward
    if "forward" not in inner.__dict__:  # the class's forward: its names read once per class
        cls = type(inner)
        names = _BY_CLASS.get(cls, _UNREAD)
        if names is _UNREAD:
            names = _BY_CLASS[cls] = _names_of(inner.forward)
    else:
        names = _names_of(inner.forward)
    return set(names) if names is not None else None


_UNREAD: Any = object()
_BY_CLASS: weakref.WeakKeyDictionary[type, frozenset[str] | None] = weakref.WeakKeyDictionary()


def _names_of(forward: Any) -> frozenset[str] | None:
    try:
        params = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return None
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return names or None


class KeptColumns(SampleList):
    """Per-sample dicts seen with only some of their keys (a view: nothing is copied)."""

    def __init__(self, samples: Any, keep: list[str]) -> None:
        super().__init__(samples)
        self.keep = keep

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = self.samples[int(index)]
        return {k: sample[k] for k in self.keep if k in sample}


class KeySelector:
    """Which keys of a sample to keep for a forward (`select(keys)`: the kept keys, or None to
    keep the sample as it is). Holds names only, so it goes with a dataset into worker processes."""

    def __init__(self, module: torch.nn.Module, args: Any, name: str) -> None:
        self.forward = forward_names(module) or set()
        self.allowed = self.forward | set(ALWAYS_KEPT) | set(getattr(args, "label_names", None) or ())
        self.name, self.module = name, type(getattr(module, "_orig_mod", module)).__name__
        self._known: dict[tuple, list[str] | None] = {}

    def select(self, keys: tuple) -> list[str] | None:
        if keys not in self._known:
            keep = [k for k in keys if k in self.allowed]
            dropped = [k for k in keys if k not in self.allowed]
            if dropped and not any(k in self.forward for k in keep):
                raise _nothing_kept(self.name, list(keys), self.module, self.forward)
            if dropped:
                _log_once(self.name, self.module, dropped)
            self._known[keys] = keep if dropped else None
        return self._known[keys]


class KeptKeys(IterableDataset):
    """An iterable dataset whose dict samples keep only the keys `selector` keeps. Every other
    attribute is the dataset's (`state_dict`, `load_state_dict`, `set_epoch`, ...)."""

    def __init__(self, dataset: IterableDataset, selector: KeySelector) -> None:
        self.dataset, self.selector = dataset, selector

    def __iter__(self):
        for sample in self.dataset:
            if isinstance(sample, Mapping):
                keep = self.selector.select(tuple(sample))
                if keep is not None:
                    sample = {k: sample[k] for k in keep}
            yield sample

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "selector"):  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.dataset, name)


class SizedKeptKeys(KeptKeys):
    """`KeptKeys` of an iterable dataset that knows its length."""

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


def drop_unused_columns(x: Any, module: torch.nn.Module, args: Any, name: str = "x") -> Any:
    """`x` without the columns `module.forward` does not take (see the module docstring)."""
    if not getattr(args, "remove_unused_columns", True) or isinstance(x, (DataLoader, torch.Tensor)):
        return x
    if forward_names(module) is None:
        return x
    selector = KeySelector(module, args, name)
    if isinstance(x, IterableDataset):
        wrapper = SizedKeptKeys if hasattr(x, "__len__") else KeptKeys
        return wrapper(x, selector)
    columns = _columns(x)
    if not columns:
        return x
    keep = selector.select(tuple(columns))
    if keep is None:
        return x
    if hasattr(x, "remove_columns") and hasattr(x, "column_names"):  # a datasets.Dataset
        return x.remove_columns([c for c in columns if c not in keep])
    return KeptColumns(x, keep)


def _nothing_kept(name: str, columns: list[str], module: str, forward: set[str]) -> ValueError:
    return ValueError(
        f"no column of `{name}` ({', '.join(columns)}) is an argument of {module}.forward "
        f"({', '.join(sorted(forward))}), so every input would be dropped: rename the columns to "
        "the forward's arguments, or pass remove_unused_columns=False to keep them")


def _columns(x: Any) -> list[str] | None:
    """The column names of a `datasets.Dataset`, or the keys of the first of per-sample dicts."""
    names = getattr(x, "column_names", None)
    if isinstance(names, list) and hasattr(x, "remove_columns"):
        return names
    if not (is_sample_list(x) or (isinstance(x, Dataset) and not isinstance(x, IterableDataset))):
        return None
    try:
        first = x[0] if len(x) else None
    except Exception:  # noqa: BLE001 - an odd dataset: leave it to the loader (and its error)
        return None
    return list(first) if isinstance(first, Mapping) else None


def _log_once(name: str, module: str, dropped: list[str]) -> None:
    key = (name, module, tuple(dropped))
    if key not in _logged:
        _logged.add(key)
        logger.info("the columns %s of `%s` are not arguments of %s.forward: dropped before collation "
                    "(remove_unused_columns=True; pass False to keep them)", ", ".join(dropped), name, module)
