"""Step and epoch arithmetic of a run, in one place (the engine plans a run with it, the
progress display reads the same numbers back).

One *step* is one optimizer update: with gradient accumulation it spans several
micro-batches, and an epoch's last step may span fewer::

    steps_per_epoch(10, accumulation=4)                         # 3 (4 + 4 + 2 micro-batches)
    plan(10, epochs=5, max_steps=-1, accumulation=1)            # (5, 50)
    plan(10, epochs=5, max_steps=25, accumulation=1)            # (3, 25): max_steps wins
    steps_in_epoch(2, per_epoch=10, max_steps=25)               # 5
"""

from __future__ import annotations

import sys


def steps_per_epoch(batches: int, accumulation: int) -> int:
    """Optimizer steps in an epoch of `batches` micro-batches (at least 1)."""
    return max(1, -(-batches // accumulation))


def plan(batches: int | None, *, epochs: int, max_steps: int, accumulation: int) -> tuple[int, int]:
    """`(num_train_epochs, max_steps)` of a run. `max_steps > 0` decides the length when given;
    without a known epoch length (`batches=None`) it is the only bound, and the epoch count is
    open (`sys.maxsize`); `max_steps` is 0 when nothing bounds the steps."""
    if batches is None:
        return (sys.maxsize if max_steps > 0 else epochs), max(max_steps, 0)
    per_epoch = steps_per_epoch(batches, accumulation)
    if max_steps > 0:
        return -(-max_steps // per_epoch), max_steps
    return epochs, epochs * per_epoch


def steps_in_epoch(epoch: int, *, per_epoch: int, max_steps: int) -> int:
    """Optimizer steps epoch `epoch` (0-based) makes: `per_epoch`, fewer in the last one when
    `max_steps` ends inside it (at least 1)."""
    if max_steps:
        return max(1, min(per_epoch, max_steps - epoch * per_epoch))
    return per_epoch
