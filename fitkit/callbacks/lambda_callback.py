"""`LambdaCallback`: a callback made of plain functions, one per event (Keras)."""

from __future__ import annotations

from typing import Callable

from fitkit.callbacks.base import EVENTS, TrainerCallback
from fitkit.options import did_you_mean


class LambdaCallback(TrainerCallback):
    """Build a callback from functions passed by event name.

    Any of the documented events may be given (`on_init_end`, `on_train_begin`,
    `on_train_end`, `on_epoch_begin`, `on_epoch_end`, `on_step_begin`, `on_step_end`,
    `on_substep_end`, `on_pre_optimizer_step`, `on_optimizer_step`, `on_log`, `on_evaluate`,
    `on_save`, `on_predict`, `on_prediction_step`). Each function receives that event's own
    arguments, `(args, state, control, **kwargs)` (`logs=` in `on_log`, `metrics=` in
    `on_evaluate`, plus `model`, `optimizer`, ...), and may return a `TrainerControl`. `None`
    for an event is the same as leaving it out; another name raises `TypeError`.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import LambdaCallback

        losses = []
        record = LambdaCallback(
            on_log=lambda args, state, control, logs=None, **kw: losses.append(logs.get("loss")),
            on_train_end=lambda args, state, control, **kw: print("done at step", state.global_step),
        )
        x, y = torch.randn(64, 4), torch.randn(64, 1)
        Model(torch.nn.Linear(4, 1)).compile("sgd", "mse").fit(x, y, epochs=2, callbacks=[record], verbose=0)
    """

    # The functions are instance attributes named after their events: the callback handler
    # calls an instance attribute like an overridden method, and only for the events given.

    def __init__(self, **event_functions: Callable | None) -> None:
        unknown = sorted(set(event_functions) - set(EVENTS))
        if unknown:
            raise TypeError(
                f"{did_you_mean(unknown, EVENTS)}LambdaCallback got unknown event name(s) {', '.join(unknown)}; "
                f"the events are: {', '.join(EVENTS)}"
            )
        for name, fn in event_functions.items():
            if fn is not None and not callable(fn):
                raise TypeError(f"LambdaCallback: `{name}` must be a function (args, state, control, **kwargs), got {fn!r}")
        self._functions = {k: v for k, v in event_functions.items() if v is not None}
        for name, fn in self._functions.items():
            setattr(self, name, fn)

    def __repr__(self) -> str:
        return f"LambdaCallback({', '.join(self._functions)})"
