"""Step and epoch arithmetic of a run, in one place (the engine plans a run with it, the
progress display reads the same numbers back).

One *step* is one optimizer update: with gradient accumulation it spans several
micro-batches, and an epoch's last step may span fewer::

    steps_per_epoch(10, accumulation=4)                         # 3 (4 + 4 + 2 micro-batches)
    plan(10, epochs=5, max_steps=-1, accumulation=1)            # (5, 50)
    plan(10, epochs=5, max_steps=25, accumulation=1)            # (3, 25): max_steps wins
    plan(10, epochs=1.5, max_steps=-1, accumulation=1)          # (2, 15): HF's float epochs
    interval_steps(0.25, max_steps=30)                          # 8: HF's fraction of max_steps
    steps_in_epoch(2, per_epoch=10, max_steps=25)               # 5
"""

from __future__ import annotations

import math
import sys


def steps_per_epoch(batches: int, accumulation: int) -> int:
    """Optimizer steps in an epoch of `batches` micro-batches (at least 1)."""
    return max(1, -(-batches // accumulation))


def plan(batches: int | None, *, epochs: int | float, max_steps: int, accumulation: int) -> tuple[int, int]:
    """`(num_train_epochs, max_steps)` of a run. `max_steps > 0` decides the length when given;
    without a known epoch length (`batches=None`) it is the only bound, and the epoch count is
    open (`sys.maxsize`); `max_steps` is 0 when nothing bounds the steps. A float `epochs`
    trains `ceil(epochs * steps per epoch)` steps over `ceil(epochs)` epochs, as HF does."""
    if batches is None:
        return (sys.maxsize if max_steps > 0 else math.ceil(epochs)), max(max_steps, 0)
    per_epoch = steps_per_epoch(batches, accumulation)
    if max_steps > 0:
        return -(-max_steps // per_epoch), max_steps
    return math.ceil(epochs), math.ceil(epochs * per_epoch)


def interval_steps(value: int | float, max_steps: int) -> int:
    """`logging_steps` / `eval_steps` / `save_steps` in steps: a value below 1 is that fraction
    of `max_steps`, rounded up (HF's rule; at least 1), else the value itself."""
    if value < 1:
        return max(1, math.ceil(max_steps * value))
    return int(value)


def epoch_batches(batches: int | None, steps_per_epoch: int | None) -> int | None:
    """Batches in an epoch: the data's (None: unknown), at most Keras' `steps_per_epoch`,
    which also gives data of unknown length its epochs."""
    if steps_per_epoch is None:
        return batches
    return steps_per_epoch if batches is None else min(batches, steps_per_epoch)


def steps_in_epoch(epoch: int, *, per_epoch: int, max_steps: int) -> int:
    """Optimizer steps epoch `epoch` (0-based) makes: `per_epoch`, fewer in the last one when
    `max_steps` ends inside it (at least 1)."""
    if max_steps:
        return max(1, min(per_epoch, max_steps - epoch * per_epoch))
    return per_epoch


def unplanned_steps(epochs: int | float, batches: int, accumulation: int) -> int:
    """Steps of the last epoch a float `epochs` does not train (0 for a whole number): what a
    count of whole epochs overshoots by::

        unplanned_steps(1.5, batches=8, accumulation=1)   # 4: 16 steps in 2 epochs, 12 planned
    """
    per_epoch = steps_per_epoch(batches, accumulation)
    return math.ceil(epochs) * per_epoch - math.ceil(epochs * per_epoch)
