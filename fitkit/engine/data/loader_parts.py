"""A DataLoader's parts as the sources use them: the parts that save their position
(`stateful_parts`), its own generators, the epoch it is told, and an evaluation's shard per rank::

    stateful_parts(StatefulDataLoader(ds, batch_size=8))   # [the loader]
    set_loader_epoch(loader, 3)                              # a distributed sampler reshuffles
"""

from __future__ import annotations

import logging
from collections.abc import Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset

from fitkit.engine.data.sampling import BlockSampler, EpochSampler

logger = logging.getLogger("fitkit")


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


def plain_state(value: Any) -> bool:
    """Whether `value` loads with `torch.load(weights_only=True)`: plain values, tensors and
    dicts, lists and tuples of them."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and plain_state(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain_state(v) for v in value)
    return False


def evaluation_shard(loader: DataLoader, rank: int, world_size: int) -> DataLoader:
    """This rank's contiguous block of an evaluation DataLoader, so no sample counts twice.

    Loaders in sequential order (or grouped by length) are rebuilt over a `BlockSampler`; others keep Fabric's
    distributed sampler, which pads the last shard (a warning says so)."""
    sampler = loader.sampler
    sequential = isinstance(sampler, torch.utils.data.SequentialSampler) or (
        isinstance(sampler, EpochSampler) and not sampler.shuffle)
    if isinstance(loader.dataset, IterableDataset) or not sequential or loader.batch_size is None:
        logger.warning("evaluating a DataLoader with a custom sampler or batch sampler on %d processes: the "
                       "distributed sampler may repeat samples of the last shard", world_size)
        return loader
    groups = sampler.groups if isinstance(sampler, EpochSampler) else None  # grouped by length: blocks of that order
    order = groups.order(0).tolist() if groups is not None else None
    block_sampler = BlockSampler(len(cast(Sized, loader.dataset)), rank, world_size, order)  # sequential: map-style
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=block_sampler,
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      pin_memory=loader.pin_memory, drop_last=False, generator=loader.generator)


def set_loader_epoch(loader: Any, epoch: int) -> None:
    """Tell a loader which epoch comes (a distributed sampler shuffles by it). Fabric's loader
    wrapper sets its sampler's epoch from its own count of iterations, so that count is set."""
    if hasattr(loader, "_num_iter_calls"):
        loader._num_iter_calls = epoch
    elif hasattr(getattr(loader, "sampler", None), "set_epoch"):
        loader.sampler.set_epoch(epoch)
    elif hasattr(loader, "set_epoch"):  # a sequence of whole batches read in a shuffled order
        loader.set_epoch(epoch)
