"""Inputs -> batches.

Every accepted input becomes a `DataSource` whose `batches(epoch)` yields `Batch`es:
`(inputs, target, sample_weight)` where `inputs` is a tuple of positional arguments or a dict
of keyword arguments for the module.

In-memory data (tensors, NumPy arrays, `(x, y[, sample_weight])` tuples) is batched by
slicing: one `index_select` per tensor per batch when shuffling, a view when not. That skips
the per-sample `__getitem__` and collation a `DataLoader` over a `TensorDataset` pays.
Datasets and DataLoaders go through a `DataLoader` (Fabric adds the distributed sampler).
"""

from __future__ import annotations

import itertools
import logging
import math
import weakref
from typing import Any, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from fitkit.engine.batch import LABEL_KEYS, Batch, first_leaf, batch_size_of, split_batch  # noqa: F401 - re-exported
from fitkit.engine.collate import SampleList, is_sample_list, loader_options
from fitkit.engine.prefetch import can_prefetch, read_ahead
from fitkit.engine.rng import rng_state, set_rng_state
from fitkit.engine.step import set_loader_epoch
from fitkit.tensors import map_tensors

logger = logging.getLogger("fitkit")


def _to_tensor(value: Any, name: str, cast_float64: bool = True) -> torch.Tensor:
    """A tensor of `value` (a tensor or NumPy array). float64 becomes float32, as Keras casts
    float64 input, unless `cast_float64` is False (a module whose parameters are float64)."""
    if isinstance(value, torch.Tensor):
        t = value
    else:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy ships with torch installs
            np = None
        if np is None or not isinstance(value, np.ndarray):
            raise TypeError(f"`{name}` must be a tensor or NumPy array here; got {type(value).__name__}")
        t = torch.from_numpy(value)
    # Integer labels keep their type.
    return t.float() if cast_float64 and t.dtype == torch.float64 else t


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or type(value).__module__ == "numpy" and hasattr(value, "shape")


def epoch_permutation(size: int, seed: int | None, epoch: int) -> torch.Tensor:
    """The shuffled order of epoch `epoch`: a permutation drawn from its own generator seeded
    with `seed + epoch`, so any epoch's order can be rebuilt (a resume) and the global RNG is
    never touched."""
    g = torch.Generator()
    g.manual_seed((seed or 0) + epoch)
    return torch.randperm(size, generator=g)


def deal(order: torch.Tensor, skip: int, rank: int, world_size: int, pad: bool = True) -> torch.Tensor:
    """`rank`'s share of an epoch's `order` from global sample `skip` on: the rest dealt round
    robin, as DistributedSampler deals, and (`pad`) made a multiple of `world_size` with the
    order's first samples, so every process makes as many steps. From `skip=0` this is
    DistributedSampler's share; from a resume point it is the rest of the same order, whatever
    the number of processes now."""
    rest = order[skip:]
    if world_size == 1:
        return rest
    extra = (-len(rest)) % world_size if pad else 0
    if extra:
        rest = torch.cat([rest, order.repeat(math.ceil(extra / len(order)))[:extra]])
    return rest[rank::world_size]


def resume_batch(total: int, samples: int, batch_size: int, world_size: int, batches: int,
                 drop_last: bool = False) -> int:
    """The number, in an epoch of `batches` micro-batches per process, of the batch at which an
    epoch of `total` samples continues after `samples` of them (over all processes): the
    batches left are those the rest makes when dealt to `world_size` processes."""
    left = math.ceil((total - samples) / world_size)
    left_batches = left // batch_size if drop_last else math.ceil(left / batch_size)
    return max(batches - left_batches, 0)


def _process() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class DataSource:
    """Something that yields batches each epoch."""

    num_samples: int | None = None
    replays_rng = False
    name = "x"  # the argument the data came from (`x`, `validation_data`, `validation_split`)

    def __len__(self) -> int:  # number of batches per epoch (per process)
        raise TypeError("unknown length")

    def has_len(self) -> bool:
        try:
            len(self)
            return True
        except TypeError:
            return False

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of `epoch` from batch number `start` on."""
        raise NotImplementedError

    def stop_prefetch(self) -> None:
        """Stop the threads reading batches ahead that `batches` started (none here)."""

    def resume_at(self, position: Any) -> int:
        """Continue a resumed epoch where `position` (a `LoopSnapshot`) left it: return the
        batch number `batches(epoch, start)` then starts from. This default counts batches, for
        data that cannot count samples (a list of batches)."""
        return position.batch

    def consumed(self, epoch: int, batches: int) -> int | None:
        """The samples of `epoch`, over all processes, consumed once each process has taken
        `batches` micro-batches of it (None when this data cannot tell)."""
        return None

    def first_batch(self) -> Batch | None:
        """One batch to check before training (None when there is none), read without moving any
        random number generator: the run goes on exactly as without it."""
        saved = rng_state()
        try:
            return next(iter(self.batches(0)), None)
        finally:
            set_rng_state(saved)


class CountsSamples(DataSource):
    """Data whose batches are cut from one order of the epoch's samples dealt to the processes
    (`deal`): its position is counted in samples over all processes, so an epoch resumed on
    another number of processes, or with another batch size, continues at the same sample."""

    _resumed: tuple[int, int, int] | None = None  # a resumed epoch: (epoch, batch number, samples)

    def geometry(self) -> tuple[int, int, int, bool] | None:
        """(samples per epoch, batch size per process, processes, drop_last), None if unknown."""
        raise NotImplementedError

    def resume_at(self, position: Any) -> int:
        geometry = self.geometry()
        if position.samples is None or geometry is None:  # a checkpoint that counted batches
            return position.batch
        total, batch_size, world_size, drop_last = geometry
        start = resume_batch(total, position.samples, batch_size, world_size, len(self), drop_last)
        self._resumed = (position.epoch, start, position.samples)
        return start

    def consumed(self, epoch: int, batches: int) -> int | None:
        geometry = self.geometry()
        if geometry is None:
            return None
        total, batch_size, world_size, _ = geometry
        resumed_epoch, start, samples = self._resumed or (None, 0, 0)
        if resumed_epoch != epoch:
            start, samples = 0, 0
        return min(samples + (batches - start) * batch_size * world_size, total)

    def skipped(self, epoch: int, start: int) -> int:
        """The samples (over all processes) before batch number `start` of `epoch`."""
        if self._resumed is not None and self._resumed[:2] == (epoch, start):
            return self._resumed[2]
        _, batch_size, world_size, _ = self.geometry()
        return start * batch_size * world_size


class TensorSource(CountsSamples):
    """In-memory tensors, batched by slicing (`index_select` when shuffled)."""

    def __init__(self, x, y=None, sample_weight=None, *, batch_size: int, shuffle: bool, seed: int | None,
                 drop_last: bool = False, rank: int = 0, world_size: int = 1, pad: bool = True):
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.drop_last = drop_last
        self.total = batch_size_of(x)
        self.shard(rank, world_size, pad)
        self.class_weight: torch.Tensor | None = None

    def __len__(self) -> int:
        n = self.num_samples
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def shard(self, rank: int, world_size: int, pad: bool) -> None:
        """Take this process's share. Training (`pad`) deals a permutation round-robin and
        repeats a few samples so every rank makes the same number of steps, as
        DistributedSampler does. Evaluation takes a contiguous block per rank with no padding,
        so no sample counts twice and gathering the blocks in rank order is the input order."""
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.offset = 0
        if world_size == 1:
            self.num_samples = self.total
        elif pad:
            self.num_samples = math.ceil(self.total / world_size)
        else:
            self.offset, end = block(self.total, rank, world_size)
            self.num_samples = end - self.offset

    def to(self, device: torch.device) -> "TensorSource":
        move = lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t  # noqa: E731
        self.x = map_tensors(move, self.x)
        self.y = map_tensors(move, self.y) if self.y is not None else None
        self.sample_weight = move(self.sample_weight) if self.sample_weight is not None else None
        if self.class_weight is not None:
            self.class_weight = move(self.class_weight)
        return self

    def first_batch(self) -> Batch | None:
        """A batch of this process's first samples, in storage order: slices, no permutation
        (any batch serves the checks, and shuffling a large dataset costs)."""
        return next(self._batches(None, self.offset, self.num_samples), None)

    def geometry(self) -> tuple[int, int, int, bool]:
        return self.total, self.batch_size, self.world_size, self.drop_last

    def order(self, epoch: int, skip: int = 0) -> torch.Tensor | None:
        """The sample indices of this process for `epoch` from global sample `skip` on, or None
        for contiguous slices."""
        if not self.shuffle and (self.world_size == 1 or not self.pad):
            return None
        perm = epoch_permutation(self.total, self.seed, epoch) if self.shuffle else torch.arange(self.total)
        return deal(perm, skip, self.rank, self.world_size, self.pad)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        skip = self.skipped(epoch, start)
        order = self.order(epoch, skip)
        if order is None:  # contiguous: one process (skip in samples), or an evaluation block
            return self._batches(None, self.offset + skip, self.num_samples - skip)
        return self._batches(order, 0, len(order))

    def _batches(self, order: torch.Tensor | None, offset: int, n: int) -> Iterator[Batch]:
        """The batches of `n` samples: `order[:n]`, or (None) the slice from `offset` (views)."""
        device = first_leaf(self.x).device
        if order is not None:
            order = order.to(device)
        bs = self.batch_size
        x, y, sw, cw = self.x, self.y, self.sample_weight, self.class_weight
        positional = not isinstance(x, dict)
        for b in range(n // bs if self.drop_last else math.ceil(n / bs)):
            lo, hi = b * bs, min((b + 1) * bs, n)
            if order is None:
                take = lambda t: t[offset + lo : offset + hi]  # noqa: E731 - a view, no copy
            else:
                idx = order[lo:hi]
                take = lambda t: t.index_select(0, idx)  # noqa: E731
            xb = map_tensors(take, x)
            yb = take(y) if y is not None else None
            swb = take(sw) if sw is not None else None
            if cw is not None and yb is not None:
                cwb = class_weights_for(cw, yb)
                swb = cwb if swb is None else swb * cwb
            inputs = (xb if isinstance(xb, tuple) else (xb,)) if positional else xb
            yield Batch(inputs, yb, swb, hi - lo)


_END = object()


def block(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """The contiguous `[start, end)` of `total` samples that `rank` evaluates (no padding)."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class BlockSampler(torch.utils.data.Sampler):
    """Evaluation under several processes: this rank's contiguous block, nothing repeated."""

    def __init__(self, size: int, rank: int, world_size: int):
        self.start, self.end = block(size, rank, world_size)

    def __len__(self) -> int:
        return self.end - self.start

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


class EpochSampler(torch.utils.data.DistributedSampler):
    """The sampler fitkit builds for a map-style Dataset: a permutation seeded by `seed + epoch`,
    so any epoch's order can be rebuilt, and `skip` drops its first samples (a resume mid-epoch
    starts at the right sample without loading the ones before it). Under several processes it
    deals the order itself (`deal`), as DistributedSampler does; being one, Fabric keeps it. The
    processes are read from the process group when iterating: none exists when it is built."""

    def __init__(self, size: int, shuffle: bool, seed: int | None):  # noqa: D107 - no super().__init__: see above
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.epoch = 0
        self.skip = 0  # samples of the epoch's order, over all processes
        self.drop_last = False

    @property
    def rank(self) -> int:  # type: ignore[override]
        return _process()[0]

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return _process()[1]

    def use_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.size / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        order = epoch_permutation(self.size, self.seed, self.epoch) if self.shuffle else torch.arange(self.size)
        rank, world_size = _process()
        return iter(deal(order, self.skip, rank, world_size).tolist())


def evaluation_shard(loader: DataLoader, rank: int, world_size: int) -> DataLoader:
    """This rank's contiguous block of an evaluation DataLoader, so no sample counts twice.

    Loaders in sequential order are rebuilt over a `BlockSampler`; others keep Fabric's
    distributed sampler, which pads the last shard (a warning says so)."""
    sampler = loader.sampler
    sequential = isinstance(sampler, torch.utils.data.SequentialSampler) or (
        isinstance(sampler, EpochSampler) and not sampler.shuffle)
    if isinstance(loader.dataset, IterableDataset) or not sequential or loader.batch_size is None:
        logger.warning("evaluating a DataLoader with a custom sampler or batch sampler on %d processes: the "
                       "distributed sampler may repeat samples of the last shard", world_size)
        return loader
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=BlockSampler(len(loader.dataset), rank,
                      world_size), collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      pin_memory=loader.pin_memory, drop_last=False, generator=loader.generator)


class LoaderSource(CountsSamples):
    """A DataLoader (given, or built over a Dataset) or any re-iterable of batches.

    With `prefetch` (set by `adapt`), a thread reads the next batches while a step runs
    (`fitkit.engine.prefetch`); it turns off for good once the Dataset is seen drawing random numbers."""

    def __init__(self, loader: Iterable, *, num_samples: int | None = None):
        self.loader = loader
        self.num_samples = num_samples
        self.class_weight: torch.Tensor | None = None
        self.sampler: EpochSampler | None = None  # set when fitkit built the loader
        self.distributed = False
        self.prefetch = False
        self._readers: weakref.WeakSet = weakref.WeakSet()  # the prefetch threads started

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def replays_rng(self) -> bool:
        """A loader fitkit did not build may draw its order from the global RNG when an epoch's
        iterator is created; an exact mid-epoch resume replays that RNG state."""
        return self.sampler is None

    def geometry(self) -> tuple[int, int, int, bool] | None:
        batch_size = getattr(self.loader, "batch_size", None)
        if self.num_samples is None or not isinstance(batch_size, int):
            return None  # a re-iterable of batches, an IterableDataset, a batch sampler
        world_size = _process()[1] if self.distributed else 1
        return self.num_samples, batch_size, world_size, bool(getattr(self.loader, "drop_last", False))

    def resume_at(self, position: Any) -> int:
        geometry = self.geometry()
        if self.sampler is not None or position.samples is None or geometry is None:
            return super().resume_at(position)  # fitkit's sampler continues at the very sample
        _, batch_size, world_size, _ = geometry
        start, off = divmod(position.samples, batch_size * world_size)
        if off or position.world_size != world_size:
            logger.warning(
                "resuming a DataLoader you built at sample %d of epoch %d (written by %d processes) on %d x batch %d: "
                "its sampler's order depends on the processes, so the epoch continues after %d samples of this run's "
                "order, which may repeat or skip some; pass in-memory tensors or a map-style Dataset to continue at "
                "the same sample", position.samples, position.epoch, position.world_size, world_size, batch_size,
                start * batch_size * world_size)
        self._resumed = (position.epoch, start, start * batch_size * world_size)
        return start

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        loader = self.loader
        skip_in_sampler = self.sampler is not None
        if self.sampler is not None:
            self.sampler.use_epoch(epoch, self.skipped(epoch, start))
        set_loader_epoch(loader, epoch)
        # Create the iterator and fetch the first batch now, not lazily: samplers draw their order
        # from the RNG at the first fetch, and a resuming caller restores the RNG right after this.
        iterator = iter(loader)
        first = next(iterator, _END)
        if first is _END:
            iterator = iter(())
        elif self.prefetch:
            iterator = read_ahead(first, iterator, readers=self._readers, on_draws=self._no_prefetch)
        else:
            iterator = itertools.chain((first,), iterator)
        if start and not skip_in_sampler:
            if not self._warned_skip:
                logger.warning("resuming mid-epoch re-reads %d batches of this DataLoader to skip them; "
                               "pass a map-style Dataset for an index-level skip", start)
                self._warned_skip = True
            iterator = itertools.islice(iterator, start, None)
        return self._split(iterator)

    def stop_prefetch(self) -> None:
        for reader in list(self._readers):
            reader.close()

    def _no_prefetch(self) -> None:
        self.prefetch = False
        logger.debug("the Dataset of `%s` draws from the global random generators: its batches are read on the "
                     "training thread, not ahead, so the run's random numbers stay as without prefetching", self.name)

    def first_batch(self) -> Batch | None:
        """The loader's first batch, read through a fresh iterator: the global generators and the
        loader's own are put back after, so the run draws the same numbers as without this read.
        (A loader with worker processes starts them once more for it, unless `persistent_workers`.)"""
        if self.sampler is not None:
            self.sampler.use_epoch(0)
        generators = _generators_of(self.loader)
        saved, states = rng_state(), [g.get_state() for g in generators]
        try:
            raw = next(iter(self.loader), _END)
        finally:
            set_rng_state(saved)
            for g, state in zip(generators, states):
                g.set_state(state)
        return None if raw is _END else next(self._split(iter((raw,))))

    def _split(self, iterator: Iterator) -> Iterator[Batch]:
        cw = self.class_weight
        if cw is None:
            return map(split_batch, iterator)
        return self._weighted(iterator, cw)

    @staticmethod
    def _weighted(iterator: Iterator, cw: torch.Tensor) -> Iterator[Batch]:
        for raw in iterator:
            batch = split_batch(raw)
            if cw is not None and batch.target is not None:
                w = class_weights_for(cw.to(batch.target.device), batch.target)
                batch = batch._replace(sample_weight=w if batch.sample_weight is None else batch.sample_weight * w)
            yield batch

    _warned_skip = False


def _generators_of(loader: Any) -> list[torch.Generator]:
    """The generators a DataLoader draws from besides the global one (its own, its samplers')."""
    found: dict[int, torch.Generator] = {}
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    for owner in (loader, sampler, getattr(batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator):
            found[id(g)] = g
    return list(found.values())


def class_weight_table(class_weight: dict, device: torch.device) -> torch.Tensor:
    """Keras' `class_weight` dict as a table indexed by class (classes not named weigh 1)."""
    if not isinstance(class_weight, dict) or not class_weight:
        raise ValueError("`class_weight` must be a non-empty dict {class index: weight}")
    size = max(int(k) for k in class_weight) + 1
    weights = torch.ones(size, dtype=torch.float32)
    for k, v in class_weight.items():
        weights[int(k)] = float(v)
    return weights.to(device)


def class_weights_for(table: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample weights from a class-weight table; classes missing from the table weigh 1 (Keras)."""
    target = target.long()
    if target.dim() > 1:  # one-hot targets
        target = target.argmax(-1)
    inside = target < table.shape[0]
    return torch.where(inside, table[target.clamp(max=table.shape[0] - 1)], torch.ones((), device=table.device))


def _check_len(x, y, sample_weight) -> None:
    n = batch_size_of(x)
    if n == 0:
        raise ValueError("`x` is empty: pass at least one sample")
    for leaf in (x.values() if isinstance(x, dict) else (x if isinstance(x, tuple) else (x,))):
        if batch_size_of(leaf) != n:
            raise ValueError(f"all inputs in `x` must have the same number of samples; got {n} and {batch_size_of(leaf)}")
    if y is not None and batch_size_of(y) != n:
        raise ValueError(
            f"`x` has {n} samples but `y` has {batch_size_of(y)}: pass `x` and `y` with the same first dimension"
        )
    if sample_weight is not None and batch_size_of(sample_weight) != n:
        raise ValueError(f"`sample_weight` has {batch_size_of(sample_weight)} entries for {n} samples: pass one per sample")


def _arrays(value, name: str, cast_float64: bool = True):
    if isinstance(value, dict):
        return {k: _to_tensor(v, f"{name}[{k!r}]", cast_float64) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return tuple(_to_tensor(v, name, cast_float64) for v in value)
    return _to_tensor(value, name, cast_float64)


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
) -> tuple[DataSource | None, tuple | None]:
    """Turn user input into a `DataSource` named `name` (the argument it came from).

    Returns the source and, for in-memory data, the `(x, y, sample_weight)` tensors (so a
    validation split can be taken). `x` may be an `(x, y[, sample_weight])` tuple itself.
    In-memory float64 values become float32 unless `cast_float64` is False. A list of per-sample
    dicts is a Dataset (`fitkit.engine.collate`); `args` (the run's `TrainingArguments`) gives the
    DataLoader fitkit builds over a Dataset its `data_collator` and `dataloader_*` options.
    """
    source, tensors = _adapt(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed, name=name,
                             cast_float64=cast_float64, args=args)
    source.name = name
    if isinstance(source, LoaderSource):
        source.prefetch = getattr(args, "prefetch", True) and can_prefetch(source.loader)
    return source, tensors


def _adapt(x: Any, y: Any, sample_weight: Any, *, batch_size: int, shuffle: bool, seed: int | None, name: str,
           cast_float64: bool, args: Any = None) -> tuple[DataSource, tuple | None]:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"`batch_size`={batch_size!r} is invalid: pass an integer > 0")
    if x is None:
        raise ValueError(f"`{name}` is required: pass tensors, arrays, a Dataset or a DataLoader")
    if isinstance(x, (list, tuple)) and not x:
        raise ValueError(f"`{name}` is an empty {type(x).__name__}: pass at least one sample (tensors, arrays, a "
                         "Dataset, a DataLoader or a non-empty list of batches)")
    if y is None and isinstance(x, tuple) and len(x) in (2, 3) and _is_array(x[0]) and all(
        v is None or _is_array(v) for v in x[1:]
    ):
        x, y, sample_weight = (*x, None)[:3] if len(x) == 2 else x
    if _in_memory(x):
        x = _arrays(x, name, cast_float64)
        y = _arrays(y, "y", cast_float64) if y is not None else None
        sample_weight = _to_tensor(sample_weight, "sample_weight", cast_float64) if sample_weight is not None else None
        _check_len(x, y, sample_weight)
        source = TensorSource(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed)
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
    if isinstance(x, Dataset):
        return _dataset_source(x, batch_size=batch_size, shuffle=shuffle, seed=seed, name=name, args=args), None
    if isinstance(x, Iterable) and not isinstance(x, (str, bytes)):
        if iter(x) is x:
            raise TypeError(
                f"`{name}` is a one-shot iterator; pass a re-iterable (a list of batches, a Dataset or a DataLoader)"
            )
        return LoaderSource(x), None
    raise TypeError(
        f"`{name}` must be a tensor, NumPy array, (x, y) tuple, Dataset, DataLoader or re-iterable of batches; "
        f"got {type(x).__name__}"
    )


def _dataset_source(x: Dataset, *, batch_size: int, shuffle: bool, seed: int | None, name: str,
                    args: Any = None) -> LoaderSource:
    """A DataLoader fitkit builds over a Dataset: an `EpochSampler` for a map-style one."""
    iterable = isinstance(x, IterableDataset)
    if not iterable and len(x) == 0:  # type: ignore[arg-type]
        raise ValueError(f"`{name}` is an empty Dataset: pass at least one sample")
    # The loader's own generator: creating an iterator never draws from the global RNG.
    g = torch.Generator()
    g.manual_seed(seed or 0)
    options = loader_options(args, x)
    if iterable:
        return LoaderSource(DataLoader(x, batch_size=batch_size, generator=g, **options))
    sampler = EpochSampler(len(x), shuffle, seed)  # type: ignore[arg-type]
    loader = DataLoader(x, batch_size=batch_size, sampler=sampler, generator=g, **options)
    source = LoaderSource(loader, num_samples=len(x))  # type: ignore[arg-type]
    source.sampler = sampler
    return source


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
