"""Shared pieces of the Keras-like callbacks: `MonitorCallback` (the base of the callbacks
that watch one logged value), the direction of a monitored value, and changing the learning
rate so a scheduler keeps the change.

Private: the public callbacks (`EarlyStopping`, `ModelCheckpoint`, `ReduceLROnPlateau`, HF's
`EarlyStoppingCallback`) are built on these.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from fitkit.callbacks._run import EpochRecords, EpochRecordsCallback, RunStateCallback, epoch_index
from fitkit.common.logs import MAX, MIN, as_number, direction, direction_from_name
from fitkit.events.handler import Order

__all__ = [
    "EpochRecords", "EpochRecordsCallback", "MonitorCallback", "RunStateCallback", "available_names", "epoch_index",
    "improves", "rate_text", "resolve_mode", "set_learning_rates",
]


def resolve_mode(monitor: str, mode: str, who: str) -> str:
    """The direction ("min" or "max") for `mode` = "min" | "max" | "auto"."""
    if not isinstance(monitor, str) or not monitor:
        raise ValueError(f"{who}: `monitor` must be the name of a logged value such as 'val_loss', got {monitor!r}")
    if mode not in ("auto", "min", "max"):
        raise ValueError(f"{who}: `mode`={mode!r} is invalid; use 'auto', 'min' or 'max'")
    if mode != "auto":
        return mode
    found = direction_from_name(monitor)
    if found is None:
        raise ValueError(
            f"{who}: cannot tell whether `monitor`={monitor!r} should go down or up; "
            f"pass mode='min' (lower is better) or mode='max' (higher is better)"
        )
    return found


def improves(current: float, reference: float | None, direction: str, min_delta: float = 0.0) -> bool:
    """Keras' test: `current` beats `reference` by more than `min_delta` in `direction`.

    A NaN is never an improvement; any number improves on `reference=None`."""
    if math.isnan(current):
        return False
    if reference is None:
        return True
    delta = abs(min_delta)
    if direction == "min":
        return current + delta < reference
    return current - delta > reference


class MonitorCallback(EpochRecordsCallback):
    """Base of the callbacks that watch one logged value during `fit` (`EarlyStopping`,
    `ReduceLROnPlateau`, `ModelCheckpoint`, HF's `EarlyStoppingCallback`), as Keras 3's
    `MonitorCallback`: `check(current, ...)` runs at each *monitoring point*.

    The points are the evaluations during `fit` (`evaluation_done`), where the value is looked
    up in that evaluation's metrics, then in the latest training logs (so `monitor="loss"`
    works too). Without evaluation (`eval_strategy="no"`), the point is the end of each epoch,
    with that epoch's logged values (`epoch_done`). `evaluate()` outside `fit` is ignored.
    Subclasses with other points override those two hooks (`ModelCheckpoint` saves at each
    epoch's record, HF's `EarlyStoppingCallback` checks evaluations only).

    The direction (`"min"` or `"max"`): `mode`, or with `mode="auto"` the name's (resolved at
    construction: an unknown name raises `ValueError` asking for `mode` when `required`),
    replaced at each `on_train_begin` by the `metric_directions` keyword's entry for the
    monitored value when there is one (the compiled metric's own `higher_is_better`).

    A missing value gives one warning per run (`missing_message`) naming the values that
    exist. State is forgotten at each `on_train_begin` (`reset()`) unless `load_state` just
    restored it (it calls `_mark_restored()`).
    """

    order = Order.MONITOR

    def __init__(self, monitor: str = "val_loss", mode: str = "auto", *, required: bool = True) -> None:
        super().__init__()
        self.monitor = monitor
        self.mode = mode
        self._name_direction = self._resolve_direction(required)
        self._direction = self._name_direction
        self._by_evaluation = True
        self._warned = False

    def _resolve_direction(self, required: bool) -> str | None:
        who = type(self).__name__
        if required:
            return resolve_mode(self.monitor, self.mode, who)
        if self.mode in (MIN, MAX):
            return self.mode
        if self.mode == "auto":
            return direction_from_name(self.monitor) if isinstance(self.monitor, str) else None
        raise ValueError(f"{who}: `mode`={self.mode!r} is invalid; use 'auto', 'min' or 'max'")

    # -- to override -----------------------------------------------------------------
    def check(self, current: float, args, state, control, **kwargs):
        """Act on the monitored value at a monitoring point; may return a `TrainerControl`."""

    def lookup(self, values: Mapping[str, Any]) -> float | None:
        """The monitored value in `values` as a number, or None when it is not there."""
        return as_number(values[self.monitor]) if self.monitor in values else None

    def missing_message(self, values: Mapping[str, Any]) -> str:
        """The warning given (once per run) when the monitored value is missing."""
        return (f"{type(self).__name__}: the monitored value {self.monitor!r} is not available, so this check is "
                f"skipped (training goes on). Values available: {available_names(values)}.")

    def run_direction(self, args, directions: Mapping[str, str]) -> str | None:
        """The direction for the run starting (at `on_train_begin`)."""
        if self.mode == "auto" and isinstance(self.monitor, str):
            return direction(self.monitor, directions) or self._name_direction
        return self._name_direction

    def epoch_done(self, record: dict, args, state, control, **kwargs):
        """An epoch's record completed: the monitoring point when the run does not evaluate."""
        if self._by_evaluation or not self._training:  # not the safety net at on_train_end either
            return None
        return self._point(record, args, state, control, **kwargs)

    def evaluation_done(self, metrics: dict, args, state, control, **kwargs):
        """An evaluation during `fit` ended: the monitoring point when the run evaluates."""
        if not self._by_evaluation:
            return None
        return self._point({**self._records.latest, **metrics}, args, state, control, **kwargs)

    # -- plumbing --------------------------------------------------------------------------
    def _value(self, values: Mapping[str, Any]) -> float | None:
        """`lookup(values)`; a missing value warns once per run."""
        value = self.lookup(values)
        if value is None and not self._warned:
            self._warned = True
            warnings.warn(self.missing_message(values), UserWarning, stacklevel=2)
        return value

    def _point(self, values: Mapping[str, Any], args, state, control, **kwargs):
        current = self._value(values)
        if current is None:
            return None
        return self.check(current, args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, metric_directions=None, **kwargs):
        self._by_evaluation = getattr(args, "eval_strategy", "no") not in (None, "no")
        self._warned = False
        self._direction = self.run_direction(args, metric_directions or {})
        return super().on_train_begin(args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self._training:  # `evaluate()` outside `fit`
            return None
        result = super().on_evaluate(args, state, control, metrics=metrics, **kwargs)
        found = self.evaluation_done(metrics or {}, args, state, control, **kwargs)
        return found if found is not None else result


def set_learning_rates(optimizer, lr_scheduler, new_lr: Callable[[int, float], float]) -> list[tuple[float, float]]:
    """Set each param group's rate to `new_lr(group_index, old_rate)`; returns (old, new) pairs.

    When a scheduler with `base_lrs` drives the rate (fitkit's warm-up / linear / cosine
    schedules are `LambdaLR`s, which set `lr = base_lr * factor(step)` at every step), its
    base rate is scaled by the same ratio, so the next scheduler step keeps the change.
    """
    if optimizer is None:
        return []
    groups = optimizer.param_groups
    base = getattr(lr_scheduler, "base_lrs", None)
    scaled: list[Any] | None = base if isinstance(base, list) and len(base) == len(groups) else None
    changes = []
    for i, group in enumerate(groups):
        old = float(group["lr"])
        new = float(new_lr(i, old))
        changes.append((old, new))
        if new == old:
            continue
        if hasattr(group["lr"], "fill_"):  # a tensor rate (capturable / fused optimizers)
            group["lr"].fill_(new)
        else:
            group["lr"] = new
        if scaled is not None:
            scaled[i] = scaled[i] * (new / old) if old > 0 else new
    if changes and hasattr(lr_scheduler, "_last_lr"):
        lr_scheduler._last_lr = [float(g["lr"]) for g in groups]
    return changes


def rate_text(rate: float) -> str:
    """A learning rate as Keras prints it, without float noise: 1.0, 0.01, 5e-05."""
    return str(float(f"{rate:.6g}"))


def available_names(values: Mapping[str, Any]) -> str:
    """The numeric values' names, for a warning about a missing monitor."""
    return ", ".join(sorted(k for k in values if as_number(values[k]) is not None)) or "none"
