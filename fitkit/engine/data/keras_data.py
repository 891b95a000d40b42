"""Keras' data extras: `class_weight` (a per-class weight table) and `validation_split`
(the last fraction of the samples, taken before shuffling)::

    table = class_weight_table({0: 1.0, 1: 5.0}, device)
    class_weights_for(table, target)                            # one weight per sample
    (tx, ty, tsw), (vx, vy, vsw) = split_validation((x, y, None), x, 0.2)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Subset

from fitkit.common.tensors import map_tensors
from fitkit.engine.data.batch import batch_size_of
from fitkit.engine.data.sampling import epoch_permutation


def class_weight_table(class_weight: dict, device: torch.device) -> torch.Tensor:
    """Keras' `class_weight` dict as a table indexed by class (classes not named weigh 1)."""
    if not isinstance(class_weight, dict) or not class_weight:
        raise ValueError("`class_weight` must be a non-empty dict {class index: weight}")
    for key, value in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or int(key) < 0:
            hint = (" (a dict by output name is not Keras' form: `class_weight` is for a model with one output; "
                    "for several, pass `sample_weight` per output)" if isinstance(value, dict) else "")
            raise ValueError(f"`class_weight` keys are class indices (ints from 0), as in Keras; got {key!r}{hint}: "
                             "pass {0: 1.0, 1: 5.0, ...}, or weigh samples with `sample_weight`")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ValueError(f"`class_weight` values are numbers (the weight of each sample of that class); "
                             f"class {key} has {value!r}: pass {{{key}: 2.0}} and the like")
    size = max(int(k) for k in class_weight) + 1
    weights = torch.ones(size, dtype=torch.float32)
    for k, v in class_weight.items():
        weights[int(k)] = float(v)
    return weights.to(device)


def class_weights_for(table: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample weights from a class-weight table, read as Keras reads the targets: one-hot
    rows by their argmax, a column of size 1 by its value, values rounded to the nearest class;
    classes missing from the table weigh 1."""
    if not isinstance(target, torch.Tensor):
        raise ValueError("`class_weight` is for a model with one output (Keras refuses it for several): pass "
                         "`sample_weight` (one array, or one per output) instead")
    if target.dim() > 1:
        target = target.argmax(-1) if target.shape[-1] != 1 else target.squeeze(-1)
    target = target.round().long() if target.is_floating_point() else target.long()
    inside = (target >= 0) & (target < table.shape[0])
    return torch.where(inside, table[target.clamp(0, table.shape[0] - 1)], torch.ones((), device=table.device))


def _split_point(n: int, fraction: float) -> int:
    """Where Keras cuts `n` samples for `validation_split=fraction`; an error when either side
    would be empty (a fraction of less than one sample counts as empty, though the rounding
    would hand it one)."""
    if n < 2:
        raise ValueError(f"`validation_split` needs at least 2 samples to split; the data has {n}: pass `validation_data`")
    cut = int(n * (1.0 - fraction))
    if n * fraction < 1 or cut <= 0 or cut >= n:
        side = "validation" if n * fraction < 1 or cut >= n else "training"
        raise ValueError(
            f"`validation_split`={fraction} of {n} samples leaves the {side} split empty ({n * fraction:g} samples for "
            f"validation): pick a fraction between {1 / n:.3g} and {1 - 1 / n:.3g}, or pass `validation_data`"
        )
    return cut


def split_validation(tensors: tuple | None, x: Any, fraction: float) -> tuple[tuple, tuple]:
    """Keras' `validation_split`: the last `fraction` of the samples, taken before shuffling.

    Returns two `(x, y, sample_weight)` triples, train then validation: slices of the tensors
    for in-memory data, `(Subset, None, None)` for a map-style Dataset.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"`validation_split`={fraction!r} is invalid: pass a fraction in (0, 1)")
    if tensors is not None:
        n = batch_size_of(tensors[0])
        cut = _split_point(n, fraction)
        head = lambda t: t[:cut]  # noqa: E731
        tail = lambda t: t[cut:]  # noqa: E731
        return tuple(map_tensors(head, t) for t in tensors), tuple(map_tensors(tail, t) for t in tensors)
    if isinstance(x, Dataset) and not isinstance(x, IterableDataset):
        n = len(x)  # type: ignore[arg-type]
        cut = _split_point(n, fraction)
        return (Subset(x, range(cut)), None, None), (Subset(x, range(cut, n)), None, None)
    raise ValueError(
        "`validation_split` needs tensors, arrays or a map-style Dataset; pass `validation_data` for "
        f"a {type(x).__name__}"
    )


def has_numpy(tree: Any) -> bool:
    """True when `tree` (a batch) holds a NumPy array somewhere."""
    if isinstance(tree, dict):
        return any(has_numpy(v) for v in tree.values())
    if isinstance(tree, (tuple, list)):
        return any(has_numpy(v) for v in tree)
    return type(tree).__module__ == "numpy" and hasattr(tree, "shape")


def batch_tensors(tree: Any, cast_float64: bool = True) -> Any:
    """A batch with its NumPy arrays as tensors (float64 as float32, as in-memory arrays are,
    unless `cast_float64` is False); tensors and other values pass through."""
    if isinstance(tree, dict):
        return {k: batch_tensors(v, cast_float64) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(batch_tensors(v, cast_float64) for v in tree)
    if type(tree).__module__ == "numpy" and hasattr(tree, "shape"):
        t = torch.from_numpy(tree) if tree.dtype.kind in "biufc" else None
        if t is None:
            raise TypeError(f"a batch holds a NumPy array of dtype {tree.dtype}, which torch cannot take: pass numbers "
                            "(e.g. `x.astype('float32')`), or tensors")
        return t.float() if cast_float64 and t.dtype == torch.float64 else t
    return tree


def is_batch_sequence(x: Any) -> bool:
    """Keras' batch-centric data: an object with `__len__` and `__getitem__` returning whole
    batches and no `__iter__` of its own (a `keras.utils.PyDataset`), or a list of batches
    holding NumPy arrays."""
    if isinstance(x, (Dataset, str, bytes, dict, tuple)) or not (hasattr(x, "__len__") and hasattr(x, "__getitem__")):
        return False
    if isinstance(x, list):
        return bool(x) and isinstance(x[0], (tuple, list, dict)) and has_numpy(x[0])
    return not hasattr(type(x), "__iter__") or is_py_dataset(x)


def is_py_dataset(x: Any) -> bool:
    """True for a `keras.utils.PyDataset` (or Keras' older `Sequence`), a user's subclass
    included: one of its classes comes from Keras."""
    return any(k.__module__.startswith("keras") and k.__name__ in ("PyDataset", "Sequence", "PyDatasetAdapter")
               for k in type(x).__mro__)


def batch_count(seq: Any, name: str) -> int:
    """The batches of one pass: `num_batches` (Keras 3's `PyDataset`, which falls back on
    `__len__`), else `len(seq)`."""
    count = seq.num_batches if is_py_dataset(seq) else len(seq)
    if count is None:
        raise ValueError(f"`{name}` is a PyDataset without an end (`num_batches` is None): give it a `num_batches`, "
                         "or wrap it in a torch IterableDataset and pass `steps_per_epoch`")
    return int(count)


class BatchSequence:
    """Whole batches read by index (`seq[i]` for i in `range(len(seq))`), NumPy arrays turned
    into tensors; a `keras.utils.PyDataset`'s (a subclass's) `on_epoch_begin` / `on_epoch_end`
    are called around each pass, as Keras does. With `shuffle`, each pass reads the batches in
    a shuffled order, as Keras' `shuffle=True` does (epoch `e`'s order is drawn from its own
    generator seeded with `seed + e`, so a resume rebuilds it; the global RNG is not touched)::

        source = LoaderSource(BatchSequence(py_dataset, "x", shuffle=True, seed=0))
    """

    def __init__(self, seq: Any, name: str, cast_float64: bool = True, *, shuffle: bool = False,
                 seed: int | None = None):
        self.seq, self.name, self.cast_float64 = seq, name, cast_float64
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """The pass that comes next (its shuffled order)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return batch_count(self.seq, self.name)

    def __iter__(self):
        begin, end = getattr(self.seq, "on_epoch_begin", None), getattr(self.seq, "on_epoch_end", None)
        if callable(begin):
            begin()
        try:
            count = len(self)
            order = epoch_permutation(count, self.seed, self.epoch).tolist() if self.shuffle else range(count)
            for i in order:
                batch = self.seq[i]
                if not isinstance(batch, (tuple, list, dict, torch.Tensor)) and not has_numpy(batch):
                    raise TypeError(f"batch {i} of `{self.name}` is a {type(batch).__name__}: each item must be a "
                                    "whole batch, (x, y), (x, y, sample_weight) or a dict, of tensors or NumPy arrays")
                yield batch_tensors(batch, self.cast_float64)
        finally:  # also a pass the loop leaves early (`steps_per_epoch`, a stop): each begin has its end
            if callable(end):
                end()
