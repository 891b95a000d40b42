"""Shared pieces of the Keras-like callbacks: the direction of a monitored value, the epoch
records of a run, and changing the learning rate so a scheduler keeps the change.

Private: the public callbacks (`EarlyStopping`, `ModelCheckpoint`, ...) are built on these.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Any, Callable

from fitkit.callbacks.base import TrainerCallback

#: Keys of a log record that are bookkeeping, not values.
SKIP_KEYS = frozenset({"epoch", "step", "total_flos"})

# Name parts telling the direction of a monitored value. Long words match anywhere in the name;
# short ones must be a whole `_`-separated part ("val_mae", not "maestro").
_MIN_WORDS = ("loss", "error", "crossentropy", "perplexity", "hinge")
_MIN_PARTS = ("mae", "mse", "rmse", "mape", "msle", "nll")
_MAX_WORDS = ("accuracy", "precision", "recall", "auroc", "jaccard", "dice")
_MAX_PARTS = ("acc", "f1", "auc", "iou", "r2", "map")


def _torchmetrics_direction(name: str) -> str | None:
    """`higher_is_better` of the torchmetrics class a metric name was made from, if any.

    fitkit names a `torchmetrics.Metric` instance by its class in snake case
    (`PearsonCorrCoef` -> `pearson_corr_coef`, logged as `val_pearson_corr_coef`)."""
    base = name[4:] if name.startswith("val_") else name
    camel = "".join(part[:1].upper() + part[1:] for part in base.split("_") if part)
    if not camel.isidentifier():
        return None
    try:
        import torchmetrics
    except ImportError:  # pragma: no cover - a core dependency
        return None
    cls = getattr(torchmetrics, camel, None)
    better = getattr(cls, "higher_is_better", None) if isinstance(cls, type) else None
    if better is None:
        return None
    return "max" if better else "min"


def direction_from_name(name: str) -> str | None:
    """"min", "max", or None when the name does not tell."""
    low = name.lower()
    parts = set(re.split(r"[^a-z0-9]+", low))
    if any(w in low for w in _MIN_WORDS) or parts & set(_MIN_PARTS):
        return "min"
    if any(w in low for w in _MAX_WORDS) or parts & set(_MAX_PARTS):
        return "max"
    return _torchmetrics_direction(low)


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


def as_number(value: Any) -> float | None:
    """A logged value as a float (Python number, NumPy or one-element tensor), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        if hasattr(value, "numel") and value.numel() == 1:
            return float(value)
        if hasattr(value, "item") and getattr(value, "size", None) == 1:
            return float(value.item())
    except (TypeError, ValueError):
        return None
    return None


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


def epoch_index(state) -> int:
    """The 0-based index of the epoch `state` is in (or has just completed)."""
    return max(math.ceil(state.epoch or 0.0) - 1, 0)


class EpochRecords:
    """Follows one `fit` and merges each epoch's `on_log` / `on_evaluate` values.

    An epoch's record is complete at its epoch-end evaluation when one follows `on_epoch_end`,
    else at its epoch-end training log when one follows, else at `on_epoch_end` itself. The
    callback using this reads `control` at `on_epoch_end` to know which comes, so it must run
    after the callbacks that set those switches (`DefaultFlowCallback` always runs first). As a
    safety net a record still open is completed at the next `on_epoch_begin` or `on_train_end`.
    Each method returns the completed record (a dict) when it completes one, else None.
    """

    def __init__(self) -> None:
        self.training = False
        self.latest: dict[str, Any] = {}
        self.epoch: dict[str, Any] = {}
        self.index = 0
        self._closing = False
        self._wait_for: str | None = None

    def train_begin(self, state) -> None:
        self.__init__()
        self.training = True
        self.index = int(state.epoch or 0)

    def epoch_begin(self, state) -> dict | None:
        done = self._complete()
        self.index = int(state.epoch or 0)
        self.epoch = {}
        return done

    def epoch_end(self, args, state, control) -> dict | None:
        if not self.training:
            return None
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
        clean = {k: v for k, v in values.items() if k not in SKIP_KEYS}
        self.latest.update(clean)
        self.epoch.update(clean)

    def _complete(self) -> dict | None:
        if not self._closing:
            return None
        self._closing, self._wait_for = False, None
        return dict(self.epoch)


class MonitorCallback(TrainerCallback):
    """Base of the callbacks that watch one value during training (`EarlyStopping`,
    `ReduceLROnPlateau`): `check(current, ...)` runs at each *monitoring point*.

    The points are the evaluations during `fit` (`on_evaluate`), where the value is looked up
    in that evaluation's metrics, then in the latest training logs (so `monitor="loss"` works
    too). Without evaluation (`eval_strategy="no"`), the point is the end of each epoch, with
    that epoch's logged values. `evaluate()` outside `fit` is ignored. A missing value gives
    one warning per run naming the values that exist.
    """

    order = 10

    def __init__(self, monitor: str, mode: str) -> None:
        self.monitor = monitor
        self.mode = mode
        self._direction = resolve_mode(monitor, mode, type(self).__name__)
        self._records = EpochRecords()
        self._by_evaluation = True
        self._warned = False
        self._restored = False

    # -- to override -----------------------------------------------------------------
    def reset(self) -> None:
        """Forget the previous run (called at `on_train_begin`, unless state was just loaded)."""

    def check(self, current: float, args, state, control, **kwargs):
        """Act on the monitored value; may return a `TrainerControl`."""

    # -- plumbing --------------------------------------------------------------------------
    def _value(self, values: dict) -> float | None:
        value = as_number(values.get(self.monitor)) if self.monitor in values else None
        if value is None and not self._warned:
            self._warned = True
            warnings.warn(
                f"{type(self).__name__}: the monitored value {self.monitor!r} is not available, so this check is "
                f"skipped (training goes on). Values available: {available_names(values)}.",
                UserWarning,
                stacklevel=2,
            )
        return value

    def _point(self, values: dict, args, state, control, **kwargs):
        current = self._value(values)
        if current is None:
            return None
        return self.check(current, args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        self._records.train_begin(state)
        self._by_evaluation = getattr(args, "eval_strategy", "no") not in (None, "no")
        self._warned = False
        if self._restored:
            self._restored = False
        else:
            self.reset()

    def on_epoch_begin(self, args, state, control, **kwargs):
        done = self._records.epoch_begin(state)
        if done is not None and not self._by_evaluation:
            return self._point(done, args, state, control, **kwargs)
        return None

    def on_epoch_end(self, args, state, control, **kwargs):
        done = self._records.epoch_end(args, state, control)
        if done is not None and not self._by_evaluation:
            return self._point(done, args, state, control, **kwargs)
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        done = self._records.log(logs)
        if done is not None and not self._by_evaluation:
            return self._point(done, args, state, control, **kwargs)
        return None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self._records.training:
            return None
        self._records.evaluate(metrics)
        if not self._by_evaluation:
            return None
        return self._point({**self._records.latest, **(metrics or {})}, args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        self._records.train_end()
        return None

    def _mark_restored(self) -> None:
        # Loaded before a run: the coming `on_train_begin` must not reset it. Loaded during a run
        # (fitkit's resume loads callback states right after `on_train_begin`): nothing to guard.
        self._restored = not self._records.training


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
    scale_base = isinstance(base, list) and len(base) == len(groups)
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
        if scale_base:
            base[i] = base[i] * (new / old) if old > 0 else new
    if changes and hasattr(lr_scheduler, "_last_lr"):
        lr_scheduler._last_lr = [float(g["lr"]) for g in groups]
    return changes


def available_names(values: dict) -> str:
    """The numeric values' names, for a warning about a missing monitor."""
    return ", ".join(sorted(k for k in values if as_number(values[k]) is not None)) or "none"
