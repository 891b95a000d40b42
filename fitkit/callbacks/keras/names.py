"""Keras 3's callback method names, and which of them a callback object really has: decided by its
type and by the rule that tells a base class's empty method (`fitkit.events.base_defaults`:
fitkit's `no_op`, Keras' `utils.default`, transformers' own hooks), never by reading signatures::

    keras_methods(cb)      # {"on_epoch_end": cb.on_epoch_end, ...}: what `KerasAdapter` calls
    is_keras_style(cb)     # True for fitkit's `Callback`, `keras.callbacks.Callback`, or an object
                           # (not a `TrainerCallback`) with Keras-only method names

keras is never imported here: a `keras.callbacks.Callback` is recognised by its class's module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fitkit.events.base_defaults import is_base_default

#: Keras' methods whose names are also `TrainerCallback` events (with other arguments).
SHARED_NAMES: tuple[str, ...] = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end")
#: Keras' methods that fitkit's documented event set has no method of that name for.
KERAS_ONLY_NAMES: tuple[str, ...] = (
    "on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end",
    "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
    "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
)
KERAS_NAMES: tuple[str, ...] = SHARED_NAMES + KERAS_ONLY_NAMES
#: Keras' aliases: the base `on_train_batch_*` calls `on_batch_*`.
ALIASES: dict[str, str] = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}
#: The fitkit event each Keras method is called from (the ones HF's set lacks are fitkit's own,
#: `fitkit.events.state.MOMENTS`).
EVENT_OF: dict[str, str] = {
    "on_train_begin": "on_train_begin", "on_train_end": "on_train_end",
    "on_epoch_begin": "on_epoch_begin", "on_epoch_end": "on_epoch_summary",
    "on_train_batch_begin": "on_step_begin", "on_train_batch_end": "on_step_end",
    "on_batch_begin": "on_step_begin", "on_batch_end": "on_step_end",
    "on_test_begin": "on_evaluate_begin", "on_test_end": "on_evaluate",
    "on_test_batch_begin": "on_prediction_step_begin", "on_test_batch_end": "on_prediction_step",
    "on_predict_begin": "on_predict_begin", "on_predict_end": "on_predict",
    "on_predict_batch_begin": "on_prediction_step_begin", "on_predict_batch_end": "on_prediction_step",
}
#: The HF event to use instead of a Keras-only name, for a `TrainerCallback` that defines one.
HF_INSTEAD: dict[str, str] = {name: event for name, event in EVENT_OF.items()
                              if name in KERAS_ONLY_NAMES and name != event}

@functools.lru_cache(maxsize=1024)
def keras_class(cls: type) -> bool:
    """True for a subclass of fitkit's `Callback` or of `keras.callbacks.Callback`."""
    return any(k.__name__ == "Callback" and (k.__module__ == "fitkit.callbacks.keras.callback"
                                             or k.__module__.startswith("keras."))
               for k in cls.__mro__)


@functools.lru_cache(maxsize=512)
def _trainer_callback(cls: type) -> bool:
    """A subclass of fitkit's or transformers' `TrainerCallback` (HF's event set, by type)."""
    return any(k.__name__ == "TrainerCallback" and (k.__module__.startswith("fitkit.events")
                                                    or k.__module__.startswith("transformers"))
               for k in cls.__mro__)


def is_keras_style(callback: Any) -> bool:
    """Whether `callback` is called with Keras' methods: a fitkit or Keras `Callback`; an object
    declaring `keras_functions` (fitkit's `LambdaCallback` with Keras' functions); or an object that
    is no `TrainerCallback` and has a Keras-only method (`on_train_batch_end`, `on_test_end`, ...)."""
    cls: type = type(callback)
    if keras_class(cls):
        return True
    if getattr(callback, "keras_functions", None):
        return True
    return not _trainer_callback(cls) and any(callable(getattr(callback, n, None)) for n in KERAS_ONLY_NAMES)


def keras_methods(callback: Any) -> dict[str, Callable[..., Any]]:
    """The Keras methods of a Keras-style `callback` that do something, by name: the ones not
    marked as a base class's empty default. `on_train_batch_begin/end` stand for their aliases
    `on_batch_begin/end` too, as Keras' base class calls the alias."""
    declared = getattr(callback, "keras_functions", None)
    found: dict[str, Callable[..., Any]] = dict(declared) if declared else {}
    for name in KERAS_NAMES if not declared else ():
        method = getattr(callback, name, None)
        if callable(method) and not is_base_default(method):
            found[name] = method
    for name, alias in ALIASES.items():
        if alias in found and name not in found:  # the base's `name` calls the alias, when there is one
            found[name] = getattr(callback, name, None) or found[alias]
        found.pop(alias, None)
    return found


def keras_named_methods_warning(callback: Any) -> str | None:
    """For a `TrainerCallback` that defines Keras-only method names: why they are never called,
    and what to do instead (None when it defines none)."""
    cls: type = type(callback)  # `type`: mypy takes a `type[Any]` for unhashable
    if not _trainer_callback(cls) or keras_class(cls):
        return None
    own = getattr(callback, "__dict__", {})
    bad = _class_keras_named(cls) if own.keys().isdisjoint(HF_INSTEAD) else _keras_named(callback, cls)
    if not bad:
        return None
    return (f"{cls.__name__} is a TrainerCallback, whose methods are HF's events (args, state, control, **kwargs); "
            f"{', '.join(f'{cls.__name__}.{n}' for n in bad)} (Keras' method names) are never called. For Keras' "
            "methods subclass fitkit.callbacks.Callback; for fitkit's events at those moments use "
            + ", ".join(f"{HF_INSTEAD[n]} instead of {n}" for n in bad))


def _keras_named(obj: Any, cls: type) -> list[str]:
    """The Keras-only method names `obj` (an instance of `cls`, or `cls`) has, not as
    a base class's empty default (`is_base_default`)."""
    return [n for n in HF_INSTEAD if callable(getattr(obj, n, None)) and not is_base_default(getattr(cls, n, None))]


@functools.lru_cache(maxsize=512)
def _class_keras_named(cls: type) -> list[str]:
    """`_keras_named` of a class, read once (an instance without such attributes of its own has its class's)."""
    return _keras_named(cls, cls)

