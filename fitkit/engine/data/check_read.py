"""The iterator fitkit's own check read opens (`LoaderSource.first_batch`), which must leave the
user's loader as a hand loop would find it.

On a GPU, a one-device run's DataLoader goes through Lightning Fabric's loader wrapper
(`_FabricDataLoader`), whose every `iter()` calls the sampler's `set_epoch` with its count of
passes and counts one more. Opened for the check read, it made the sampler see `set_epoch(0)`
twice (the check's pass, then the first epoch's), where a hand loop over the same wrapper calls it
once per epoch. So the check reads the wrapped DataLoader itself and moves each batch to the
wrapper's device as the wrapper would::

    iterator = open_for_check(fabric_loader)   # no set_epoch call, the wrapper's count unchanged
    batch = next(iterator)                      # on fabric_loader.device
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def open_for_check(loader: Any) -> Iterator[Any]:
    """An iterator over `loader`'s batches that calls no `set_epoch` of its sampler: for Fabric's
    loader wrapper, its DataLoader read directly with the batches moved to the wrapper's device;
    any other loader is simply iterated."""
    inner = getattr(loader, "_dataloader", None)
    if inner is None or not hasattr(loader, "_num_iter_calls"):
        return iter(loader)
    device = getattr(loader, "_device", None)
    if device is None:
        return iter(inner)
    from lightning_fabric.utilities.apply_func import move_data_to_device  # loaded: the wrapper is Fabric's

    return (move_data_to_device(item, device) for item in inner)
