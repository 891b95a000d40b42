"""`CallbackHandler`: the callbacks of a run, in order, and the events fired on them.

The engine fires each event through it (`handler.on_log(args, state, control, logs=...)`, or
`call_event(name, ...)` for a custom one); it calls only the callbacks that really handle the
event (`fitkit.events.listening`). The base class `TrainerCallback` (`fitkit.events.callback`)
and the shared data (`TrainerState`, `TrainerControl`, `Order`, `Stateful`, `StopTraining`,
`EVENTS`, `MOMENTS`; `fitkit.events.state`) are importable from here::

    from fitkit.events.handler import CallbackHandler, TrainerCallback

    handler = CallbackHandler([DefaultFlowCallback(), PrintLoss()])
    control = handler.on_log(args, state, control, logs={"loss": 0.25})
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from fitkit.events.callback import TrainerCallback
from fitkit.events.callback_checks import as_callback
from fitkit.events.hf_view import HFView
from fitkit.events.listening import EVENT_SET, class_events, forget, listened, listening, makes_attributes
from fitkit.events.state import EVENTS, MOMENTS, Order, Stateful, StopTraining, TrainerControl, TrainerState

__all__ = ["EVENTS", "MOMENTS", "CallbackHandler", "Order", "Stateful", "StopTraining", "TrainerCallback",
           "TrainerControl", "TrainerState"]

logger = logging.getLogger("fitkit")


def callback_class(callback: Any) -> type:
    """The class a callback of the list stands for: its own, or for an adapter (an object with
    `wrapped`, such as `fitkit.callbacks.keras.adapter.KerasAdapter`) the wrapped callback's. Checkpoints
    keep states under its name, and `pop_callback(cls)` finds it by it."""
    wrapped = getattr(callback, "wrapped", None)
    return type(wrapped if wrapped is not None else callback)


def drives_flow(callback: Any) -> bool:
    """Whether `callback` sets the log / evaluate / save switches on schedule: one that says
    `drives_flow = True` (`DefaultFlowCallback`), or transformers' own flow callback."""
    if getattr(callback, "drives_flow", False) is True:
        return True
    hf = sys.modules.get("transformers.trainer_callback")  # loaded when such a callback exists
    return hf is not None and isinstance(callback, getattr(hf, "DefaultFlowCallback", ()))


class CallbackHandler(TrainerCallback):
    """Holds the callbacks of a run and fires events on them, in order.

    For each event it keeps the list of callbacks that really override it, so an event no
    callback listens to costs one dictionary look-up; a base class's empty hook
    (`fitkit.events.base_defaults.is_base_default`) is never called, and any override is.
    Besides HF's events it fires fitkit's own (`MOMENTS`) by name, and `call_event` fires custom
    events: every callback with a method of that name receives it.

    `metric_directions` maps logged names (`"val_loss"`, `"accuracy"`, `"val_mae"`, ...) to
    `"min"` or `"max"`, from the compiled metrics' own `higher_is_better`; the engine sets it
    before `on_train_begin`, which passes it to its listeners as the `metric_directions`
    keyword (monitors with `mode="auto"` take their direction from it).
    """

    def __init__(
        self,
        callbacks: Iterable[TrainerCallback | type] = (),
        model=None,
        optimizer=None,
        lr_scheduler=None,
    ):
        self.callbacks: list[TrainerCallback] = []
        self._listeners: dict[str, list] = {}
        for cb in callbacks:
            self.add_callback(cb)
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        #: During fit: `save_checkpoint(directory) -> path` writes a full, resumable checkpoint
        #: (call it on every process). Passed to events as the `save_checkpoint` keyword.
        self.save_checkpoint: Callable[..., str] | None = None
        #: "min" / "max" per logged name, set by the engine before `on_train_begin`.
        self.metric_directions: dict[str, str] = {}
        #: Optimizer steps per epoch of the run starting (None: unknown), set by the engine and
        #: passed to `on_train_begin` as the `steps_per_epoch` keyword (Keras' `params["steps"]`).
        self.steps_per_epoch: int | None = None
        #: The loop's running averages (`fitkit.engine.batch_logs`), passed to `on_train_begin` as
        #: the `running_logs` keyword.
        self.running_logs: Any = None
        #: Called before any listener runs, when set: the engine waits there for an asynchronous
        #: checkpoint's copy of the weights (when one is under way), which a callback could
        #: otherwise change mid-copy.
        self.before_listeners: Callable[[], None] | None = None
        if not any(drives_flow(cb) for cb in self.callbacks):
            logger.warning("a run will not log, evaluate or save on schedule without a DefaultFlowCallback among its "
                           "callbacks: add one with handler.add_callback(DefaultFlowCallback). The callbacks are:\n%s",
                           self.callback_list)

    #: What a run hands its callbacks (`set_run`): the objects of HF's event keywords, and fitkit's.
    RUN_FIELDS = ("model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader", "save_checkpoint",
                  "metric_directions", "steps_per_epoch", "running_logs", "before_listeners")

    def set_run(self, **objects: Any) -> None:
        """Give the handler what the run starting hands its callbacks, once, as Keras'
        `set_model` / `set_params` do (names in `RUN_FIELDS`; the others keep their values)::

            handler.set_run(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                            train_dataloader=loader, metric_directions={"val_loss": "min"})
        """
        unknown = sorted(set(objects) - set(self.RUN_FIELDS))
        if unknown:
            raise TypeError(f"CallbackHandler.set_run() got {unknown}: it takes {', '.join(self.RUN_FIELDS)}")
        for name, value in objects.items():
            setattr(self, name, value)

    # -- the list ---------------------------------------------------------------------
    def add_callback(self, callback: TrainerCallback | type | Any) -> None:
        """Add a callback (an instance, or a class built with no argument; any object with event
        methods is one too); anything else raises `TypeError` (see `as_callback`)."""
        cb = as_callback(callback)
        cb_class = callback_class(cb)
        if any(callback_class(c) is cb_class for c in self.callbacks):
            warnings.warn(
                f"You are adding a {cb_class.__name__} to the callbacks but there is already one. "
                f"The current list of callbacks is: {self.callback_list}",
                stacklevel=3,
            )
        self.callbacks.append(cb)
        self._sort()

    def pop_callback(self, callback: TrainerCallback | type | Any) -> Any:
        for i, cb in enumerate(self.callbacks):
            if (isinstance(callback, type) and callback_class(cb) is callback) or cb is callback \
                    or getattr(cb, "wrapped", None) is callback:
                self._listeners.clear()
                return self.callbacks.pop(i)
        return None

    def remove_callback(self, callback: TrainerCallback | type | Any) -> None:
        self.pop_callback(callback)

    @property
    def callback_list(self) -> str:
        return "\n".join(callback_class(cb).__name__ for cb in self.callbacks)

    def _sort(self) -> None:
        # Stable: equal `order` keeps insertion order.
        self.callbacks.sort(key=lambda cb: getattr(cb, "order", Order.USER))  # transformers' have none
        self._listeners = {}

    def listeners(self, event: str) -> list:
        """The bound methods that handle `event`, cached."""
        found = self._listeners.get(event)
        if found is None:
            if event in EVENT_SET and "on_init_end" not in self._listeners:
                self._fill_documented()  # every documented event's listeners in one pass over the callbacks
                return self._listeners[event]
            found = []
            for cb in self.callbacks:
                listens, hf = listening(cb, event)
                if listens:
                    found.append(self._hf_wrapped(event, getattr(cb, event)) if hf else getattr(cb, event))
            self._listeners[event] = found
        return found

    def _fill_documented(self) -> None:
        """The listeners of every documented event (what a run's handler, new at each call, needs
        first): by each callback's class, decided once per class, unless the instance holds
        events itself or its class makes attributes on the fly."""
        table: dict[str, list] = {event: [] for event in EVENTS}
        for cb in self.callbacks:
            cls: type = type(cb)
            if makes_attributes(cls) or not EVENT_SET.isdisjoint(getattr(cb, "__dict__", ())):
                events = listened(functools.partial(listening, cb))
            else:
                events = class_events(cls)
            for event, hf in events:
                method = getattr(cb, event)
                table[event].append(self._hf_wrapped(event, method) if hf else method)
        self._listeners.update(table)

    def _hf_wrapped(self, event: str, method: Any) -> Any:
        """A transformers callback's handler, given HF-shaped `args` and HF-named values
        (`fitkit.events.hf_view`); built when the listeners are, so fitkit's own pay nothing."""
        view = self.__dict__.get("_hf_view")
        if view is None:
            view = self.__dict__["_hf_view"] = HFView(self)
        return view.wrap(event, method)

    def invalidate(self) -> None:
        """Forget cached listeners (call after changing a callback's methods at run time)."""
        self._listeners = {}
        forget()

    # -- firing -----------------------------------------------------------------------
    def call_event(self, event: str, args: Any, state: TrainerState, control: TrainerControl,
                   **kwargs: Any) -> TrainerControl:
        handlers = self._listeners.get(event)
        if handlers is None:
            handlers = self.listeners(event)
        if not handlers:
            return control
        if self.before_listeners is not None:
            self.before_listeners()
        kwargs = dict(
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            train_dataloader=self.train_dataloader,
            eval_dataloader=self.eval_dataloader,
            save_checkpoint=self.save_checkpoint,
            **kwargs,
        )  # built once per event, not once per listener
        for handler in handlers:
            result = handler(args, state, control, **kwargs)
            if result is not None:
                control = result
        return control

    # -- state kept in checkpoints ------------------------------------------------------------
    def export_states(self, control: TrainerControl) -> dict[str, Any]:
        """`state()` of every callback that has one (JSON) by class name (a list when a class
        repeats), plus the control flags under "TrainerControl". A `Stateful` callback is
        saved, and so is one with `state()` alone (HF's `ExportableState`)."""
        states: dict[str, Any] = {"TrainerControl": control.state()}
        for cb in self.callbacks:
            state = getattr(cb, "state", None)  # HF's `ExportableState` has it, any callback may
            if not callable(state):
                continue
            name, value = callback_class(cb).__name__, state()
            if name in states:
                states[name] = (states[name] if isinstance(states[name], list) else [states[name]]) + [value]
            else:
                states[name] = value
        return states

    def load_states(self, states: dict[str, Any], control: TrainerControl) -> None:
        """Give each callback its saved state back: `load_state(dict)` for a `Stateful` one,
        else the `"attributes"` of HF's `{"args": ..., "attributes": ...}` set on it. Control
        flags come back too, except `should_training_stop`: a resumed run decides that anew.

        As HF restores an `ExportableState` callback, the saved constructor `"args"` come back
        too (a callback built with defaults gets `early_stopping_patience=5` back), and
        repeated callbacks of one class get their saved states in order. Attributes and args
        are set only where the callback declares them (the `"attributes"` / `"args"` its own
        `state()` returns) and already holds plain data: never a dunder, a method, a property
        or another callable, nor a name it does not have. Keys left out are named in a warning,
        and so are saved states of callbacks this run does not have."""
        flags = states.get("TrainerControl")
        flags = flags.get("args") if isinstance(flags, dict) else None
        names = {f.name for f in dataclasses.fields(TrainerControl)} - {"should_training_stop"}
        for key, value in (flags.items() if isinstance(flags, dict) else ()):
            if key in names and isinstance(value, bool):
                setattr(control, key, value)
        seen: dict[str, int] = {}
        absent = sorted(set(states) - {"TrainerControl"} - {callback_class(cb).__name__ for cb in self.callbacks})
        if absent:
            logger.warning("Checkpoint included callbacks not included in current configuration. Ignoring. (%s)",
                           ", ".join(absent))
        for cb in self.callbacks:
            name = callback_class(cb).__name__
            if name == "TrainerControl" or name not in states:
                continue
            saved = states[name]
            if isinstance(saved, list):
                index = seen[name] = seen.get(name, -1) + 1
                if index >= len(saved):
                    continue
                saved = saved[index]
            if isinstance(cb, Stateful) and callable(cb.load_state):
                cb.load_state(saved)  # the callback's own code decides what its state sets
                continue
            skipped: list[Any] = []  # sections, and keys (not always strings) of the saved state
            for section in ("args", "attributes"):
                values = saved.get(section, {}) if isinstance(saved, dict) else None
                skipped += self._restore_attributes(cb, values, section) if isinstance(values, dict) else [section]
            if skipped:
                logger.warning("not restoring %s of %s from the checkpoint: a callback gets back only the data "
                               "attributes its state() declares", ", ".join(map(repr, skipped)), name)

    @staticmethod
    def _restore_attributes(cb: Any, attributes: dict, section: str = "attributes") -> list:
        """Set on `cb` each saved attribute it declares as data (in its own `state()[section]`);
        return the keys left out."""
        try:
            own = cb.state() if callable(getattr(cb, "state", None)) else None
        except Exception:  # noqa: BLE001 - a state() that fails declares nothing
            own = None
        declared = own.get(section) if isinstance(own, dict) else None
        declared = declared if isinstance(declared, dict) else {}
        skipped = []
        for key, value in attributes.items():
            missing = object()
            current = inspect.getattr_static(cb, key, missing) if isinstance(key, str) else missing
            on_class = inspect.getattr_static(type(cb), key, None) if isinstance(key, str) else None
            if (not isinstance(key, str) or key not in declared or key.startswith("__") or current is missing
                    or callable(current)
                    or hasattr(type(on_class), "__get__")):  # a method, property or other descriptor
                skipped.append(key)
            else:
                setattr(cb, key, value)
        return skipped

    def close_run(self) -> None:
        """Call `close_run()` of every callback that has one: the engine does when `fit` exits,
        however it exits. A failing one is logged and the others still run."""
        for cb in self.callbacks:
            close = getattr(cb, "close_run", None)
            if callable(close):
                try:
                    close()
                except Exception as err:  # noqa: BLE001 - called on the way out, maybe after another error
                    logger.warning("%s.close_run() failed: %s", callback_class(cb).__name__, err)

    def has_listeners(self, event: str) -> bool:
        return bool(self.listeners(event))

    # The documented events, so the handler can stand where a callback is expected: each takes
    # what a callback's does (HF's `event(args, state, control, **kwargs)`) and passes the keyword
    # arguments on to the listeners.
    def on_init_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        control._new_training()
        return self.call_event("on_train_begin", args, state, control,
                               metric_directions=dict(self.metric_directions), callbacks=tuple(self.callbacks),
                               steps_per_epoch=self.steps_per_epoch, running_logs=self.running_logs, **kwargs)

    def on_train_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        control._new_epoch()
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        control._new_step()
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_substep_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_step_end(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl,
        metrics: dict[str, Any] | None = None, **kwargs: Any
    ) -> TrainerControl:
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl,
        metrics: dict[str, Any] | None = None, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl,
        logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> TrainerControl:
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    # fitkit's own events (`MOMENTS`, with the keyword arguments `fitkit.events.state` lists for each).
    # Fired through `call_event`: a callback handles one by defining the method of its name.
    def on_evaluate_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, running_logs: Any = None, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_evaluate_begin", args, state, control, running_logs=running_logs, **kwargs)

    def on_prediction_step_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_prediction_step_begin", args, state, control, **kwargs)

    def on_predict_begin(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        return self.call_event("on_predict_begin", args, state, control, **kwargs)

    def on_epoch_summary(
        self, args: Any, state: TrainerState, control: TrainerControl, epoch: int | None = None,
        logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> TrainerControl:
        """Build `logs` only where `has_listeners("on_epoch_summary")`: nobody else reads them."""
        return self.call_event("on_epoch_summary", args, state, control, epoch=epoch, logs=logs, **kwargs)
