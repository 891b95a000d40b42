"""`LoaderSource`: a DataLoader (given, or built over a Dataset) or any re-iterable of batches
as a `DataSource`, read ahead on a thread when it can be, its stateful parts saved mid-epoch::

    source = LoaderSource(loader)
    for batch in source.batches(epoch=0, start=0): ...
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from fitkit.engine.data.batch import Batch, split_batch
from fitkit.engine.data.keras_data import class_weights_for
from fitkit.engine.data.loader_parts import plain_state, set_loader_epoch, stateful_parts
from fitkit.engine.data.prefetch import read_ahead
from fitkit.engine.data.rebalance import RebalanceSampler
from fitkit.engine.data.sampling import EpochSampler, process_group
from fitkit.engine.data.sources import CountsSamples

logger = logging.getLogger("fitkit")

_END = object()


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
        self.sampler: EpochSampler | RebalanceSampler | None = None  # set when fitkit built the loader
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

    def consumed(self, epoch: int, batches: int) -> int | None:
        if isinstance(self.sampler, RebalanceSampler):  # every optimizer step takes the same samples in all
            return self.sampler.consumed(batches)
        return super().consumed(epoch, batches)

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
        if not plain_state(states):
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
        if not self.continues:
            return self._pass(epoch, start)
        if self._stream is None:
            self._stream = self._watched(self._pass(epoch, start))
        return self._stream

    def _watched(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """A continued stream's batches; `ran_out` set when it ends."""
        yield from batches
        self.ran_out = True

    def _pass(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """One pass over the loader: the batches of `epoch` from batch number `start` on."""
        loader = self.loader
        skip_in_sampler = self.sampler is not None
        if isinstance(self.sampler, RebalanceSampler):  # micro-batches of varying size: skipped by number
            self.sampler.use_epoch(epoch, start)
        elif self.sampler is not None:
            self.sampler.use_epoch(epoch, self.skipped(epoch, start))
        set_loader_epoch(loader, epoch)
        restored = self._load_state(epoch, start)
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
    #: Keras' `steps_per_epoch` over a stream (data without a length, a generator): one pass read
    #: on across epochs, as Keras' epoch iterator does; `adapt` sets it for a fit's training data
    continues = False
    _stream: Iterator[Batch] | None = None
