"""`KerasAdapter`: one Keras-style callback on fitkit's event set, its methods called positionally as
Keras 3 calls them (`on_epoch_end(epoch, logs)`, `on_train_batch_end(batch, logs)`, `on_test_end(logs)`).

The facade wraps every Keras-style callback of a run (`fitkit.callbacks.keras.names.is_keras_style`)::

    handler.add_callback(KerasAdapter(callback, model=model))   # `model`: what `set_model` receives

| Keras method | fitkit event |
| --- | --- |
| `set_model`, `set_params`, `on_train_begin(logs)` | `on_train_begin` |
| `on_epoch_begin(epoch, logs)` | `on_epoch_begin` |
| `on_train_batch_begin(batch, logs)` / `on_batch_begin` | `on_step_begin` |
| `on_train_batch_end(batch, running logs)` / `on_batch_end` | `on_step_end` |
| `on_test_begin(logs)` | `on_evaluate_begin` (the loop's, before the first evaluation batch) |
| `on_test_batch_begin(batch, logs)` | `on_prediction_step_begin` (the loop's) in an evaluation |
| `on_test_batch_end(batch, running logs)` | `on_prediction_step` in an evaluation |
| `on_test_end(values)` | `on_evaluate` |
| `on_epoch_end(epoch, epoch logs)` | `on_epoch_summary` (the loop's, after the epoch's log, evaluation and save) |
| `on_predict_begin(logs)` | `on_predict_begin` (the loop's) |
| `on_predict_batch_begin(batch, logs)` | `on_prediction_step_begin` in `predict` |
| `on_predict_batch_end(batch, {"outputs": ...})` (a dict output: its items, as Keras flattens it) | `on_prediction_step` in `predict` |
| `on_predict_end(logs)` | `on_predict` |
| `on_train_end(last epoch logs)` | `on_train_end` |

The adapter listens only to the events the wrapped callback's methods need (its instance holds
them), so a Keras-style callback with `on_epoch_end` alone costs nothing per step. Methods of other
names (`on_log`, `on_step_end`, custom events) are HF's: passed on as `(args, state, control, **kwargs)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitkit.callbacks.keras.keras_own import CHANGES_LEARNING_RATE, keras_callback_name
from fitkit.callbacks.keras.names import KERAS_NAMES, keras_methods
from fitkit.common.terminal import resolved_verbose
from fitkit.events.base_defaults import is_base_default
from fitkit.events.handler import TrainerCallback
from fitkit.events.state import Order, TrainerControl, TrainerState

#: The events the adapter handles itself (the HF method of the same name, if any, runs first).
_OWN_EVENTS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_step_begin", "on_step_end",
               "on_evaluate_begin", "on_prediction_step_begin", "on_prediction_step", "on_evaluate",
               "on_predict_begin", "on_predict", "on_epoch_summary")
#: Which Keras methods make the adapter listen to an event (None: always, for set_model and the phase).
_NEEDED_BY: dict[str, tuple[str, ...] | None] = {
    "on_train_begin": None,
    "on_evaluate_begin": None,
    "on_predict_begin": None,
    "on_train_end": ("on_train_end",),
    "on_epoch_begin": ("on_epoch_begin", "on_train_batch_begin", "on_train_batch_end"),
    "on_step_begin": ("on_train_batch_begin",),
    "on_step_end": ("on_train_batch_begin", "on_train_batch_end"),
    "on_prediction_step_begin": ("on_test_batch_begin", "on_predict_batch_begin"),
    "on_prediction_step": ("on_test_batch_begin", "on_test_batch_end", "on_predict_batch_begin",
                           "on_predict_batch_end"),
    "on_evaluate": ("on_test_end",),
    "on_predict": ("on_predict_end",),
    "on_epoch_summary": ("on_epoch_end", "on_train_end"),
}


class KerasAdapter(TrainerCallback):
    """Runs `callback`'s Keras methods at fitkit's events (see the module's table).

    `model` is what Keras' `set_model` receives (the user's `Model`; default: the module the event
    carries). `wrapped` is the callback itself: checkpoints keep its `state()` under its class name.
    """

    def __init__(self, callback: Any, model: Any = None) -> None:
        self.wrapped = callback
        self.keras_model = model
        self.order = getattr(callback, "order", Order.USER)
        self.changes_learning_rate = bool(getattr(callback, "changes_learning_rate", False)
                                          or keras_callback_name(callback) in CHANGES_LEARNING_RATE)
        self.methods = keras_methods(callback)
        self.hf = _hf_methods(callback, self.methods)
        # Only a predict-batch-end method, or an HF step method, reads a batch's outputs.
        self.takes_batch = "on_predict_batch_end" in self.methods or any(
            getattr(getattr(m, "__self__", m), "takes_batch", True)
            for e, m in self.hf.items() if e in ("on_step_end", "on_substep_end", "on_prediction_step"))
        self.phase: str | None = None  # "test" / "predict" from their begin events on
        self.train_batch = self.test_batch = 0
        self.epoch_logs: dict[str, Any] = {}
        self.steps_per_epoch: int | None = None
        self.running_logs: Any = None
        for name in ("state", "load_state", "close_run"):  # checkpointed state, the end of a run: the callback's
            method = getattr(callback, name, None)
            if callable(method) and not (name == "close_run" and is_base_default(method)):
                setattr(self, name, method)
        for event, method in self.hf.items():
            if event not in _OWN_EVENTS:
                setattr(self, event, method)
        for event in _OWN_EVENTS:
            needed = _NEEDED_BY[event]
            if event in self.hf or needed is None or any(n in self.methods for n in needed):
                setattr(self, event, getattr(self, "_" + event))

    def __repr__(self) -> str:
        return f"KerasAdapter({self.wrapped!r})"

    # -- calling the callback --------------------------------------------------------------------------------------
    def _call(self, name: str, *arguments: Any) -> None:
        method = self.methods.get(name)
        if method is not None:
            method(*arguments)  # positionally, as Keras' CallbackList calls it

    def _hf_call(self, event: str, args: Any, state: TrainerState, control: TrainerControl,
                 kwargs: dict[str, Any]) -> TrainerControl | None:
        method = self.hf.get(event)
        return method(args, state, control, **kwargs) if method is not None else None

    def _setup(self, args: Any, state: TrainerState, kwargs: dict[str, Any], training: bool) -> None:
        """Keras' `set_model` / `set_params`: at `on_train_begin`, and before an evaluation or a
        prediction outside `fit` (the callback has no model yet)."""
        cb = self.wrapped
        if not training and getattr(cb, "model", None) is not None:
            return
        if callable(getattr(cb, "set_model", None)):
            cb.set_model(self.keras_model if self.keras_model is not None else kwargs.get("model"))
        if callable(getattr(cb, "set_params", None)):
            cb.set_params({"verbose": _verbose(args), "epochs": state.num_train_epochs if training else 1,
                           "steps": self.steps_per_epoch if training else None})

    def _running(self, phase: str) -> dict[str, float]:
        reader = self.running_logs
        return reader.read(phase) if reader is not None else {}

    # -- the events (set on the instance in __init__ for those the callback needs) ----------------------------------
    def _on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> TrainerControl | None:
        self.steps_per_epoch, self.running_logs = kwargs.get("steps_per_epoch"), kwargs.get("running_logs")
        self.epoch_logs = {}
        result = self._hf_call("on_train_begin", args, state, control, kwargs)
        self._setup(args, state, kwargs, training=True)
        self._call("on_train_begin", {})
        return result

    def _on_train_end(self, args: Any, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_train_end", args, state, control, kwargs)
        self._call("on_train_end", self.epoch_logs)
        return result

    def _on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                        **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_epoch_begin", args, state, control, kwargs)
        epoch, steps = int(state.epoch or 0), self.steps_per_epoch
        self.train_batch = max(state.global_step - epoch * steps, 0) if steps else 0  # a resumed epoch: part-way
        self._call("on_epoch_begin", epoch, {})
        return result

    def _on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_step_begin", args, state, control, kwargs)
        self._call("on_train_batch_begin", self.train_batch, {})
        return result

    def _on_step_end(self, args: Any, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_step_end", args, state, control, kwargs)
        if "on_train_batch_end" in self.methods:
            self._call("on_train_batch_end", self.train_batch, self._running("train"))
        self.train_batch += 1
        return result

    def _on_evaluate_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_evaluate_begin", args, state, control, kwargs)
        self.phase, self.test_batch = "test", 0
        if kwargs.get("running_logs") is not None:
            self.running_logs = kwargs["running_logs"]
        self._setup(args, state, kwargs, training=False)
        self._call("on_test_begin", {})
        return result

    def _on_predict_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_predict_begin", args, state, control, kwargs)
        self.phase, self.test_batch = "predict", 0
        self._setup(args, state, kwargs, training=False)
        self._call("on_predict_begin", {})
        return result

    def _on_prediction_step_begin(self, args: Any, state: TrainerState, control: TrainerControl,
                                  **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_prediction_step_begin", args, state, control, kwargs)
        self._call(f"on_{self.phase}_batch_begin", self.test_batch, {})
        return result

    def _on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl,
                            **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_prediction_step", args, state, control, kwargs)
        if self.phase == "test" and "on_test_batch_end" in self.methods:
            self._call("on_test_batch_end", self.test_batch, self._running("test"))
        elif self.phase == "predict" and "on_predict_batch_end" in self.methods:
            self._call("on_predict_batch_end", self.test_batch, predict_logs(kwargs.get("outputs")))
        self.test_batch += 1
        return result

    def _on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_evaluate", args, state, control, kwargs)
        metrics = kwargs.get("metrics") or {}
        self._call("on_test_end", {(k[4:] if k.startswith("val_") else k): v for k, v in metrics.items()})
        return result

    def _on_predict(self, args: Any, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_predict", args, state, control, kwargs)
        self._call("on_predict_end", {})
        return result

    def _on_epoch_summary(self, args: Any, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> TrainerControl | None:
        result = self._hf_call("on_epoch_summary", args, state, control, kwargs)
        # One dict for every callback of the epoch, as Keras' CallbackList passes it: what one adds
        # (ReduceLROnPlateau's `learning_rate`) the next sees, and `on_train_end` gets it back.
        logs = kwargs.get("logs")
        self.epoch_logs = logs if logs is not None else {}
        epoch = kwargs.get("epoch", int(state.epoch or 1) - 1)
        self._call("on_epoch_end", epoch, self.epoch_logs)
        return result


def _hf_methods(callback: Any, keras: dict[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The callback's other event methods (`on_log`, `on_step_end`, custom events): HF's, passed on.
    Keras' names are Keras' methods, except on an object that declares its Keras functions."""
    declared = bool(getattr(callback, "keras_functions", None))
    found = {}
    for name in dir(callback):
        if not name.startswith("on_") or name in keras or (not declared and name in KERAS_NAMES):
            continue
        method = getattr(callback, name, None)
        if callable(method) and not is_base_default(method):
            found[name] = method
    return found


def _verbose(args: Any) -> int:
    return resolved_verbose(getattr(args, "verbose", 1))


def predict_logs(outputs: Any) -> dict[str, Any]:
    """The logs Keras 3 gives `on_predict_batch_end`: `{"outputs": outputs}`, flattened as its
    callback list flattens logs, so a dict output's items come by their keys (sorted, nested
    dicts flattened). The values stay tensors on the device."""
    if not isinstance(outputs, dict):
        return {"outputs": outputs}
    flat: dict[str, Any] = {}
    for key, value in sorted(outputs.items()):
        flat.update(predict_logs(value) if isinstance(value, dict) else {key: value})
    return flat
