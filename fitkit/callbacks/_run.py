"""Shared plumbing of callbacks that follow one `fit`: state that a checkpoint restores
(`RunStateCallback`) and the per-epoch records of a run (`EpochRecords`,
`EpochRecordsCallback`).

Private: `CSVLogger` and the monitors (`fitkit.callbacks._monitor.MonitorCallback`) are built
on these.
"""

from __future__ import annotations

import math
from typing import Any

from fitkit.common import schedule
from fitkit.common.logs import BOOKKEEPING
from fitkit.events.handler import TrainerCallback


def epoch_index(state) -> int:
    """The 0-based index of the epoch `state` is in (or has just completed)."""
    return max(math.ceil(state.epoch or 0.0) - 1, 0)


def epoch_steps(args, state, train_dataloader: Any = None, steps_per_epoch: int | None = None) -> int | None:
    """Optimizer steps in one epoch of the run starting (Keras' `params["steps"]`), or None when
    the training data has no length. Read at `on_train_begin`: the engine's `steps_per_epoch`
    keyword when given, else worked out from the state or the loader."""
    if steps_per_epoch is not None:
        return steps_per_epoch
    if state.max_steps and state.num_train_epochs and getattr(args, "max_steps", -1) <= 0:
        return max(1, state.max_steps // state.num_train_epochs)  # the engine planned epochs x steps
    try:
        batches = len(train_dataloader)
    except TypeError:  # no loader, or one without a length (an iterable dataset's)
        return None
    return schedule.steps_per_epoch(batches, getattr(args, "gradient_accumulation_steps", 1) or 1)


def rate_varies(lr_scheduler: Any, callbacks: Any) -> bool:
    """Keras 3's rule for showing `learning_rate` in `History` and `CSVLogger`, decided once at
    `on_train_begin` so both hold the same keys from the first epoch: True when a scheduler
    steps the rate (`lr_scheduler` other than a constant rate without warm-up) or a callback of
    the run changes it (one with `changes_learning_rate = True`: `ReduceLROnPlateau`,
    `LearningRateScheduler`). `state.log_history` holds the rate with every training log
    either way."""
    return lr_scheduler is not None or any(getattr(cb, "changes_learning_rate", False) for cb in callbacks or ())


def unlogged_epoch_values(args, running_logs: Any) -> dict[str, float] | None:
    """The epoch's training values (exact epoch averages) when the run logs no epoch record
    (`logging_strategy="steps"`: one record per step, as HF), for the callbacks that keep one
    record per epoch (Keras); None when the epoch-end log brings them, or outside a run."""
    if getattr(args, "logging_strategy", None) != "steps" or running_logs is None:
        return None
    return running_logs.epoch()


class RunStateCallback(TrainerCallback):
    """A callback whose state belongs to one `fit`: `reset()` runs at each `on_train_begin`,
    except right after `load_state` restored the state (call `_mark_restored()` there), so a
    run started from a checkpoint continues from it.

    State loaded before a run survives that run's `on_train_begin`; state loaded during a run
    (fitkit's resume loads callback states right after `on_train_begin`) needs no guard.
    `_training` is True from `on_train_begin` to `on_train_end`. Subclasses that override these
    two events call `super()`.
    """

    _training = False
    _restored = False

    def reset(self) -> None:
        """Forget the previous run (called at `on_train_begin`, unless state was just loaded)."""

    def on_train_begin(self, args, state, control, **kwargs):
        self._training = True
        if self._restored:
            self._restored = False
        else:
            self.reset()
        return None

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False
        return None

    def _mark_restored(self) -> None:
        """Call from `load_state`: the coming `on_train_begin` keeps the loaded state."""
        self._restored = not self._training


class EpochRecords:
    """Follows one `fit` and merges each epoch's `on_log` / `on_evaluate` values.

    An epoch's record is complete at its epoch-end evaluation when one follows `on_epoch_end`,
    else at its epoch-end training log when one follows, else at `on_epoch_end` itself. The
    callback using this reads `control` at `on_epoch_end` to know which comes, so it must run
    after the callbacks that set those switches (`DefaultFlowCallback` always runs first). As a
    safety net a record still open is completed at the next `on_epoch_begin` or `on_train_end`.
    Each method returns the completed record (a dict) when it completes one, else None.
    Bookkeeping keys (`fitkit.common.logs.BOOKKEEPING`) are left out of the records.
    """

    def __init__(self) -> None:
        self.training = False
        self.latest: dict[str, Any] = {}
        self.epoch: dict[str, Any] = {}
        self.index = 0
        self._closing = False
        self._wait_for: str | None = None

    def train_begin(self, state) -> None:
        type(self).__init__(self)
        self.training = True
        self.index = int(state.epoch or 0)

    def epoch_begin(self, state) -> dict | None:
        done = self._complete()
        self.index = int(state.epoch or 0)
        self.epoch = {}
        return done

    def epoch_end(self, args, state, control, epoch_values: dict | None = None) -> dict | None:
        """The epoch ended; `epoch_values` (the epoch's training values, when no epoch-end log
        brings them: step logging) are merged first."""
        if not self.training:
            return None
        if epoch_values:
            self._merge(epoch_values)
        self.index = epoch_index(state)
        self._closing = True
        if control.should_evaluate and getattr(args, "eval_strategy", "no") not in (None, "no"):
            self._wait_for = "evaluate"
        elif control.should_log:
            self._wait_for = "log"
        else:
            return self._complete()
        return None

    def log(self, logs: dict | None) -> dict | None:
        if not self.training or not logs:
            return None
        self._merge(logs)
        return self._complete() if self._wait_for == "log" else None

    def evaluate(self, metrics: dict | None) -> dict | None:
        if not self.training:
            return None
        self._merge(metrics or {})
        return self._complete() if self._closing else None

    def train_end(self) -> dict | None:
        done = self._complete()
        self.training = False
        return done

    def _merge(self, values: dict) -> None:
        clean = {k: v for k, v in values.items() if k not in BOOKKEEPING}
        self.latest.update(clean)
        self.epoch.update(clean)

    def _complete(self) -> dict | None:
        if not self._closing:
            return None
        self._closing, self._wait_for = False, None
        return dict(self.epoch)


class EpochRecordsCallback(RunStateCallback):
    """Keeps the `EpochRecords` of each run and calls `epoch_done(record, ...)` whenever an
    epoch's record completes (see `EpochRecords` for when; the safety net at `on_train_end`
    included, after `_training` went False). `epoch_done`'s return value is the event's.

    The events `on_train_begin`, `on_epoch_begin`, `on_epoch_end`, `on_log`, `on_evaluate`
    and `on_train_end` feed the records: subclasses that override them call `super()`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._records = EpochRecords()
        self._running_logs: Any = None  # the run's `RunningLogs`: the epoch's values under step logging

    def epoch_done(self, record: dict, args, state, control, **kwargs):
        """An epoch's merged values are complete; may return a `TrainerControl`."""
        return None

    def _done(self, record: dict | None, args, state, control, kwargs: dict):
        if record is None:
            return None
        return self.epoch_done(record, args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, running_logs=None, **kwargs):
        self._records.train_begin(state)
        self._running_logs = running_logs
        return super().on_train_begin(args, state, control, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        return self._done(self._records.epoch_begin(state), args, state, control, kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        values = unlogged_epoch_values(args, self._running_logs)
        return self._done(self._records.epoch_end(args, state, control, values), args, state, control, kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        return self._done(self._records.log(logs), args, state, control, kwargs)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        return self._done(self._records.evaluate(metrics), args, state, control, kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        done = self._records.train_end()
        self._running_logs = None  # it reaches the loop and the set-up module: not kept past the run
        super().on_train_end(args, state, control, **kwargs)
        return self._done(done, args, state, control, kwargs)
