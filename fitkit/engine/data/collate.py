"""Per-sample data, as a Hugging Face dataset gives it: a list (or map-style dataset) of dicts,
one per sample, batched with HF's default collation::

    samples = [{"input_ids": [5, 7, 9], "label": 1}, {"input_ids": [4, 2, 8], "label": 0}]
    is_sample_list(samples)           # True
    default_data_collator(samples)    # {"labels": tensor([1, 0]), "input_ids": tensor([[5, 7, 9], [4, 2, 8]])}

`loader_options(args, dataset)` is what the `DataLoader` fitkit builds over a Dataset gets from
the run's arguments: `data_collator` (default: HF's `DataCollatorWithPadding` for a
`processing_class` tokenizer, else the collation above for dict samples, an iterable dataset's
included), `dataloader_num_workers` and `dataloader_pin_memory`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate


def _is_batched(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 1


def is_sample_list(x: Any) -> bool:
    """True for a non-empty sequence (a list, or a map-style dataset that is not a torch one, such
    as a `datasets.Dataset`) whose first item is a dict of one sample's values: some value is a
    number, a list or a 0-d tensor. A dict whose values are all batched tensors is a batch."""
    if isinstance(x, (DataLoader, Dataset, str, bytes, dict, tuple)):
        return False
    if not (hasattr(x, "__len__") and hasattr(x, "__getitem__")):
        return False
    if not isinstance(x, list) and not hasattr(type(x), "__iter__"):
        return False  # Keras' batch-centric protocol (`fitkit.engine.data.keras_data`): decided without a read
    if type(x).__module__.startswith("datasets.") and hasattr(x, "column_names"):
        # a `datasets.Dataset`'s rows are samples: decided without a read, which would run its
        # transform (`set_transform`: a random flip draws) once more than the run does
        return len(x) > 0
    try:
        if len(x) == 0:
            return False
        first = x[0]
    except (TypeError, KeyError, IndexError):
        return False
    return isinstance(first, Mapping) and bool(first) and not all(_is_batched(v) for v in first.values())


class SampleList(Dataset):
    """A sequence of per-sample dicts as a map-style torch Dataset."""

    def __init__(self, samples: Sequence[Mapping[str, Any]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Mapping[str, Any]:
        return self.samples[int(index)]

    def __getitems__(self, indices: list[int]) -> list[Mapping[str, Any]]:
        """A batch's samples in one read where the samples have one (a `datasets.Dataset`'s
        `__getitems__`: one Arrow slice instead of a row read per sample, as a `DataLoader` over
        the dataset itself reads it); the same dicts either way."""
        keys = [int(i) for i in indices]
        read = getattr(self.samples, "__getitems__", None)
        if read is not None and type(self).__getitem__ is SampleList.__getitem__:
            return read(keys)
        return [self[i] for i in keys]


def _stack(values: list) -> torch.Tensor:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values)
    if isinstance(first, np.ndarray):
        return torch.from_numpy(np.stack(values))
    return torch.tensor(values)


def default_data_collator(features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """HF's default collation: each key's values stacked into one tensor (strings and None left
    out); `label` (or `label_ids`) becomes `labels`, as int64 for integer labels and float32 else."""
    first = features[0]
    batch: dict[str, torch.Tensor] = {}
    for key in ("label", "label_ids"):
        value = first.get(key)
        if value is None:
            continue
        sample = value.item() if isinstance(value, torch.Tensor) and value.dim() == 0 else value
        labels = _stack([f[key] for f in features])
        if not isinstance(value, torch.Tensor):
            integral = isinstance(sample, (int, np.integer)) or (
                isinstance(sample, (list, np.ndarray)) and np.asarray(sample).dtype.kind in "iu")
            labels = labels.long() if integral else labels.float()
        batch["labels"] = labels
        break
    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        batch[key] = _stack([f[key] for f in features])
    return batch


def collate_samples(features: list[Any]) -> Any:
    """The collation of an iterable dataset fitkit batches (its samples are only seen as they
    come): dict samples as HF's default collation (`default_data_collator`, as the Trainer
    batches any dataset), others as torch's `default_collate`."""
    if features and isinstance(features[0], Mapping):
        return default_data_collator(features)
    return default_collate(features)


def loader_options(args: Any, dataset: Any) -> dict[str, Any]:
    """`DataLoader` keyword arguments for a loader fitkit builds over `dataset` under `args`."""
    from fitkit.config.hf_processing import default_collator

    options: dict[str, Any] = {}
    collator = default_collator(args)  # data_collator, else HF's padding collator for processing_class
    if collator is not None:
        options["collate_fn"] = collator
    elif isinstance(dataset, SampleList) or _first_is_a_dict(dataset):
        options["collate_fn"] = default_data_collator
    elif isinstance(dataset, IterableDataset):
        options["collate_fn"] = collate_samples
    workers = getattr(args, "dataloader_num_workers", 0) or 0
    if workers:
        options["num_workers"] = workers
        if getattr(args, "dataloader_persistent_workers", False):
            options["persistent_workers"] = True
        for name in ("prefetch_factor", "multiprocessing_context"):
            if getattr(args, "dataloader_" + name, None) is not None:
                options[name] = getattr(args, "dataloader_" + name)
    if not getattr(args, "dataloader_in_order", True):
        options["in_order"] = False
    if getattr(args, "dataloader_pin_memory", False) and torch.cuda.is_available():  # pinning needs a GPU
        options["pin_memory"] = True
    if getattr(args, "dataloader_drop_last", False):  # HF's: training and evaluation loaders alike
        options["drop_last"] = True
    return options


def _first_is_a_dict(dataset: Any) -> bool:
    try:
        return len(dataset) > 0 and isinstance(dataset[0], Mapping)
    except Exception:  # noqa: BLE001 - an iterable or odd dataset: keep torch's collation
        return False
