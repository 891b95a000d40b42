"""Data sources: what the loop iterates. A `DataSource` yields `Batch`es per epoch, knows its
length when it can, and counts the samples a position stands for (so a checkpoint resumes at
the same sample whatever the number of processes or the batch size)::

    source = TensorSource(x, y, batch_size=32, shuffle=True, seed=0)   # in memory: slicing
    source = LoaderSource(loader)                                        # a DataLoader or batches
    for batch in source.batches(epoch=0, start=0): ...

`fitkit.engine.data.adapt.adapt` builds one from any accepted input.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset

from fitkit.common.tensors import map_tensors
from fitkit.engine.data.batch import Batch, batch_size_of, first_leaf, split_batch
from fitkit.engine.data.check_read import open_for_check
from fitkit.engine.data.keras_data import class_weights_for
from fitkit.engine.data.prefetch import read_ahead
from fitkit.engine.data.rng import rng_state, same_rng_state, set_rng_state
from fitkit.engine.data.sampling import (
    BlockSampler,
    EpochSampler,
    block,
    deal,
    epoch_permutation,
    process_group,
    resume_batch,
)
from fitkit.engine.data.trainer_order import draw_as_a_loader

logger = logging.getLogger("fitkit")


class DataSource:
    """Something that yields batches each epoch."""

    num_samples: int | None = None
    name = "x"  # the argument the data came from (`x`, `validation_data`, `validation_split`)
    #: The global RNG state when the current epoch's batches were drawn, kept by sources that
    #: replay it (`replays_rng`): a checkpoint saves it, a resume hands it back to `epoch`.
    epoch_rng: dict | None = None
    #: Each pass draws one number from torch's global generator when it starts, as the Hugging Face
    #: Trainer's DataLoaders do (`data_order="trainer"`, `fitkit.engine.data.trainer_order`).
    draws = False

    @property
    def replays_rng(self) -> bool:
        """Whether an exact mid-epoch resume replays the global RNG state (see `LoaderSource`)."""
        return self.draws

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

    def epoch(self, epoch: int, start: int = 0, *, rng: dict | None = None,
              epoch_rng: dict | None = None) -> Iterator[Batch]:
        """The training batches of `epoch` from `start`, with the global RNG where a first run had
        it: a resume passes the RNG state its checkpoint saved (`rng`) and, for a source that
        replays it, the state the epoch's order was drawn with (`epoch_rng`); the order is drawn
        from that, then the RNG continues from `rng`. The state an order is drawn with is kept in
        `self.epoch_rng` for the next checkpoint."""
        if rng is not None:
            set_rng_state(epoch_rng or rng)
        if self.replays_rng:
            self.epoch_rng = epoch_rng or rng_state()
        batches = self.batches(epoch, start)
        if epoch_rng is not None and rng is not None:
            set_rng_state(rng)  # the epoch's order was drawn as in the first run; now continue its RNG
        return batches

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

    def data_state(self) -> list | None:
        """The saved states of this data's stateful parts (see `stateful_parts`) at this moment,
        for a mid-epoch checkpoint; None when it has none (a resume then re-reads or skips)."""
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
        geometry = self.geometry()
        assert geometry is not None  # skipping by samples: the source counts them (`resume_at`)
        _, batch_size, world_size, _ = geometry
        return start * batch_size * world_size


class TensorSource(CountsSamples):
    """In-memory tensors, batched by slicing (`index_select` when shuffled)."""

    num_samples: int  # this process's share, set by `shard`

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

    def to(self, device: torch.device) -> TensorSource:
        move = lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t  # noqa: E731
        self.x = map_tensors(move, self.x)
        self.y = map_tensors(move, self.y) if self.y is not None else None
        self.sample_weight = map_tensors(move, self.sample_weight) if self.sample_weight is not None else None
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
        if self.draws:
            draw_as_a_loader()
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
        x, y = self.x, self.y
        if (isinstance(x, torch.Tensor) and isinstance(y, (torch.Tensor, type(None))) and self.sample_weight is None
                and self.class_weight is None):
            return _sliced(x, y, order, offset, n, self.batch_size, self.drop_last)  # (no generator between)
        return self._mapped(order, offset, n)

    def _mapped(self, order: torch.Tensor | None, offset: int, n: int) -> Iterator[Batch]:
        """`_batches` of structured inputs, targets or weights: each tensor taken by a function."""
        bs = self.batch_size
        x, y, sw, cw = self.x, self.y, self.sample_weight, self.class_weight
        positional = not isinstance(x, dict)
        take: Callable[..., torch.Tensor]  # called with a tensor (the defaults bind the loop values)
        for b in range(n // bs if self.drop_last else math.ceil(n / bs)):
            lo, hi = b * bs, min((b + 1) * bs, n)
            if order is None:
                take = lambda t, lo=lo, hi=hi: t[offset + lo : offset + hi]  # noqa: E731 - a view, no copy
            else:
                idx = order[lo:hi]
                take = lambda t, idx=idx: t.index_select(0, idx)  # noqa: E731
            xb = map_tensors(take, x)
            yb = map_tensors(take, y) if y is not None else None
            swb = map_tensors(take, sw) if sw is not None else None
            if cw is not None and yb is not None:
                cwb = class_weights_for(cw, yb)
                swb = cwb if swb is None else swb * cwb
            inputs = (xb if isinstance(xb, tuple) else (xb,)) if positional else xb
            yield Batch(inputs, yb, swb, hi - lo)


def _sliced(x: torch.Tensor, y: torch.Tensor | None, order: torch.Tensor | None, offset: int, n: int, bs: int,
            drop_last: bool) -> Iterator[Batch]:
    """The batches of one input and one target (the common case), sliced directly: the full
    batches in a loop that does no more per batch than a hand-written one, then the last."""
    full = n // bs * bs
    new = tuple.__new__  # `Batch(...)` without its Python-level `__new__` frame
    if order is None:
        if y is None:
            for lo in range(offset, offset + full, bs):
                yield new(Batch, ((x[lo:lo + bs],), None, None, bs))
        else:
            for lo in range(offset, offset + full, bs):
                yield new(Batch, ((x[lo:lo + bs],), y[lo:lo + bs], None, bs))
        if full < n and not drop_last:
            lo, hi = offset + full, offset + n
            yield Batch((x[lo:hi],), y[lo:hi] if y is not None else None, None, n - full)
        return
    for lo in range(0, full if drop_last else n, bs):
        idx = order[lo:min(lo + bs, n)]
        yield Batch((x.index_select(0, idx),), y.index_select(0, idx) if y is not None else None, None, len(idx))


_END = object()
_PLAIN = (type(None), bool, int, float, str, torch.Tensor)


def _has_state(obj: Any) -> bool:
    return (obj is not None and not isinstance(obj, torch.nn.Module) and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None)))


def stateful_parts(loader: Any) -> list[Any]:
    """The parts of `loader` that save and restore their position with `state_dict()` /
    `load_state_dict()` (torchdata's `StatefulDataLoader`, Lightning's stateful loaders,
    `datasets`' `IterableDataset`): the loader itself when it has them (it then keeps its
    dataset's and sampler's states), else its `IterableDataset` and its samplers that have them.
    A DataLoader with worker processes keeps those parts' live copies in the workers: none then.

        stateful_parts(StatefulDataLoader(ds, batch_size=8))   # [the loader]
        stateful_parts(DataLoader(my_stateful_iterable))        # [the dataset]
    """
    loader = getattr(loader, "_dataloader", loader)  # the loader inside Fabric's wrapper
    if _has_state(loader):
        return [loader]
    if getattr(loader, "num_workers", 0):
        return []
    dataset = getattr(loader, "dataset", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    candidates = (dataset if isinstance(dataset, IterableDataset) else None, getattr(loader, "sampler", None),
                  batch_sampler, getattr(batch_sampler, "sampler", None))
    found: dict[int, Any] = {}
    for part in candidates:
        if _has_state(part):
            found.setdefault(id(part), part)
    return list(found.values())


def _plain(value: Any) -> bool:
    """Whether `value` loads with `torch.load(weights_only=True)`: plain values, tensors and
    dicts, lists and tuples of them."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return False


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
    block_sampler = BlockSampler(len(cast(Sized, loader.dataset)), rank, world_size)  # sequential: map-style
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=block_sampler,
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      pin_memory=loader.pin_memory, drop_last=False, generator=loader.generator)


class LoaderSource(CountsSamples):
    """A DataLoader (given, or built over a Dataset) or any re-iterable of batches.

    With `prefetch` (set by `adapt`), a thread reads the next batches while a step runs
    (`fitkit.engine.data.prefetch`); it turns off for good once the Dataset is seen drawing random numbers.

    A loader with stateful parts (`stateful_parts`) is read on the training thread, never ahead,
    so their state is that of the batches the steps consumed: a mid-epoch checkpoint saves it
    (`data_state`) and a resume loads it back instead of re-reading the consumed batches."""

    def __init__(self, loader: Iterable, *, num_samples: int | None = None):
        self.loader = loader
        self.num_samples = num_samples
        self.class_weight: torch.Tensor | None = None
        self.sampler: EpochSampler | None = None  # set when fitkit built the loader
        self.distributed = False
        self.prefetch = False
        # Read ahead only after a step this long (seconds; 0: always): set for evaluation passes.
        self.min_step_s = 0.0
        self._readers: weakref.WeakSet = weakref.WeakSet()  # the prefetch threads started
        self._parts: list[Any] | None = None  # `stateful_parts(loader)`, found at first use
        self._restore: tuple[int, int, list] | None = None  # a resumed epoch's (epoch, batch, states)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    @property
    def replays_rng(self) -> bool:
        """A loader fitkit did not build may draw its order from the global RNG when an epoch's
        iterator is created (so does one fitkit builds under `data_order="trainer"`); an exact
        mid-epoch resume replays that RNG state."""
        return self.sampler is None or self.draws

    def geometry(self) -> tuple[int, int, int, bool] | None:
        batch_size = getattr(self.loader, "batch_size", None)
        if self.num_samples is None or not isinstance(batch_size, int):
            return None  # a re-iterable of batches, an IterableDataset, a batch sampler
        world_size = process_group()[1] if self.distributed else 1
        return self.num_samples, batch_size, world_size, bool(getattr(self.loader, "drop_last", False))

    def stateful(self) -> list[Any]:
        """The loader's parts with a state to save (see `stateful_parts`); [] for none."""
        if self._parts is None:
            self._parts = stateful_parts(self.loader) if self.sampler is None else []
        return self._parts

    def data_state(self) -> list | None:
        parts = self.stateful()
        if not parts:
            return None
        states = [part.state_dict() for part in parts]
        if not _plain(states):
            if not self._warned_state:
                logger.warning("the state_dict() of `%s`'s data holds values other than numbers, strings, tensors, "
                               "dicts and lists: it is not saved, and a resume re-reads the consumed batches; return "
                               "plain values to resume without re-reading", self.name)
                self._warned_state = True
            return None
        return states

    def _resume_from_state(self, position: Any) -> bool:
        """Keep this process's saved data state of `position` for `batches` to load; False when
        there is none that fits (another number of processes, other parts)."""
        saved = getattr(position, "data_state", None)
        rank, world_size = process_group() if self.distributed else (0, 1)
        if not saved or len(saved) != world_size or not self.stateful():
            return False
        mine = saved[rank]
        if mine is None or len(mine) != len(self.stateful()):
            return False
        self._restore = (position.epoch, position.batch, mine)
        return True

    def resume_at(self, position: Any) -> int:
        if self._resume_from_state(position):
            return position.batch
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
        restored = self._load_state(epoch, start)
        kept, self._kept = self._kept, None
        if kept is not None and not start and not restored and same_rng_state(kept[2], rng_state()):
            # the batch the checks read opens this pass (nothing drew since): the pass's own draw,
            # its iterator's base seed, is the one the checks' read made
            first, iterator = kept[0], kept[1]
            set_rng_state(kept[3])
        else:
            # Create the iterator and fetch the first batch now, not lazily: samplers draw their order
            # from the RNG at the first fetch, and a resuming caller restores the RNG right after this.
            iterator = iter(loader)
            first = next(iterator, _END)
        if first is _END:
            iterator = iter(())
        elif self.prefetch and not self.stateful():
            iterator = read_ahead(first, iterator, readers=self._readers, on_draws=self._no_prefetch,
                                  min_step_s=self.min_step_s)
        else:
            iterator = itertools.chain((first,), iterator)
        if start and not skip_in_sampler and not restored:
            if not self._warned_skip:
                logger.warning("resuming mid-epoch re-reads %d batches of `%s` to skip them (its data has no "
                               "state_dict()/load_state_dict()); pass a map-style Dataset or a stateful loader to "
                               "continue without re-reading", start, self.name)
                self._warned_skip = True
            iterator = itertools.islice(iterator, start, None)
        return self._split(iterator)

    def _load_state(self, epoch: int, start: int) -> bool:
        """Load the saved data state of a resumed epoch (True), before its iterator is created."""
        restore, self._restore = self._restore, None
        if restore is None or restore[:2] != (epoch, start):
            return False
        for part, state in zip(self.stateful(), restore[2]):
            part.load_state_dict(state)
        return True

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
        generators, parts = _generators_of(self.loader), self.stateful()
        saved, states = rng_state(), [g.get_state() for g in generators]
        positions = [copy.deepcopy(part.state_dict()) for part in parts]  # a read moves a stateful source
        self._kept = None
        try:
            iterator = open_for_check(self.loader)  # a DataLoader's iterator draws its base seed here
            opened = rng_state() if self._replayable() and not generators else None
            raw = next(iterator, _END)
            if raw is not _END and opened is not None and same_rng_state(opened, rng_state()):
                # reading drew nothing: the next pass, if nothing draws before it, goes on from here
                self._kept = (raw, iterator, saved, opened)
        finally:
            set_rng_state(saved)
            for g, state in zip(generators, states):
                g.set_state(state)
            for part, position in zip(parts, positions):
                part.load_state_dict(position)
        return None if raw is _END else next(self._split(iter((raw,))))

    def _replayable(self) -> bool:
        """Whether the checked first batch may open the next pass (an evaluation's loader, say):
        one process, a loader in storage order read on this thread with no state of its own, whose
        reading draws no random number (checked by the caller), so the pass reads what it would."""
        loader = self.loader
        return (self.sampler is None and not self.distributed and isinstance(loader, DataLoader)
                and type(loader.sampler) is torch.utils.data.SequentialSampler and loader.num_workers == 0
                and not self.stateful())

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
    _warned_state = False
    #: what `first_batch` read for the next `batches` to go on with: (raw first batch, its
    #: iterator, the generators' state before it was opened, and after)
    _kept: tuple[Any, Iterator, dict[str, Any], dict[str, Any]] | None = None


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


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """Tell a loader which epoch comes (a distributed sampler shuffles by it). Fabric's loader
    wrapper sets its sampler's epoch from its own count of iterations, so that count is set."""
    if hasattr(loader, "_num_iter_calls"):
        loader._num_iter_calls = epoch
    elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
        loader.sampler.set_epoch(epoch)
    elif hasattr(loader, "set_epoch"):  # a sequence of whole batches read in a shuffled order
        loader.set_epoch(epoch)
