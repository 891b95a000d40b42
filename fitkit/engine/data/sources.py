"""Data sources: what the loop iterates. A `DataSource` yields `Batch`es per epoch, knows its
length when it can, and counts the samples a position stands for (so a checkpoint resumes at
the same sample whatever the number of processes or the batch size); `TensorSource` batches
in-memory tensors by slicing::

    source = TensorSource(x, y, batch_size=32, shuffle=True, seed=0)   # in memory: slicing
    for batch in source.batches(epoch=0, start=0): ...

`fitkit.engine.data.loader_source.LoaderSource` reads a DataLoader or batches;
`fitkit.engine.data.adapt.adapt` builds one from any accepted input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fitkit.common.tensors import map_tensors
from fitkit.engine.data.batch import Batch, batch_size_of, first_leaf
from fitkit.engine.data.keras_data import class_weights_for
from fitkit.engine.data.rng import rng_state, set_rng_state
from fitkit.engine.data.sampling import block, deal, epoch_permutation, resume_batch
from fitkit.engine.data.trainer_order import draw_as_a_loader


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
    #: A stream read on across epochs (`steps_per_epoch`) ended before an epoch's last step.
    ran_out = False

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
