"""Best-model tracking: after each evaluation, whether it beats `state.best_metric` by the one
"better" rule (`fitkit.common.logs.greater_is_better`), the best checkpoint recorded, and a plateau
scheduler stepped with the metric. `Loop` inherits it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from fitkit.common.logs import best_metric_key, greater_is_better
from fitkit.engine.checkpoint.writing import checkpoint_path

if TYPE_CHECKING:  # pragma: no cover - the members of `Loop` these methods use
    from fitkit.config.arguments import TrainingArguments
    from fitkit.engine.checkpoint.checkpointer import Checkpointer
    from fitkit.events.state import TrainerState

logger = logging.getLogger("fitkit")


class BestModel:
    """`state.best_metric`, `best_global_step` and `best_model_checkpoint`, kept from evaluations."""

    if TYPE_CHECKING:  # pragma: no cover
        args: TrainingArguments
        state: TrainerState
        checkpointer: Checkpointer | None
        plateau: Any
        directions: dict[str, str]
        _warned_best: bool

    def _track_best(self, metrics: dict[str, float]) -> bool:
        """Update `state.best_metric` from an evaluation (and step a plateau scheduler with it);
        True when this one is the new best. A checkpoint already written at this step (saved
        before the evaluation) is recorded as the best one at once, so no rotation removes it."""
        args, state = self.args, self.state
        if args.metric_for_best_model is None:  # no best model asked for (HF's None): only a plateau scheduler's metric
            if self.plateau is not None:
                self.plateau.step(metrics[best_metric_key("val_loss", metrics) or "val_loss"])
            return False
        name = best_metric_key(args.metric_for_best_model, metrics, required=self._needs_best())
        if name is None:
            if not self._warned_best:
                logger.warning("`metric_for_best_model`=%r is not among the evaluation values %s; "
                               "no best model is tracked", args.metric_for_best_model, sorted(metrics))
                self._warned_best = True
            return False
        value = metrics[name]
        if self.plateau is not None:
            self.plateau.step(value)
        if not self._is_better(name, value):
            return False
        state.best_metric, state.best_global_step = value, state.global_step
        last = self.checkpointer.last if self.checkpointer is not None else None
        if last is not None and last == checkpoint_path(args.output_dir, state.global_step):
            state.best_model_checkpoint = last
        return True

    def _needs_best(self) -> bool:
        """Whether the run relies on `metric_for_best_model` (then a name matching no evaluation
        value is an error): set by the user, or read by the best model, `save_strategy="best"`
        or a plateau scheduler."""
        args = self.args
        return (args.metric_for_best_model != "val_loss" or args.load_best_model_at_end
                or args.save_strategy == "best" or self.plateau is not None)

    def _is_better(self, name: str, value: float) -> bool:
        """Whether `value` of `name` beats `state.best_metric`."""
        args, state = self.args, self.state
        greater = greater_is_better(name, self.directions, args.greater_is_better)
        best = state.best_metric
        return best is None or (value > best if greater else value < best)
