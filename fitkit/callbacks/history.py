"""`History`: the per-epoch record `fit` returns (Keras)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from fitkit.callbacks._run import epoch_steps, rate_varies, unlogged_epoch_values
from fitkit.common.logs import BOOKKEEPING, NOT_VALUES, keras_names
from fitkit.events.handler import TrainerCallback


class History(TrainerCallback):
    """Collects one value per epoch for every logged loss and metric.

    `history` maps each name (`loss`, `accuracy`, `val_loss`, ...) to a list with one value
    per epoch; `epoch` lists the epochs (0-based, Keras). Within an epoch the latest logged
    value wins, so the epoch-end record (exact epoch averages) is what is kept::

        hist = Model(net).compile("adam", "cross_entropy", ["accuracy"]).fit(x, y, epochs=3)
        hist.history["loss"]      # [1.9, 1.1, 0.7]
        hist.epoch                # [0, 1, 2]
        hist.params               # {"epochs": 3, "steps": 1, "verbose": "auto"}: steps per epoch

    It also answers as Hugging Face's `TrainOutput` (what `Trainer.train()` returns), so an HF
    example script's lines after training run unchanged::

        train_result = model.fit(train_ds, args=training_args, ...)
        train_result.metrics          # {"train_runtime": ..., "train_loss": ..., "epoch": 3.0, ...}
        train_result.training_loss    # the run's mean training loss
        train_result.global_step      # optimizer steps taken

    `learning_rate` is there when the rate varies in the run, as in Keras 3: a scheduler
    steps it (`lr_scheduler` other than a constant rate) or a callback changes it
    (`ReduceLROnPlateau`, `LearningRateScheduler`, any with `changes_learning_rate = True`).
    `CSVLogger` follows the same rule, so both hold the same keys.

    Under step logging (`logging_strategy="steps"`, which logs no epoch record) the epoch's
    training values are read at its end from the run (`running_logs.epoch()`), so the history
    holds epoch averages whatever the logging; a checkpoint keeps the rows (`state()`), so a
    resumed run's history starts with the epochs before it.
    """

    def __init__(self) -> None:
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []
        self.params: dict[str, Any] = {}
        self._rows: dict[int, dict[str, float]] = {}
        self._skip = NOT_VALUES
        self._running_logs: Any = None
        self.metrics: dict[str, Any] = {}  # HF's `TrainOutput.metrics`: the run's closing record
        self.global_step = 0  # HF's `TrainOutput.global_step`

    def on_train_begin(self, args, state, control, lr_scheduler=None, callbacks=(), train_dataloader=None,
                       steps_per_epoch=None, running_logs=None, **kwargs):
        self._running_logs = running_logs
        steps = epoch_steps(args, state, train_dataloader, steps_per_epoch)
        self.params = {"epochs": state.num_train_epochs, "steps": steps, "verbose": args.verbose}
        self._skip = BOOKKEEPING if rate_varies(lr_scheduler, callbacks) else NOT_VALUES
        self._rows = {}
        for record in state.log_history:  # a resumed run: the epochs before the checkpoint
            self._add(record.get("epoch"), record)
        self._rebuild()

    @property
    def training_loss(self) -> float | None:
        """HF's `TrainOutput.training_loss`: the run's mean training loss (None before a fit ends)."""
        value = self.metrics.get("train_loss")
        return None if value is None else float(value)

    def on_train_end(self, args, state, control, **kwargs):
        self._running_logs = None  # it reaches the loop and the set-up module: not kept past the run

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "train_runtime" in logs:
            # without total_flos, as the Trainer's result ends up (its printer pops it from the record it logs)
            self.metrics = {k: v for k, v in logs.items() if k not in ("step", "total_flos")}
            self.global_step = state.global_step
        if logs:
            self._add(state.epoch, logs)
            self._rebuild()

    def on_epoch_end(self, args, state, control, **kwargs):
        # Before the epoch-end save: the checkpoint holds this epoch's row.
        if getattr(args, "logging_strategy", None) != "steps":  # the epoch-end log brings them, or none do
            return
        values = unlogged_epoch_values(args, self._running_logs)
        if values:
            self._add(state.epoch, values)
            self._rebuild()

    # -- checkpointed state ----------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The rows by epoch (saved in checkpoints: step logging keeps no epoch record)."""
        return {"rows": {str(i): dict(row) for i, row in self._rows.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        rows = state.get("rows")
        if isinstance(rows, dict):
            self._rows = {int(i): {k: float(v) for k, v in row.items()} for i, row in rows.items()}
            self._rebuild()

    def _add(self, epoch: float | None, logs: dict) -> None:
        if "train_runtime" in logs:  # the run's closing summary, not an epoch's values
            return
        row = self._rows.setdefault(max(math.ceil(epoch or 0.0) - 1, 0), {})
        for key, value in keras_names(logs).items():  # HF's evaluation records (under HF's arguments): `val_` names
            if key not in self._skip and isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = float(value)

    def _rebuild(self) -> None:
        self.epoch = sorted(self._rows)
        names: list[str] = []
        for i in self.epoch:
            names.extend(k for k in self._rows[i] if k not in names)
        self.history = {k: [self._rows[i].get(k, math.nan) for i in self.epoch] for k in names}

    def plot(self, path: str | os.PathLike | None = None, metrics: str | Iterable[str] | None = None):
        """Draw the loss and every metric per epoch; training and `val_` values share a subplot.

        Needs matplotlib (`pip install "fitkit[plot]"`), imported only here. Returns the
        matplotlib `Figure`; with `path`, also saves it there as a PNG (drawn with the Agg
        backend, no window opens)::

            history = model.fit(x, y, epochs=10, validation_split=0.2)
            history.plot("curves.png")                 # loss and accuracy, train and val
            history.plot(metrics=["accuracy"])         # one subplot

        Args:
            path: file to write (parent folders are created); `None` draws only.
            metrics: names to draw (`"loss"`, `"accuracy"`, ...); default: all logged ones.
        """
        from fitkit.common.plotting import plot_history

        return plot_history(self.history, self.epoch, path=path, metrics=metrics)

    def __repr__(self) -> str:
        return f"History(epochs={len(self.epoch)}, keys={list(self.history)})"


def returned_history(callbacks: Any, own: History) -> Any:
    """What `fit` returns: a `History` the user gave among `callbacks` (fitkit's, or Keras'
    `keras.callbacks.History()`, which Keras returns when given one), else the run's own."""
    for callback in callbacks:
        if isinstance(callback, History) or any(k.__name__ == "History" and k.__module__.startswith("keras")
                                                for k in type(callback).__mro__):
            return callback
    return own
