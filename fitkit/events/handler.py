"""The callback system: the `TrainerCallback` base, its argument checks, and `CallbackHandler`,
which fires the events. The shared data (`TrainerState`, `TrainerControl`, `Order`,
`Stateful`, `StopTraining`, `EVENTS`) is in `fitkit.events.state` and importable from here.

These follow the documented Hugging Face `TrainerCallback` event set, so a callback written
for `transformers.Trainer` that only touches `args`, `state`, `control` and the documented
keyword arguments runs unchanged::

    from fitkit import TrainerCallback

    class PrintLoss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero:
                print(state.global_step, logs)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fitkit.common.options import closest
from fitkit.events.hf_view import HFView, class_from_transformers, from_transformers
from fitkit.events.state import EVENTS, Order, Stateful, StopTraining, TrainerControl, TrainerState

__all__ = ["EVENTS", "CallbackHandler", "Order", "Stateful", "StopTraining", "TrainerCallback", "TrainerControl",
           "TrainerState", "as_callback", "callback_list", "no_op"]

logger = logging.getLogger("fitkit")


#: The attribute `no_op` sets on a hook.
NO_OP = "__fitkit_no_op__"

_F = TypeVar("_F", bound=Callable[..., Any])


def no_op(method: _F) -> _F:
    """Declare a hook the empty default of its base class: the handler never calls it, so an
    event no callback really handles costs nothing. The base classes' hooks carry it; a class
    of one's own whose subclasses override some of its hooks may mark its defaults too::

        class Base(TrainerCallback):
            @no_op
            def on_log(self, args, state, control, logs=None, **kwargs):
                ...  # the subclasses that log override it
    """
    setattr(method, NO_OP, True)
    return method


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


def _is_default(handler: Any) -> bool:
    """True for a base class's empty hook: one marked `no_op` (fitkit's `TrainerCallback` marks
    its own), or transformers' own `TrainerCallback` hook. Calling it
    would do nothing, so the handler skips it; a callback that does not override an event is
    skipped by the same test."""
    func = getattr(handler, "__func__", handler)
    if getattr(func, NO_OP, False):
        return True
    hf = sys.modules.get("transformers.trainer_callback")  # loaded when such a callback exists
    base = getattr(getattr(hf, "TrainerCallback", None), getattr(func, "__name__", ""), None)
    return base is not None and func is base


def _listening(callback: Any, event: str) -> tuple[bool, bool]:
    """Whether `callback` handles `event`, and whether that handler comes from transformers.
    Decided by the class (remembered: a handler runs once per fit for each event) unless the
    instance holds the event itself or the class makes attributes on the fly."""
    cls: type = type(callback)  # `type`: mypy takes a `type[Any]` for unhashable
    if event in getattr(callback, "__dict__", ()) or _makes_attributes(cls):
        if event not in EVENTS and not _really_defined(callback, event):
            return False, False  # a custom event reaches only a method really written, not one made on the fly
        method = getattr(callback, event, None)
        return callable(method) and not _is_default(method), from_transformers(callback, event)
    return _class_listening(cls, event)


_EVENT_SET = frozenset(EVENTS)


def _listened(listening: Callable[[str], tuple[bool, bool]]) -> tuple[tuple[str, bool], ...]:
    """(event, from transformers) of each documented event that `listening(event)` says is
    handled, in `EVENTS` order."""
    return tuple((event, hf) for event in EVENTS for listens, hf in [listening(event)] if listens)


@functools.lru_cache(maxsize=1024)
def _class_events(cls: type) -> tuple[tuple[str, bool], ...]:
    """`_listened` of a class, decided once per class."""
    return _listened(functools.partial(_class_listening, cls))


@functools.lru_cache(maxsize=4096)
def _class_listening(cls: type, event: str) -> tuple[bool, bool]:
    method = getattr(cls, event, None)
    listens = callable(method) and not _is_default(method)
    return listens, class_from_transformers(cls, event)


def _really_defined(callback: Any, name: str) -> bool:
    return name in getattr(callback, "__dict__", ()) or any(name in k.__dict__ for k in type(callback).__mro__)


@functools.lru_cache(maxsize=1024)
def _makes_attributes(cls: type) -> bool:
    return cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__")


def _defines_an_event(obj: Any) -> bool:
    """Whether `obj` has an event method: one of the documented events, or any other `on_*` method
    (a custom event's, or one an adapter of the layers above calls, such as Keras' `on_train_batch_end`)."""
    return any(callable(getattr(obj, event, None)) for event in EVENTS) or any(
        name.startswith("on_") and callable(getattr(obj, name, None)) for name in dir(obj))


def callback_class(callback: Any) -> type:
    """The class a callback of the list stands for: its own, or for an adapter (an object with
    `wrapped`, such as `fitkit.callbacks.keras.adapter.KerasAdapter`) the wrapped callback's. Checkpoints
    keep states under its name, and `pop_callback(cls)` finds it by it."""
    wrapped = getattr(callback, "wrapped", None)
    return type(wrapped if wrapped is not None else callback)


def _drives_flow(callback: Any) -> bool:
    """Whether `callback` sets the log / evaluate / save switches on schedule: one that says
    `drives_flow = True` (`DefaultFlowCallback`), or transformers' own flow callback."""
    if getattr(callback, "drives_flow", False) is True:
        return True
    hf = sys.modules.get("transformers.trainer_callback")  # loaded when such a callback exists
    return hf is not None and isinstance(callback, getattr(hf, "DefaultFlowCallback", ()))


def _known_callback_names() -> list[str]:
    """The callback classes fitkit ships (its public ones, and any other imported so far), for
    suggestions."""
    from fitkit.events.builtin import CALLBACK_CLASSES

    found, todo = list(CALLBACK_CLASSES), list(TrainerCallback.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__.startswith(("fitkit.callbacks", "fitkit.integrations")) and not cls.__name__.startswith("_"):
            found.append(cls.__name__)
    return sorted(set(found))


def _not_a_callback(obj: Any, where: str) -> str:
    if isinstance(obj, str):
        match = closest(obj, _known_callback_names())
        hint = f"did you mean {match}()? " if match else ""
        return (f"{hint}`{where}`={obj!r} is a string, not a callback: pass a callback object, e.g. "
                "fitkit.callbacks.EarlyStopping(monitor='val_loss') (tracker names go to `report_to`)")
    if callable(obj) and not isinstance(obj, type):
        name = getattr(obj, "__name__", type(obj).__name__)
        return (f"`{where}` is the function {name}, not a callback: wrap it in a LambdaCallback, e.g. "
                f"LambdaCallback(on_epoch_end={name if name.isidentifier() else 'fn'}) from fitkit.callbacks, "
                "or subclass fitkit.TrainerCallback")
    shown = obj.__name__ if isinstance(obj, type) else f"{obj!r} ({type(obj).__name__})"
    return (f"`{where}`={shown} is not a callback: pass an instance of a fitkit.TrainerCallback subclass (or such a "
            f"class), or an object with event methods such as on_epoch_end(args, state, control, **kwargs)")


def as_callback(callback: Any, where: str = "callback", build: bool = True) -> Any:
    """`callback` as a callback object: an instance of `TrainerCallback` (or of any class with
    one of the documented event methods, such as transformers' callbacks) is returned as is; such
    a class is built with no argument (`build=False`: checked, returned unbuilt). Anything else
    raises `TypeError` naming `where` and the fix."""
    if isinstance(callback, type):
        if not (issubclass(callback, TrainerCallback) or _defines_an_event(callback)):
            raise TypeError(_not_a_callback(callback, where))
        try:
            inspect.signature(callback).bind()
        except TypeError:
            raise TypeError(f"`{where}` is the class {callback.__name__}, whose constructor needs arguments: pass an "
                            f"instance instead, e.g. {callback.__name__}(...)") from None
        except ValueError:  # no signature to read: let the call decide
            pass
        return callback() if build else callback
    if isinstance(callback, TrainerCallback) or _defines_an_event(callback):
        return callback
    raise TypeError(_not_a_callback(callback, where))


def callback_list(callbacks: Any, argument: str = "callbacks", build: bool = True) -> list:
    """The `callbacks` argument of fit / evaluate / predict checked: None or a list (or tuple) of
    callbacks (instances or classes; classes are built). A single callback, or any item that is
    not one, raises `TypeError` naming `callbacks` or `callbacks[i]` and the fix."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        one = not isinstance(callbacks, str) and _defines_an_event(callbacks)
        name = callbacks.__name__ if isinstance(callbacks, type) else type(callbacks).__name__
        fix = f"pass it in a list: {argument}=[{name}{'' if isinstance(callbacks, type) else '(...)'}]" if one else (
            f"pass a list of callback objects, e.g. {argument}=[EarlyStopping(), CSVLogger('log.csv')]")
        raise TypeError(f"`{argument}` must be a list of callbacks; got {name}: {fix}")
    return [as_callback(cb, f"{argument}[{i}]", build) for i, cb in enumerate(callbacks)]


class CallbackHandler(TrainerCallback):
    """Holds the callbacks of a run and fires events on them, in order.

    For each event it keeps the list of callbacks that really override it, so an event no
    callback listens to costs one dictionary look-up; an override whose body is empty
    (`pass`, `...`, a docstring) is not called either. `call_event` also fires custom events:
    every callback with a method of that name receives it.

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
        if not any(_drives_flow(cb) for cb in self.callbacks):
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
            if event in _EVENT_SET and "on_init_end" not in self._listeners:
                self._fill_documented()  # every documented event's listeners in one pass over the callbacks
                return self._listeners[event]
            found = []
            for cb in self.callbacks:
                listens, hf = _listening(cb, event)
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
            if _makes_attributes(cls) or not _EVENT_SET.isdisjoint(getattr(cb, "__dict__", ())):
                events = _listened(functools.partial(_listening, cb))
            else:
                events = _class_events(cls)
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
        _class_listening.cache_clear()
        _class_events.cache_clear()

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
