"""Hugging Face names: `EarlyStoppingCallback` (HF semantics) and `ProgressCallback`.

Code written for `transformers.Trainer` can keep these names::

    from fitkit.callbacks import EarlyStoppingCallback, ProgressCallback
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Mapping
from typing import Any

from fitkit.callbacks._monitor import MonitorCallback
from fitkit.callbacks.display.progress import ProgressBar
from fitkit.common.logs import MAX, MIN, as_number, greater_is_better

#: HF's name for the progress display.
ProgressCallback = ProgressBar
logger = logging.getLogger("fitkit")


class EarlyStoppingCallback(MonitorCallback):
    """Hugging Face's early stopping: stop when `args.metric_for_best_model` has worsened or
    not improved for `early_stopping_patience` evaluations.

    The metric is `metric_for_best_model` (fitkit's default `"val_loss"`; an HF-style name
    such as `"eval_accuracy"` or a bare `"accuracy"` is looked up as `"val_accuracy"`). Its
    direction is `greater_is_better`; when that is None, the compiled metric's own
    `higher_is_better` (the run's `metric_directions`) when known, else lower is better for
    names containing `"loss"` and higher otherwise. An evaluation counts as an improvement when
    the value beats `state.best_metric` (the run's best so far, which the trainer moves after
    the evaluation's events, as HF) by more than `early_stopping_threshold`. The counter
    restarts on an improvement; training stops once it reaches `early_stopping_patience`,
    checked after every evaluation (so, as in HF, `early_stopping_patience=0` stops at the
    first evaluation). Only evaluations during `fit` are seen, and the counter restarts at
    each `fit`. As HF's, it needs evaluations (`eval_strategy` "no" is a `ValueError` at
    `on_train_begin`) and warns when `load_best_model_at_end` is off. For Keras semantics (`min_delta`, `baseline`, `restore_best_weights`) use
    `fitkit.callbacks.EarlyStopping`.

    Args:
        early_stopping_patience: evaluations without improvement before stopping.
        early_stopping_threshold: how much the metric must improve to count.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import EarlyStoppingCallback

        x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
        model = Model(torch.nn.Linear(8, 2)).compile("adam", "cross_entropy", ["accuracy"])
        model.fit(x, y, epochs=50, validation_split=0.2, metric_for_best_model="val_accuracy",
                  callbacks=[EarlyStoppingCallback(early_stopping_patience=3)], verbose=0)
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0) -> None:
        if not isinstance(early_stopping_patience, int) or early_stopping_patience < 0:
            raise ValueError(
                f"EarlyStoppingCallback: `early_stopping_patience`={early_stopping_patience!r} is invalid; "
                "pass an integer >= 0"
            )
        # The metric and its direction come from the run's arguments, at on_train_begin.
        super().__init__("val_loss", "auto", required=False)
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = float(early_stopping_threshold or 0.0)
        self.reset()

    def reset(self) -> None:
        self.early_stopping_patience_counter = 0
        self.best_metric: float | None = None

    @property
    def _greater(self) -> bool:
        return self._direction == MAX

    def _candidates(self) -> list[str]:
        """The metric's name, then fitkit's `val_` name for it."""
        name = self.monitor
        if name.startswith("eval_"):
            return [name, "val_" + name[len("eval_"):]]
        if not name.startswith("val_"):
            return [name, "val_" + name]
        return [name]

    # -- MonitorCallback ---------------------------------------------------------------------
    def lookup(self, values: Mapping[str, Any]) -> float | None:
        for key in self._candidates():
            if key in values:
                return as_number(values[key])
        return None

    def missing_message(self, values: Mapping[str, Any]) -> str:
        names = ", ".join(sorted(values)) or "none"
        return (f"early stopping required metric_for_best_model, but did not find {self.monitor!r} so early "
                f"stopping is disabled. Values available: {names}.")

    def run_direction(self, args, directions: Mapping[str, str]) -> str | None:
        return MAX if greater_is_better(self.monitor, directions, getattr(args, "greater_is_better", None)) else MIN

    def epoch_done(self, record: dict, args, state, control, **kwargs):
        """Nothing: HF's early stopping looks at evaluations only."""
        return None

    def evaluation_done(self, metrics: dict, args, state, control, **kwargs):
        value = self._value(metrics)  # the evaluation's own values only, as HF
        if value is None:
            return None
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True
            return control
        return None

    def check_metric_value(self, args, state, control, metric_value: float) -> None:
        """HF's test: reset the counter on an improvement over `state.best_metric` larger than
        the threshold, else count. Driven outside a trainer (`state.best_metric` never set), the
        callback's own best stands in for it."""
        greater = getattr(args, "greater_is_better", None)
        better = operator.gt if (self._greater if greater is None else greater) else operator.lt
        best = state.best_metric if getattr(state, "best_metric", None) is not None else self.best_metric
        if best is None or (better(metric_value, best) and abs(metric_value - best) > self.early_stopping_threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1
        # The HF Trainer moves its best metric on any improvement, however small.
        if self.best_metric is None or better(metric_value, self.best_metric):
            self.best_metric = metric_value

    # -- events ------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.monitor = getattr(args, "metric_for_best_model", None) or "val_loss"
        super().on_train_begin(args, state, control, **kwargs)
        if getattr(args, "eval_strategy", "no") in (None, "no"):
            raise ValueError("EarlyStoppingCallback needs evaluations: pass validation data (validation_data or "
                             "validation_split) with eval_strategy 'epoch' or 'steps'; `eval_strategy` is 'no'")
        if not getattr(args, "load_best_model_at_end", False):
            logger.warning("Using EarlyStoppingCallback without load_best_model_at_end=True: once training is "
                           "finished, the best model will not be loaded automatically.")

    # -- checkpoint state (HF's ExportableState layout) --------------------------------------------
    def state(self) -> dict:
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {
                "early_stopping_patience_counter": self.early_stopping_patience_counter,
                "best_metric": self.best_metric,
            },
        }

    def load_state(self, state: dict) -> None:
        found = state.get("args")
        saved_args = found if isinstance(found, dict) else {}
        if "early_stopping_patience" in saved_args:  # HF rebuilds the callback from its saved args
            self.early_stopping_patience = int(saved_args["early_stopping_patience"])
        if "early_stopping_threshold" in saved_args:
            self.early_stopping_threshold = float(saved_args["early_stopping_threshold"] or 0.0)
        attributes = state.get("attributes", state)
        self.early_stopping_patience_counter = int(attributes.get("early_stopping_patience_counter", 0))
        best = attributes.get("best_metric")
        self.best_metric = None if best is None else float(best)
        self._mark_restored()
