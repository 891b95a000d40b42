"""`LearningRateScheduler`: set the learning rate at each epoch from a function (Keras)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

from fitkit.callbacks._monitor import rate_text, set_learning_rates
from fitkit.events.handler import TrainerCallback


def _takes_lr(schedule: Callable) -> bool:
    try:
        params = inspect.signature(schedule).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


class LearningRateScheduler(TrainerCallback):
    """At the beginning of every epoch, set the learning rate to `schedule(epoch, lr)`.

    `epoch` is 0-based; `lr` is the current rate of the param group (each group is scheduled
    from its own rate). A `schedule(epoch)` taking one argument works too. The result must
    be a finite number >= 0. When a step-wise scheduler also drives the rate (`lr_scheduler=`
    in `compile`), its base rates are scaled by the same ratio so it does not undo the change.

    Args:
        schedule: `(epoch, lr) -> new lr`.
        verbose: 1 prints the rate set at each epoch.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import LearningRateScheduler

        def halve_after_two(epoch, lr):
            return lr if epoch < 2 else lr * 0.5

        x, y = torch.randn(128, 4), torch.randn(128, 1)
        model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse", learning_rate=0.1)
        history = model.fit(x, y, epochs=4, callbacks=[LearningRateScheduler(halve_after_two)], verbose=0)
        print(history.history["learning_rate"])   # [0.1, 0.1, 0.05, 0.025]
    """

    #: `History` and `CSVLogger` show `learning_rate` in runs with this callback.
    changes_learning_rate = True

    def __init__(self, schedule: Callable, verbose: int = 0) -> None:
        if not callable(schedule):
            raise TypeError(f"LearningRateScheduler: `schedule` must be a callable (epoch, lr) -> lr, got {schedule!r}")
        self.schedule = schedule
        self.verbose = verbose
        self._with_lr = _takes_lr(schedule)

    def on_epoch_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        epoch = int(state.epoch or 0)

        def new_rate(_: int, lr: float) -> float:
            value = self.schedule(epoch, lr) if self._with_lr else self.schedule(epoch)
            try:
                rate = float(value)
            except (TypeError, ValueError):
                rate = math.nan
            if isinstance(value, bool) or not math.isfinite(rate) or rate < 0:
                raise ValueError(
                    f"LearningRateScheduler: `schedule` returned {value!r} for epoch {epoch}; "
                    "it must return a finite number >= 0"
                )
            return rate

        changes = set_learning_rates(optimizer, lr_scheduler, new_rate)
        if self.verbose and state.is_world_process_zero and changes:
            rates = ", ".join(rate_text(new) for _, new in changes)
            print(f"Epoch {epoch + 1}: LearningRateScheduler setting learning rate to {rates}.", flush=True)
        return None

    def __repr__(self) -> str:
        return f"LearningRateScheduler(schedule={getattr(self.schedule, '__name__', self.schedule)!r})"
