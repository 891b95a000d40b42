"""`LambdaCallback`: a callback made of plain functions, one per event (Keras)."""

from __future__ import annotations

from typing import Any, Callable

from fitkit.callbacks.base import EVENTS, TrainerCallback
from fitkit.options import closest, did_you_mean

#: Keras' event names that fitkit's event set has no method of that name for, and the fitkit
#: event where the same moment is (None: no such moment).
KERAS_EVENTS: dict[str, str | None] = {
    "on_batch_begin": "on_step_begin", "on_batch_end": "on_step_end",
    "on_train_batch_begin": "on_step_begin", "on_train_batch_end": "on_step_end",
    "on_test_begin": None, "on_test_end": "on_evaluate",
    "on_test_batch_begin": None, "on_test_batch_end": "on_prediction_step",
    "on_predict_begin": None, "on_predict_end": "on_predict",
    "on_predict_batch_begin": None, "on_predict_batch_end": "on_prediction_step",
}


class LambdaCallback(TrainerCallback):
    """Build a callback from functions passed by event name.

    Any of the documented events may be given (`on_init_end`, `on_train_begin`,
    `on_train_end`, `on_epoch_begin`, `on_epoch_end`, `on_step_begin`, `on_step_end`,
    `on_substep_end`, `on_pre_optimizer_step`, `on_optimizer_step`, `on_log`, `on_evaluate`,
    `on_save`, `on_predict`, `on_prediction_step`). Each function receives that event's own
    arguments, `(args, state, control, **kwargs)` (`logs=` in `on_log`, `metrics=` in
    `on_evaluate`, plus `model`, `optimizer`, ...), and may return a `TrainerControl`. `None`
    for an event is the same as leaving it out.

    Other keyword arguments are stored as attributes, as Keras does
    (`LambdaCallback(custom_method=fn).custom_method is fn`); a function stored under a
    custom event's name is called by that event (`model.call_event("on_verify_batch", ...)`).
    A Keras event name fitkit does not have (`on_train_batch_end`, `on_test_begin`, ...) and a
    name close to a documented event (a typo such as `on_epoch_ned`) raise `TypeError` naming
    the event to use.

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

    def __init__(self, **event_functions: Any) -> None:
        for name, fn in event_functions.items():
            problem = _name_problem(name)
            if problem:
                raise TypeError(f"LambdaCallback: {problem}")
            if name in EVENTS and fn is not None and not callable(fn):
                raise TypeError(f"LambdaCallback: `{name}` must be a function (args, state, control, **kwargs), "
                                f"got {fn!r}")
        self._functions: dict[str, Callable] = {k: v for k, v in event_functions.items()
                                                if k in EVENTS and v is not None}
        for name, value in event_functions.items():
            if name not in EVENTS or value is not None:
                setattr(self, name, value)

    def __repr__(self) -> str:
        return f"LambdaCallback({', '.join(self._functions)})"


def _name_problem(name: str) -> str | None:
    """Why `name` cannot be a keyword of LambdaCallback, or None when it can."""
    if name in EVENTS:
        return None
    if name.startswith("_"):
        return f"`{name}` is private (starts with '_'); pass the events by name, or other attributes without '_'"
    if name in KERAS_EVENTS:
        target = KERAS_EVENTS[name]
        where = (f"use `{target}`" if target else
                 "it has no event at that moment (`on_prediction_step` follows each batch, `on_evaluate` / "
                 "`on_predict` the end)")
        return (f"`{name}` is a Keras event that fitkit does not have: {where}; fitkit's events are called as "
                f"(args, state, control, **kwargs). The events are: {', '.join(EVENTS)}")
    if name.startswith("on_") and closest(name, EVENTS) is not None:
        return (f"{did_you_mean(name, EVENTS)}`{name}` is not one of the events: {', '.join(EVENTS)} (for a custom "
                "event of that name, subclass TrainerCallback)")
    return None
