"""The `TrainerCallback` base class: the documented Hugging Face event set, each hook an empty
default (`no_op`) that a subclass overrides.

A callback written for `transformers.Trainer` that only touches `args`, `state`, `control` and the
documented keyword arguments runs unchanged::

    from fitkit import TrainerCallback

    class PrintLoss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero:
                print(state.global_step, logs)
"""

from __future__ import annotations

from typing import Any

from fitkit.events.base_defaults import no_op
from fitkit.events.state import Order, TrainerControl, TrainerState


class TrainerCallback:
    """Base class: override any of the events; each is called as
    `event(args, state, control, **kwargs)` and may return a `TrainerControl`.

    `order` (default `Order.USER`, 0) lets a callback ask to run later than others; equal
    orders keep list order. `DefaultFlowCallback` always runs first. See `Order` for the
    values the built-in callbacks use, and `Stateful` for keeping state in checkpoints.

    Example::

        class MyCallback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                print("Starting training")

        Model(net).compile("adam", "mse").fit(x, y, callbacks=[MyCallback()])

    Class attributes the engine and the handler read (the defaults suit a user callback):
    `order`; `takes_batch` (False: its step events ignore `batch`, `outputs` and `loss`, so
    the loop need not build them); `changes_learning_rate` (True: it sets the optimizer's rate,
    so `History` records it per epoch); `drives_flow` (True: it sets the log / evaluate / save
    switches on schedule, as `DefaultFlowCallback` does).
    """

    order: int = Order.USER
    takes_batch: bool = True
    changes_learning_rate: bool = False
    drives_flow: bool = False

    def close_run(self) -> None:
        """Called when `fit` exits, however it exits (also after an exception or a
        KeyboardInterrupt): release what the callback holds open, e.g. a live display."""

    @no_op
    def on_init_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called once when the model is compiled."""

    @no_op
    def on_train_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called at the beginning of training; `metric_directions` maps each logged value
        whose direction is known to "min" or "max", `callbacks` is the run's callbacks in order."""

    @no_op
    def on_train_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called at the end of training (also when training was stopped early)."""

    @no_op
    def on_epoch_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called at the beginning of an epoch."""

    @no_op
    def on_epoch_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called at the end of an epoch."""

    @no_op
    def on_step_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called at the first micro-batch of each optimizer step."""

    @no_op
    def on_substep_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called after each micro-batch but the last of a gradient-accumulation cycle."""

    @no_op
    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called after gradient clipping, before `optimizer.step()`."""

    @no_op
    def on_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called after `optimizer.step()`, before the scheduler steps and gradients are zeroed."""

    @no_op
    def on_step_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called at the end of each optimizer step."""

    @no_op
    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called after an evaluation; `metrics` holds its values."""

    @no_op
    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TrainerControl | None:
        """Called after `predict`."""

    @no_op
    def on_save(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called after a checkpoint is saved."""

    @no_op
    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TrainerControl | None:
        """Called after logging; `logs` holds the values logged."""

    @no_op
    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl | None:
        """Called after each evaluation or prediction batch."""
