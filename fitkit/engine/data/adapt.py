"""Inputs -> batches: any accepted input adapted into a `DataSource` (`fitkit.engine.data.sources`).

Every accepted input becomes a `DataSource` whose `batches(epoch)` yields `Batch`es:
`(inputs, target, sample_weight)` where `inputs` is a tuple of positional arguments or a dict
of keyword arguments for the module.

In-memory data (tensors, NumPy arrays, `(x, y[, sample_weight])` tuples) is batched by
slicing: one `index_select` per tensor per batch when shuffling, a view when not. That skips
the per-sample `__getitem__` and collation a `DataLoader` over a `TensorDataset` pays.
Datasets and DataLoaders go through a `DataLoader` (Fabric adds the distributed sampler).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fitkit.engine.data.batch import batch_size_of
from fitkit.engine.data.collate import SampleList, is_sample_list, loader_options
from fitkit.engine.data.keras_data import BatchSequence, is_batch_sequence
from fitkit.engine.data.length_groups import LengthGroups, sample_lengths
from fitkit.engine.data.loader_source import LoaderSource
from fitkit.engine.data.prefetch import MIN_STEP_S, can_prefetch
from fitkit.engine.data.rebalance import TRAINER_SEED, RebalanceSampler
from fitkit.engine.data.sampling import EpochSampler, process_group
from fitkit.engine.data.sources import DataSource, TensorSource
from fitkit.engine.data.trainer_order import seed_worker


def _to_tensor(value: Any, name: str, cast_float64: bool = True) -> torch.Tensor:
    """A tensor of `value` (a tensor or NumPy array). float64 becomes float32, as Keras casts
    float64 input, unless `cast_float64` is False (a module whose parameters are float64)."""
    if isinstance(value, torch.Tensor):
        t = value
    else:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy ships with torch installs
            is_array = False
        else:
            is_array = isinstance(value, np.ndarray)
        if not is_array:
            raise TypeError(f"`{name}` must be a tensor or NumPy array here; got {type(value).__name__}")
        t = torch.from_numpy(value)
    # Integer labels keep their type.
    return t.float() if cast_float64 and t.dtype == torch.float64 else t


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or type(value).__module__ == "numpy" and hasattr(value, "shape")


def _leaves(value) -> list:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _check_len(x, y, sample_weight) -> None:
    n = batch_size_of(x)
    if n == 0:
        raise ValueError("`x` is empty: pass at least one sample")
    for leaf in _leaves(x):
        if batch_size_of(leaf) != n:
            raise ValueError(f"all inputs in `x` must have the same number of samples; got {n} and {batch_size_of(leaf)}")
    for leaf in _leaves(y) if y is not None else ():
        if batch_size_of(leaf) != n:
            raise ValueError(
                f"`x` has {n} samples but `y` has {batch_size_of(leaf)}: pass `x` and `y` (each of its arrays) with the "
                "same first dimension"
            )
    for leaf in _leaves(sample_weight) if sample_weight is not None else ():
        if batch_size_of(leaf) != n:
            raise ValueError(f"`sample_weight` has {batch_size_of(leaf)} entries for {n} samples: pass one per sample")


def _arrays(value, name: str, cast_float64: bool = True):
    if isinstance(value, dict):
        return {k: _to_tensor(v, f"{name}[{k!r}]", cast_float64) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return tuple(_to_tensor(v, f"{name}[{i}]", cast_float64) for i, v in enumerate(value))
    return _to_tensor(value, name, cast_float64)


def _is_arrays(value: Any) -> bool:
    """An array, or a non-empty list, tuple or dict of arrays (Keras' multi-input / output data)."""
    return _is_array(value) or _in_memory(value)


def _in_memory(x) -> bool:
    if _is_array(x):
        return True
    if isinstance(x, dict) and x:
        return all(_is_array(v) for v in x.values())
    if isinstance(x, (tuple, list)) and x:
        return all(_is_array(v) for v in x)
    return False


def adapt(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int | None = None,
    name: str = "x",
    cast_float64: bool = True,
    args: Any = None,
    training: bool = False,
) -> tuple[DataSource | None, tuple | None]:
    """Turn user input into a `DataSource` named `name` (the argument it came from).

    Returns the source and, for in-memory data, the `(x, y, sample_weight)` tensors (so a
    validation split can be taken). `x` may be an `(x, y[, sample_weight])` tuple itself.
    In-memory float64 values become float32 unless `cast_float64` is False. A list of per-sample
    dicts is a Dataset (`fitkit.engine.data.collate`); `args` (the run's `TrainingArguments`) gives the
    DataLoader fitkit builds over a Dataset its `data_collator` and `dataloader_*` options, and its
    `data_order`; `training`: the data of a fit's training (its workers are seeded as the Trainer's).
    """
    source, tensors = _adapt(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed, name=name,
                             cast_float64=cast_float64, args=args, training=training)
    source.name = name
    if isinstance(source, LoaderSource) and training and getattr(args, "steps_per_epoch", None) is not None:
        # Keras' epoch iterator reads a stream on across epochs (a loader with a length: each
        # epoch's first batches, `docs/migrating-from-keras.md`)
        source.continues = not source.has_len()
    if isinstance(source, LoaderSource):
        source.prefetch = getattr(args, "prefetch", True) and can_prefetch(source.loader)
        if not training:  # evaluation and prediction: a forward alone rarely hides a read
            source.min_step_s = MIN_STEP_S
    return source, tensors


def _adapt(x: Any, y: Any, sample_weight: Any, *, batch_size: int, shuffle: bool, seed: int | None, name: str,
           cast_float64: bool, args: Any = None, training: bool = False) -> tuple[DataSource, tuple | None]:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"`batch_size`={batch_size!r} is invalid: pass an integer > 0")
    if x is None:
        raise ValueError(f"`{name}` is required: pass tensors, arrays, a Dataset or a DataLoader")
    if isinstance(x, (list, tuple)) and not x:
        raise ValueError(f"`{name}` is an empty {type(x).__name__}: pass at least one sample (tensors, arrays, a "
                         "Dataset, a DataLoader or a non-empty list of batches)")
    if y is None and isinstance(x, tuple) and len(x) in (2, 3) and _is_arrays(x[0]) and all(
        v is None or _is_arrays(v) for v in x[1:]
    ):
        x, y, sample_weight = (*x, None)[:3] if len(x) == 2 else x
    if _in_memory(x):
        x = _arrays(x, name, cast_float64)
        y = _arrays(y, "y", cast_float64) if y is not None else None
        sample_weight = _arrays(sample_weight, "sample_weight", cast_float64) if sample_weight is not None else None
        _check_len(x, y, sample_weight)
        strategy = getattr(args, "train_sampling_strategy", "random")
        if training and strategy in ("group_by_length", "batch_rebalance"):
            raise ValueError(f"`train_sampling_strategy`={strategy!r} batches the samples of a Dataset by length; "
                             f"`{name}` holds arrays, whose samples all have one length: pass a Dataset of dicts "
                             "(a `datasets.Dataset`, a list of dicts), or train_sampling_strategy='random'")
        source = TensorSource(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed)
        source.draws = getattr(args, "data_order", "fitkit") == "trainer"
        return source, (x, y, sample_weight)
    if y is not None:
        raise ValueError(
            f"`y` can only be given with tensors or arrays as `{name}`; a {type(x).__name__} must yield (x, y) itself"
        )
    if sample_weight is not None:
        raise ValueError("`sample_weight` can only be given with in-memory `x`; yield (x, y, sample_weight) batches instead")
    if isinstance(x, DataLoader):
        if len(x.dataset) == 0 if hasattr(x.dataset, "__len__") else False:
            raise ValueError(f"`{name}` is an empty DataLoader: it yields no batch")
        n = len(x.dataset) if hasattr(x.dataset, "__len__") else None
        return LoaderSource(x, num_samples=n), None
    if is_sample_list(x):
        x = SampleList(x)
    elif is_batch_sequence(x):
        # Keras shuffles a PyDataset's batch order; a list of batches is read as listed, as an iterable is
        shuffled = shuffle and not isinstance(x, list)
        return LoaderSource(BatchSequence(x, name, cast_float64, shuffle=shuffled, seed=seed)), None
    if isinstance(x, Dataset):
        return _dataset_source(x, batch_size=batch_size, shuffle=shuffle, seed=seed, name=name, args=args,
                               training=training), None
    if isinstance(x, Iterable) and not isinstance(x, (str, bytes)):
        if iter(x) is x and not (training and getattr(args, "steps_per_epoch", None) is not None):
            raise TypeError(
                f"`{name}` is a one-shot iterator (a generator), which one epoch would use up: pass `steps_per_epoch` "
                "(each epoch then reads on from it, as in Keras), or a re-iterable (a list of batches, a Dataset or a "
                "DataLoader)")
        return LoaderSource(x), None
    raise TypeError(
        f"`{name}` must be a tensor, NumPy array, (x, y) tuple, Dataset, DataLoader or re-iterable of batches; "
        f"got {type(x).__name__}"
    )


def _dataset_source(x: Dataset, *, batch_size: int, shuffle: bool, seed: int | None, name: str,
                    args: Any = None, training: bool = False) -> LoaderSource:
    """A DataLoader fitkit builds over a Dataset: an `EpochSampler` for a map-style one. Under
    `data_order="trainer"` it is built as the Hugging Face Trainer builds its own
    (`fitkit.engine.data.trainer_order`): no generator of its own, batches dealt whole to the
    processes, and the Trainer's worker seeding for training."""
    iterable = isinstance(x, IterableDataset)
    if not iterable and len(x) == 0:  # type: ignore[arg-type]
        raise ValueError(f"`{name}` is an empty Dataset: pass at least one sample")
    as_trainer = getattr(args, "data_order", "fitkit") == "trainer"
    options = loader_options(args, x)
    g: torch.Generator | None = None
    if not as_trainer:  # the loader's own generator: creating an iterator never draws from the global RNG
        g = torch.Generator()
        g.manual_seed(seed or 0)
    elif training and options.get("num_workers"):
        options["worker_init_fn"] = partial(seed_worker, num_workers=options["num_workers"], rank=process_group()[0])
    if iterable:
        source = LoaderSource(DataLoader(x, batch_size=batch_size, generator=g, **options))
    elif training and getattr(args, "train_sampling_strategy", "random") == "batch_rebalance":
        source = _rebalanced_source(x, args, batch_size, shuffle, seed if not as_trainer else TRAINER_SEED, g,
                                    options)
    else:
        sampler = EpochSampler(len(x), shuffle, seed, per_batch=batch_size if as_trainer else None)  # type: ignore[arg-type]
        sampler.drop_last = bool(options.get("drop_last", False))  # dealt batches: the incomplete round dropped
        sampler.even = getattr(args, "even_batches", True)  # HF's accelerator_config entries
        sampler.drawn = training and not getattr(args, "use_seedable_sampler", True)
        sampler.groups = _length_groups(x, args, batch_size, seed, training, as_trainer)
        loader = DataLoader(x, batch_size=batch_size, sampler=sampler, generator=g, **options)
        source = LoaderSource(loader, num_samples=len(x))  # type: ignore[arg-type]
        source.sampler = sampler
    source.draws = as_trainer
    return source


def _rebalanced_source(x: Dataset, args: Any, batch_size: int, shuffle: bool, seed: int | None,
                       g: torch.Generator | None, options: dict[str, Any]) -> LoaderSource:
    """HF's `train_sampling_strategy="batch_rebalance"`: the loader's `batch_sampler` yields micro-batches of
    varying size (`fitkit.engine.data.rebalance`), their order drawn from a generator seeded with `seed` plus
    the epoch (`TRAINER_SEED` under the Trainer's order: its sampler's seed, whatever `args.seed`)."""
    names = getattr(getattr(args, "processing_class", None), "model_input_names", None)
    lengths = sample_lengths(x, args.length_column_name, names[0] if names else None, "batch_rebalance")
    sampler = RebalanceSampler(lengths, batch_size, args.gradient_accumulation_steps, seed or 0, shuffle=shuffle,
                               drop_last=bool(options.pop("drop_last", False)))
    loader = DataLoader(x, batch_sampler=sampler, generator=g, **options)
    source = LoaderSource(loader, num_samples=len(x))  # type: ignore[arg-type]
    source.sampler = sampler
    return source


def _length_groups(x: Dataset, args: Any, batch_size: int, seed: int | None, training: bool,
                   as_trainer: bool) -> LengthGroups | None:
    """HF's `train_sampling_strategy="group_by_length"` for a map-style Dataset (None under another
    strategy): the samples' lengths read as the Trainer reads them, in groups of the Trainer's size
    (training: the batch size times `gradient_accumulation_steps`). Training draws its order from
    torch's global generator under the Trainer's order, else from one seeded with `seed` plus the
    epoch; an evaluation from one seeded with `data_seed` (else `seed`) each pass, as the Trainer's."""
    if getattr(args, "train_sampling_strategy", "random") != "group_by_length":
        return None
    names = getattr(getattr(args, "processing_class", None), "model_input_names", None)
    lengths = sample_lengths(x, args.length_column_name, names[0] if names else None)
    if training:
        return LengthGroups(lengths, batch_size * args.gradient_accumulation_steps,
                            None if as_trainer else seed or 0, per_epoch=True)
    return LengthGroups(lengths, batch_size, (args.seed if args.data_seed is None else args.data_seed) or 0)
