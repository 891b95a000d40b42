"""HF's `auto_find_batch_size`: training that runs out of memory starts again with a smaller batch.

As the Trainer does it through accelerate's `find_executable_batch_size` (the batch
size times 0.9, rounded down, until a run ends or it reaches zero)::

    size = with_smaller_batches(lambda size: train(size), start=64, enabled=args.auto_find_batch_size)

What counts as out of memory is accelerate's rule (`fitkit.common.memory_errors`). Between
attempts Python's garbage is collected and the accelerator's cache emptied; the module keeps the
weights (and the optimizer its state) the failed attempt left, as the Trainer's does.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import torch

from fitkit.common.memory_errors import out_of_memory

logger = logging.getLogger("fitkit")

def with_smaller_batches(attempt: Callable[[int], None], start: int, enabled: bool) -> int:
    """`attempt(start)`; with `enabled`, after an out-of-memory error `attempt` again with 0.9 x
    the batch size (rounded down) until one returns. Returns the batch size that trained."""
    size = start
    while True:
        if size == 0:
            raise RuntimeError("`auto_find_batch_size`: no batch size fits in memory (down to 0); free memory "
                               "or use a smaller model or sequence length")
        failed = False
        try:
            attempt(size)
        except RuntimeError as err:
            if not (enabled and out_of_memory(err)):
                raise
            failed = True
        if not failed:
            return size
        _free_memory()  # after the except block: the error and its frames' tensors are gone
        smaller = int(size * 0.9)
        logger.warning("out of memory with batches of %d: training starts again with %d (`auto_find_batch_size`)",
                       size, smaller)
        size = smaller


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
