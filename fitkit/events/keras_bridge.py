"""Keras-style callbacks on the `TrainerCallback` event set: which event calls which Keras method.

`CallbackHandler.listeners(event)` asks `KerasBridge.listeners(callback, event)` for each
callback: the Keras methods the event stands for (as listeners in the callback's place in the
list) and whether the callback's own method of the event's name is an HF listener too.

| Keras method | fired at (fitkit event) |
| --- | --- |
| `set_model`, `set_params`, `on_train_begin` | `on_train_begin` |
| `on_epoch_begin(epoch)` | `on_epoch_begin` |
| `on_train_batch_begin(batch)` / `on_batch_begin` | `on_step_begin` |
| `on_train_batch_end(batch, running logs)` / `on_batch_end` | `on_step_end` |
| `on_test_begin` | `on_evaluate_begin` (fitkit's, before the first evaluation batch) |
| `on_test_batch_begin(batch)` | `on_prediction_step_begin` (fitkit's) in an evaluation |
| `on_test_batch_end(batch, running logs)` | `on_prediction_step` in an evaluation |
| `on_test_end(values)` | `on_evaluate` |
| `on_epoch_end(epoch, epoch logs)` | `on_epoch_summary` (fitkit's, after the epoch-end log, evaluation and save) |
| `on_predict_begin` | `on_predict_begin` (fitkit's) |
| `on_predict_batch_begin(batch)` | `on_prediction_step_begin` in `predict` |
| `on_predict_batch_end(batch, {"outputs"})` | `on_prediction_step` in `predict` |
| `on_predict_end` | `on_predict` |
| `on_train_end(last epoch logs)` | `on_train_end` |
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

from fitkit.events.keras_names import (
    EVENT_OF,
    KERAS_NAMES,
    KERAS_ONLY_NAMES,
    MOMENTS,
    keras_class,
    keras_signature,
    overrides,
)

logger = logging.getLogger("fitkit")

#: What an HF-signature method of a Keras-only name should be instead.
_INSTEAD = {
    "on_train_batch_begin": "on_step_begin", "on_batch_begin": "on_step_begin",
    "on_train_batch_end": "on_step_end", "on_batch_end": "on_step_end", "on_test_end": "on_evaluate",
    "on_test_batch_end": "on_prediction_step", "on_predict_batch_end": "on_prediction_step",
    "on_predict_end": "on_predict",
}
_BEGIN_EVENTS = ("on_train_begin", "on_evaluate_begin", "on_predict_begin")


def keras_methods(callback: Any) -> tuple[str, ...]:
    """The Keras methods of `callback` that are called with Keras' meanings. For a subclass of
    fitkit's or Keras' `Callback`: every one it overrides. For any other callback, the Keras-named
    methods whose signature is Keras' (`on_epoch_end(self, epoch, logs=None)`); Keras-named methods
    with another signature are warned about once per class (`warn_unmapped`)."""
    cls: type = type(callback)  # `type`: mypy takes a `type[Any]` for unhashable
    if keras_class(cls):
        return tuple(n for n in KERAS_NAMES if overrides(callback, n))
    found = []
    for name in KERAS_NAMES:
        method = getattr(callback, name, None)
        if callable(method) and overrides(callback, name):  # really defined, not made up by __getattr__
            if keras_signature(method, name):
                found.append(name)
    return tuple(found)


@functools.lru_cache(maxsize=1024)
def _warn_unmapped(cls: type) -> None:
    """One warning per class naming its Keras-named methods that fitkit cannot call."""
    bad = []
    for name in KERAS_ONLY_NAMES:
        method = getattr(cls, name, None)
        if callable(method) and keras_signature(method, name) is not True:
            use = _INSTEAD.get(name)
            bad.append(f"{cls.__name__}.{name}: Keras calls it as {name}({'batch, ' if 'batch' in name else ''}"
                       f"logs=None); {'use ' + use + '(args, state, control, **kwargs) for the HF event' if use else 'fitkit has no HF event there'}"
                       " or give it Keras' signature")
    if bad:
        warnings.warn("these methods are not called, their signature is neither Keras' nor HF's:\n  "
                      + "\n  ".join(bad), UserWarning, stacklevel=2)


class KerasBridge:
    """Per `CallbackHandler`: the Keras-style listeners of its callbacks and the state they share
    (phase, batch index, the running logs of the batch being read, the last epoch's logs)."""

    def __init__(self, handler: Any):
        self.handler = handler
        self.phase: str | None = None  # "test" / "predict" between their begin and end events
        self.train_batch = 0
        self.test_batch = 0
        self.epoch_logs: dict[str, float] = {}
        self._cached: tuple[Any, dict] | None = None

    # -- which listeners ----------------------------------------------------------------------
    def listeners(self, callback: Any, event: str) -> tuple[list[Callable], bool]:
        """The Keras methods of `callback` to call at `event`, and whether its own method named
        `event` is an HF listener as well."""
        names = keras_methods(callback)
        cls: type = type(callback)  # `type`: mypy takes a `type[Any]` for unhashable
        is_keras = keras_class(cls)
        if not is_keras:
            _warn_unmapped(cls)
        native = not (event in KERAS_NAMES and (is_keras or event in names))  # same name, Keras meaning
        if event in MOMENTS and native:  # fitkit's own moments reach only methods really defined
            native = any(event in klass.__dict__ for klass in type(callback).__mro__) or event in vars(callback)
        wanted = [n for n in names if EVENT_OF[n] == event]
        if is_keras and event in _BEGIN_EVENTS:  # set_model / set_params, even when not overridden
            wanted = wanted or ["<setup>"]
        if event in ("on_step_begin", "on_step_end") and "on_train_batch_begin" in wanted and "on_batch_begin" in wanted:
            wanted.remove("on_batch_begin")  # Keras' base on_train_batch_begin calls it
        if "on_train_batch_end" in wanted and "on_batch_end" in wanted:
            wanted.remove("on_batch_end")
        if not wanted:
            return [], native
        return [_Listener(self, callback, event, wanted, is_keras)], native

    # -- what the Keras methods receive -------------------------------------------------------
    def setup(self, callback: Any, args: Any, state: Any, event: str) -> None:
        if hasattr(callback, "set_model"):
            handler = self.handler  # the facade sets `keras_model`: a view of the fitkit Model
            callback.set_model(handler.keras_model if handler.keras_model is not None else handler.model)
        if hasattr(callback, "set_params"):
            steps = self.handler.steps_per_epoch if event == "on_train_begin" else None
            epochs = state.num_train_epochs if event == "on_train_begin" else 1
            callback.set_params({"verbose": _verbose(args), "epochs": epochs, "steps": steps})

    def running(self, phase: str, index: int) -> dict[str, float]:
        """The running averages for batch `index` of `phase` ("train"/"test"), read once per batch
        however many callbacks ask."""
        key = (phase, index, id(self.handler.__dict__.get("running_logs")))
        if self._cached is not None and self._cached[0] == key:
            return dict(self._cached[1])
        reader = getattr(self.handler, "running_logs", None)
        logs = reader.read(phase) if reader is not None else {}
        self._cached = (key, logs)
        return dict(logs)


def _verbose(args: Any) -> int:
    verbose = getattr(args, "verbose", 1)
    if verbose == "auto":
        try:
            return 1 if sys.stdout.isatty() else 2
        except (AttributeError, ValueError):
            return 2
    return verbose


class _Listener:
    """One callback's Keras methods at one fitkit event, called as that event's listener."""

    def __init__(self, bridge: KerasBridge, callback: Any, event: str, names: list[str], is_keras: bool):
        self.bridge, self.callback, self.event, self.names, self.is_keras = bridge, callback, event, names, is_keras
        # Only a predict-batch-end method reads the batch's outputs (see Loop._carried_events).
        self.takes_batch = "on_predict_batch_end" in names

    def __call__(self, args, state, control, **kwargs):
        bridge, cb, event = self.bridge, self.callback, self.event
        if event in _BEGIN_EVENTS and self.is_keras:
            if event == "on_train_begin" or getattr(cb, "model", None) is None:
                bridge.setup(cb, args, state, event)
        for name in self.names:
            if name == "<setup>":
                continue
            call = getattr(cb, name)
            _CALLERS[event](bridge, name, call, state, kwargs)
        return None


def _train_begin(bridge, name, call, state, kwargs):
    call(logs={})


def _train_end(bridge, name, call, state, kwargs):
    call(logs=dict(bridge.epoch_logs))


def _epoch_begin(bridge, name, call, state, kwargs):
    call(int(state.epoch or 0), logs={})


def _epoch_summary(bridge, name, call, state, kwargs):
    call(kwargs.get("epoch", int(state.epoch or 1) - 1), logs=dict(kwargs.get("logs") or {}))


def _step_begin(bridge, name, call, state, kwargs):
    call(bridge.train_batch, logs={})


def _step_end(bridge, name, call, state, kwargs):
    call(bridge.train_batch, logs=bridge.running("train", (state.global_step, bridge.train_batch)))


def _evaluate_begin(bridge, name, call, state, kwargs):
    call(logs={})


def _evaluate(bridge, name, call, state, kwargs):
    metrics = kwargs.get("metrics") or {}
    call(logs={(k[4:] if k.startswith("val_") else k): v for k, v in metrics.items()})


def _batch_begin(bridge, name, call, state, kwargs):
    if name.startswith("on_" + (bridge.phase or "")):
        call(bridge.test_batch, logs={})


def _batch_end(bridge, name, call, state, kwargs):
    phase = bridge.phase
    if phase == "test" and name == "on_test_batch_end":
        call(bridge.test_batch, logs=bridge.running("test", bridge.test_batch))
    elif phase == "predict" and name == "on_predict_batch_end":
        call(bridge.test_batch, logs={"outputs": kwargs.get("outputs")})


def _predict_begin(bridge, name, call, state, kwargs):
    call(logs={})


def _predict_end(bridge, name, call, state, kwargs):
    call(logs={})


_CALLERS = {
    "on_train_begin": _train_begin, "on_train_end": _train_end, "on_epoch_begin": _epoch_begin,
    "on_epoch_summary": _epoch_summary, "on_step_begin": _step_begin, "on_step_end": _step_end,
    "on_evaluate_begin": _evaluate_begin, "on_evaluate": _evaluate, "on_prediction_step_begin": _batch_begin,
    "on_prediction_step": _batch_end, "on_predict_begin": _predict_begin, "on_predict": _predict_end,
}


# -- bookkeeping: the phase and batch indices, kept around the Keras listeners ----------------------
def _begin_epoch(bridge: KerasBridge, state: Any) -> None:
    spe, epoch = bridge.handler.steps_per_epoch, int(state.epoch or 0)
    bridge.train_batch = max(state.global_step - epoch * spe, 0) if spe else 0  # a resumed epoch starts part-way
    bridge.epoch_logs = {}


def _set_phase(phase: str | None) -> Callable[[KerasBridge, Any], None]:
    def set_phase(bridge: KerasBridge, state: Any) -> None:
        bridge.phase, bridge.test_batch = phase, 0
    return set_phase


def _next_train_batch(bridge: KerasBridge, state: Any) -> None:
    bridge.train_batch += 1


def _next_test_batch(bridge: KerasBridge, state: Any) -> None:
    bridge.test_batch += 1


#: event -> (before the listeners, after them)
_BOOKKEEPING: dict[str, tuple[Callable | None, Callable | None]] = {
    "on_epoch_begin": (_begin_epoch, None),
    "on_step_end": (None, _next_train_batch),
    "on_evaluate_begin": (_set_phase("test"), None),
    "on_predict_begin": (_set_phase("predict"), None),
    "on_prediction_step": (None, _next_test_batch),
    "on_evaluate": (None, _set_phase(None)),
    "on_predict": (None, _set_phase(None)),
}


def with_bookkeeping(bridge: KerasBridge, event: str, found: list, callbacks: Any) -> list:
    """`found` (an event's listeners) with the bridge's bookkeeping around them, when some
    callback of the handler has Keras methods; else `found` unchanged."""
    before, after = _BOOKKEEPING.get(event, (None, None))
    if event == "on_epoch_summary":
        before = _keep_epoch_logs
    if before is None and after is None:
        return found
    if not any(keras_class(type(cb)) or keras_methods(cb)  # type: ignore[arg-type]  # mypy: type[Any] not Hashable
               for cb in callbacks):
        return found
    wrap = lambda fn: _Bookkeeper(bridge, fn)  # noqa: E731
    return ([wrap(before)] if before else []) + found + ([wrap(after)] if after else [])


def _keep_epoch_logs(bridge: KerasBridge, state: Any, logs: dict | None = None) -> None:
    bridge.epoch_logs = dict(logs or {})


class _Bookkeeper:
    takes_batch = False

    def __init__(self, bridge: KerasBridge, fn: Callable):
        self.bridge, self.fn = bridge, fn

    def __call__(self, args, state, control, **kwargs):
        if self.fn is _keep_epoch_logs:
            self.fn(self.bridge, state, kwargs.get("logs"))
        else:
            self.fn(self.bridge, state)
        return None


def keras_bridge(handler: Any) -> KerasBridge:
    """The handler's bridge (made on first use)."""
    bridge = handler.__dict__.get("_keras_bridge")
    if bridge is None:
        bridge = handler.__dict__["_keras_bridge"] = KerasBridge(handler)
    return bridge
