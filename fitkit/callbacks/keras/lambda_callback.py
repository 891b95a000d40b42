"""`LambdaCallback`: a callback made of plain functions, one per event (Keras), with HF's or Keras'
arguments."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fitkit.callbacks.keras.names import EVENT_OF, KERAS_NAMES, KERAS_ONLY_NAMES
from fitkit.common.options import closest, did_you_mean
from fitkit.events.handler import TrainerCallback
from fitkit.events.state import EVENTS, MOMENTS

#: What an HF-style function given under a Keras-only name should be given as.
KERAS_EVENTS: dict[str, str] = {name: EVENT_OF[name] for name in KERAS_ONLY_NAMES if name not in MOMENTS}
#: The names a function may be given under: HF's events, fitkit's added moments, Keras' methods.
NAMES: tuple[str, ...] = EVENTS + MOMENTS + tuple(KERAS_EVENTS)


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

    Keras' functions work too: `on_epoch_end=lambda epoch, logs: ...`, `on_train_batch_end=lambda
    batch, logs: ...` (running averages), `on_train_begin=lambda logs: ...`, `on_test_end`,
    `on_predict_batch_end`, ... are called positionally with Keras 3's meanings (see
    `fitkit.callbacks.Callback`), whatever their parameters are named. Which convention a function
    follows is settled once, here: a function whose parameters start `(args, state, control` or that
    takes `**kwargs` is HF's, any other under a Keras name is Keras' (`keras_functions` holds those).
    A Keras-only name (`on_train_batch_end`) given an HF-style function, and a name close to an event
    (a typo such as `on_epoch_ned`), raise `TypeError` naming the event to use.

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
            if name in NAMES and fn is not None and not callable(fn):
                raise TypeError(f"LambdaCallback: `{name}` must be a function (args, state, control, **kwargs), "
                                f"or Keras' ({'epoch, ' if 'epoch' in name else 'batch, ' if 'batch' in name else ''}"
                                f"logs), got {fn!r}")
            if name in KERAS_EVENTS and fn is not None and _hf_shaped(fn, name):
                raise TypeError(f"LambdaCallback: `{name}` is Keras' method, called as {name}("
                                f"{'batch, ' if 'batch' in name else ''}logs); this function takes other arguments. "
                                f"For fitkit's event at that moment pass it as `{KERAS_EVENTS[name]}` "
                                "(args, state, control, **kwargs)")
        self._functions: dict[str, Callable] = {k: v for k, v in event_functions.items()
                                                if k in NAMES and v is not None}
        #: The functions called with Keras' arguments (`KerasAdapter` runs them), by Keras method name.
        self.keras_functions: dict[str, Callable] = {k: v for k, v in self._functions.items()
                                                     if k in KERAS_NAMES and not _hf_shaped(v, k)}
        for name, value in event_functions.items():
            if name not in self.keras_functions and (name not in NAMES or value is not None):
                setattr(self, name, value)

    def __repr__(self) -> str:
        return f"LambdaCallback({', '.join(self._functions)})"


def _name_problem(name: str) -> str | None:
    """Why `name` cannot be a keyword of LambdaCallback, or None when it can."""
    if name in NAMES:
        return None
    if name.startswith("_"):
        return f"`{name}` is private (starts with '_'); pass the events by name, or other attributes without '_'"
    if name.startswith("on_") and closest(name, EVENTS + MOMENTS) is not None:
        return (f"{did_you_mean(name, NAMES)}`{name}` is not one of the events: {', '.join(NAMES)} (for a custom "
                "event of that name, subclass TrainerCallback)")
    return None


def _hf_shaped(fn: Callable, name: str) -> bool:
    """Whether `fn`, given under `name`, takes HF's event arguments: `(args, state, control, ...)`; under
    a name HF's events share with Keras (`on_epoch_end`), also any function with `**kwargs` (HF passes
    its values by keyword) or without a readable signature."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return name not in KERAS_ONLY_NAMES
    if [p.name for p in params[:3]] == ["args", "state", "control"]:
        return True
    return name not in KERAS_ONLY_NAMES and any(p.kind is p.VAR_KEYWORD for p in params)
