"""Reporting a trial's evaluations to Optuna, on a step that does not depend on the batch size
or the number of processes, so that pruners compare trials at the same point of training.

Under the Trainer face (`hf_trainer`, as `args=transformers.TrainingArguments(...)` sets it),
`compute_objective` gets what the Trainer passes: each evaluation's record (`eval_loss`,
`eval_<metric>`, the speed, `epoch`), once per evaluation; the last one is the trial's objective.

The step is in epochs: with `eval_strategy="epoch"` (the default with validation data) the
epoch number (1, 2, 3, ...); with `eval_strategy="steps"` the thousandths of an epoch seen
(`round(state.epoch * 1000)`: 500 is half an epoch), since such evaluations fall mid-epoch.

    reporter = TrialReporter(trial, compute_objective, multi=False, fabric=fabric, reported={1})
    model.fit(x, y, callbacks=[reporter])   # step 1 was reported by an earlier run: not again
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fitkit.events.handler import Order, TrainerCallback
from fitkit.events.hf_view import hf_values

#: Steps reported per epoch by evaluations made every so many optimizer steps.
STEPS_PER_EPOCH = 1000


def report_step(args: Any, state: Any) -> int | None:
    """The step an evaluation is reported at (see the module docstring); None for an epoch-end
    evaluation of an epoch cut short (a preempted or stopped run): it is not comparable."""
    epoch = float(state.epoch or 0.0)
    if args.eval_strategy == "steps":
        return int(round(epoch * STEPS_PER_EPOCH))
    if abs(epoch - round(epoch)) > 1e-6:
        return None
    return int(round(epoch))


class TrialReporter(TrainerCallback):
    """Reports each evaluation's objective to the trial (each step once: `reported` holds the
    steps an interrupted earlier run of the trial already reported); stops training when the
    trial should be pruned; notes whether the run was preempted (SIGTERM)."""

    order = Order.LOGGER

    def __init__(self, trial: Any, compute_objective: Callable, multi: bool, fabric: Any,
                 reported: Iterable[int] = ()) -> None:
        self.trial, self.compute_objective, self.multi, self.fabric = trial, compute_objective, multi, fabric
        self.reported = set(reported)
        self.metrics: dict[str, float] = {}
        self.pruned = self.preempted = False
        #: under the Trainer face, `compute_objective` of the last evaluation's record (the trial's objective)
        self.objective: Any = None
        # Optuna's NopPruner never prunes: asking it reads the trial back from the storage for nothing
        from optuna.pruners import NopPruner

        self._may_prune = type(getattr(getattr(trial, "study", None), "pruner", None)) is not NopPruner

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.metrics.update({k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.update({k: v for k, v in (metrics or {}).items() if k != "epoch"})
        leader = self.fabric is None or self.fabric.is_global_zero
        if args.hf_trainer and leader:  # the Trainer's call: this evaluation's record (`eval_loss`, ..., `epoch`)
            self.objective = self.compute_objective(hf_values(metrics) or {})
        if self.multi:
            return  # Optuna does not prune multi-objective studies
        prune = False
        if leader:
            step = report_step(args, state)
            if step is not None and step not in self.reported:
                value = self.objective if args.hf_trainer else self.compute_objective(dict(self.metrics))
                self.trial.report(value, step=step)
                self.reported.add(step)
            prune = self._may_prune and self.trial.should_prune()
        if self.fabric is not None and self.fabric.world_size > 1:
            prune = self.fabric.broadcast(prune, src=0)  # every rank stops at the same step
        if prune:
            self.pruned = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, preempted=False, **kwargs):
        self.preempted = bool(preempted)
