"""The `callbacks` arguments checked: what counts as a callback (`as_callback`, `callback_list`).

An entry that is no callback raises `TypeError` naming the argument and the fix::

    callback_list([EarlyStopping(), CSVLogger])   # [EarlyStopping(...), CSVLogger()]: classes are built
    callback_list(EarlyStopping())                # TypeError: pass it in a list: callbacks=[EarlyStopping(...)]
"""

from __future__ import annotations

import inspect
from typing import Any

from fitkit.common.options import closest
from fitkit.events.callback import TrainerCallback
from fitkit.events.state import EVENTS


def defines_an_event(obj: Any) -> bool:
    """Whether `obj` has an event method: one of the documented events, or any other `on_*` method
    (a custom event's, or one an adapter of the layers above calls, such as Keras' `on_train_batch_end`)."""
    return any(callable(getattr(obj, event, None)) for event in EVENTS) or any(
        name.startswith("on_") and callable(getattr(obj, name, None)) for name in dir(obj))


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
        if not (issubclass(callback, TrainerCallback) or defines_an_event(callback)):
            raise TypeError(_not_a_callback(callback, where))
        try:
            inspect.signature(callback).bind()
        except TypeError:
            raise TypeError(f"`{where}` is the class {callback.__name__}, whose constructor needs arguments: pass an "
                            f"instance instead, e.g. {callback.__name__}(...)") from None
        except ValueError:  # no signature to read: let the call decide
            pass
        return callback() if build else callback
    if isinstance(callback, TrainerCallback) or defines_an_event(callback):
        return callback
    raise TypeError(_not_a_callback(callback, where))


def callback_list(callbacks: Any, argument: str = "callbacks", build: bool = True) -> list:
    """The `callbacks` argument of fit / evaluate / predict checked: None or a list (or tuple) of
    callbacks (instances or classes; classes are built). A single callback, or any item that is
    not one, raises `TypeError` naming `callbacks` or `callbacks[i]` and the fix."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        one = not isinstance(callbacks, str) and defines_an_event(callbacks)
        name = callbacks.__name__ if isinstance(callbacks, type) else type(callbacks).__name__
        fix = f"pass it in a list: {argument}=[{name}{'' if isinstance(callbacks, type) else '(...)'}]" if one else (
            f"pass a list of callback objects, e.g. {argument}=[EarlyStopping(), CSVLogger('log.csv')]")
        raise TypeError(f"`{argument}` must be a list of callbacks; got {name}: {fix}")
    return [as_callback(cb, f"{argument}[{i}]", build) for i, cb in enumerate(callbacks)]
