"""The names of Keras 3's callback methods and how to tell a Keras-style callback, without
importing keras (or `fitkit.events.handler`, which asks these questions while it builds listeners).

    keras_class(type(cb))                     # a subclass of fitkit's or Keras' `Callback`
    overrides(cb, "on_train_batch_end")       # it has its own (or its alias `on_batch_end`)
    keras_signature(cb.on_epoch_end, "on_epoch_end")   # True: (epoch, logs); False: HF's
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any

#: Keras' methods whose names are also `TrainerCallback` events (with other arguments).
SHARED_NAMES: tuple[str, ...] = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end")
#: Keras' methods that fitkit's event set has no method of that name for.
KERAS_ONLY_NAMES: tuple[str, ...] = (
    "on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end",
    "on_test_begin", "on_test_end", "on_test_batch_begin", "on_test_batch_end",
    "on_predict_begin", "on_predict_end", "on_predict_batch_begin", "on_predict_batch_end",
)
KERAS_NAMES: tuple[str, ...] = SHARED_NAMES + KERAS_ONLY_NAMES
#: The Keras methods that take a `batch` (or `epoch`) index before `logs`.
INDEXED = frozenset({"on_epoch_begin", "on_epoch_end"} | {n for n in KERAS_ONLY_NAMES if "batch" in n})
#: Keras' aliases: the base `on_train_batch_*` calls `on_batch_*`.
ALIASES = {"on_train_batch_begin": "on_batch_begin", "on_train_batch_end": "on_batch_end"}
#: The fitkit event each Keras method is called from.
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


#: The events fitkit adds for moments HF has none (Keras' test / predict begins, each evaluation
#: or prediction batch's start, the epoch's end after its validation).
MOMENTS: tuple[str, ...] = ("on_evaluate_begin", "on_prediction_step_begin", "on_predict_begin", "on_epoch_summary")


def _is_base(cls: type) -> bool:
    """fitkit's `Callback`, Keras' own base class, or a `TrainerCallback` base (ours or
    transformers'), recognised by name: their methods are empty or Keras' aliases."""
    module = cls.__module__
    if cls.__name__ == "Callback":
        return module == "fitkit.callbacks.keras.callback" or module.startswith("keras")
    return cls.__name__ == "TrainerCallback" and (module == "fitkit.events.handler" or module.startswith("transformers"))


@functools.lru_cache(maxsize=1024)
def keras_class(cls: type) -> bool:
    """True for a subclass of fitkit's `Callback` or of `keras.callbacks.Callback`."""
    return any(_is_base(k) and k.__name__ == "Callback" for k in cls.__mro__)


def overrides(callback: Any, name: str) -> bool:
    """Whether `callback` has its own `name` (not the empty one of a base class); for the
    `on_train_batch_*` methods, its alias `on_batch_*` counts too."""
    if name in getattr(callback, "__dict__", ()):
        return callable(callback.__dict__[name])
    cls: type = type(callback)  # `type`: mypy takes a `type[Any]` for unhashable
    if _class_overrides(cls, name):
        return True
    alias = ALIASES.get(name)
    return alias is not None and overrides(callback, alias)


@functools.lru_cache(maxsize=4096)
def _class_overrides(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return not _is_base(klass) and klass is not object
    return False


def keras_signature(method: Any, name: str) -> bool | None:
    """How a method named like a Keras one reads its arguments: True for Keras' (`(batch, logs)`,
    `(epoch, logs)` or `(logs)`), False for HF's `(args, state, control, **kwargs)`, None when it
    fits neither. Kept per function: every handler asks it of every callback's methods when it
    builds its listeners (a search trial's handler is new each trial), and `inspect.signature`
    is slow."""
    func = getattr(method, "__func__", method)  # one answer per function (bound or not: `self` is not read)
    key = (inspect.ismethod(method), name)
    try:
        known = _SIGNATURES.get(func)
    except TypeError:  # not weakly referenceable: not kept
        return _keras_signature(method, name)
    if known is None:
        known = _SIGNATURES[func] = {}
    if key not in known:
        known[key] = _keras_signature(method, name)
    return known[key]


_SIGNATURES: weakref.WeakKeyDictionary[Any, dict[tuple[bool, str], bool | None]] = weakref.WeakKeyDictionary()


def _keras_signature(method: Any, name: str) -> bool | None:
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params]
    if names[:3] == ["args", "state", "control"]:
        return False
    if name in SHARED_NAMES and any(p.kind is p.VAR_KEYWORD for p in params):
        return False  # an HF event's usual `**kwargs`; a Keras-only name has no HF reading
    try:
        if name in INDEXED:
            inspect.signature(method).bind(0, {})
        else:
            inspect.signature(method).bind({})
    except TypeError:
        return None
    return True
