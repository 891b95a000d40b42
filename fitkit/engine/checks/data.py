"""`check_data`: arm the checks of a source's first batch against the module, the loss and the
metrics. In-memory data is sliced (no permutation, no random draw, no user code) and its data
checks run at once; any other source (a DataLoader, a Dataset, a PyDataset) is read by nobody
but the run: its first batch is checked when the run's first step reads it.

    check_data(stepper, module, train, metrics=specs, training=True)   # fit, before the loop
    check_data(stepper, module, val, metrics=specs)                      # its validation data
    check_data(stepper, module, source, with_loss=False)                 # predict
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fitkit.adapters.losses import Loss
from fitkit.adapters.outputs import is_structure
from fitkit.engine.checks.first_step import FirstStep, _Pending
from fitkit.engine.checks.inputs import check_batch
from fitkit.engine.checks.memo import CheckMemo
from fitkit.engine.checks.names import _Names
from fitkit.engine.data.batch import Batch
from fitkit.engine.data.sources import DataSource, TensorSource

if TYPE_CHECKING:
    from fitkit.engine.step import Stepper


def check_data(stepper: Stepper, module: torch.nn.Module, source: DataSource | None, *, metrics: Any = (),
               training: bool = False, with_loss: bool = True, memo: CheckMemo | None = None,
               seen: Callable[[Batch], None] | None = None) -> Batch | None:
    """Check the first batch of `source` (nothing for None) against `module` (the user's, not
    Fabric's wrapper), the stepper's loss (unless `with_loss` is False: predict) and the
    `metrics` specs; raise ValueError / TypeError naming `source.name` and the fix. With a
    `memo`, in-memory data already checked against the same module, loss and metrics is not
    checked again. Returns the in-memory batch it checked (None when it checked none now);
    `seen` is told a loader's first batch when the run reads it."""
    if source is None:
        return None
    names = _Names(source.name, isinstance(source, TensorSource))
    if not isinstance(source, TensorSource):  # read by the run alone: checked as its first step takes it
        pending = _Pending(module, None, names, {}, metrics, with_loss, training=training,
                           forward_checks=stepper.fabric.world_size == 1, seen=seen)
        FirstStep.of(stepper).arm(pending, training)
        return None
    data = memo.data(source) if memo is not None else None  # (read once for both keys)
    key = memo.key(source, id(module), id(stepper.loss), tuple(map(id, metrics)), training, with_loss,
                   stepper.direct, data=data) if memo is not None else None
    if memo is not None and memo.seen(key):  # (no key: not seen)
        return None
    batch = _check_in_memory(stepper, module, source, names, metrics=metrics, training=training,
                             with_loss=with_loss, memo=memo, data=data)
    if memo is not None:
        memo.add(key)
    return batch


def _check_in_memory(stepper: Stepper, module: torch.nn.Module, source: TensorSource, names: _Names, *,
                     metrics: Any, training: bool, with_loss: bool, memo: CheckMemo | None,
                     data: tuple | None) -> Batch | None:
    loss = stepper.loss if with_loss else None
    first_key, kept = memo.first(source, loss, data) if memo is not None else (None, None)
    batch = source.first_batch() if kept is None else kept[0]
    if batch is None:
        if stepper.fabric.world_size == 1:  # a rank's shard may be empty while another's is not
            raise ValueError(f"`{source.name}` is empty: it yields no batch; pass at least one sample")
        return None
    if isinstance(loss, Loss) and is_structure(batch.target):
        loss.structured = True  # one loss on several outputs: `<output>_loss` is logged from the first step
    stats = check_batch(batch, module, loss, names, training=training, with_loss=with_loss, kept=kept)
    if kept is None and memo is not None:
        memo.keep_first(first_key, batch, stats)
    if stepper.fabric.world_size == 1:  # one rank raising alone would leave the others waiting
        pending = _Pending(module, batch, names, stats, metrics, with_loss, training=training)
        if memo is not None and first_key is not None:
            pending.memo = memo
            pending.key = (first_key[0], training, with_loss, id(stepper.loss), tuple(map(id, metrics)), stepper.direct)
            pending.leaves = first_key[1]
        FirstStep.of(stepper).arm(pending, training)
    return batch
