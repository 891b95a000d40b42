"""The callbacks a `Model` keeps for every later call (`Model` inherits `CallbackOwner`), and the
handler of one call, with every Keras-style callback in a `KerasAdapter`.

    model.add_callback(EarlyStopping(patience=3))   # a class or an instance
    model.callbacks                                  # in firing order, DefaultFlowCallback first
    model.pop_callback(EarlyStopping)                # by class (the first) or instance
    run_handler(model, [*model.callbacks, *fit_callbacks])   # the handler of one fit / evaluate / predict
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from typing import Any

from fitkit.callbacks.keras.adapter import KerasAdapter
from fitkit.callbacks.keras.callback import Callback
from fitkit.callbacks.keras.keras_own import refuse_unsupported
from fitkit.callbacks.keras.names import is_keras_style, keras_named_methods_warning
from fitkit.events.callback_checks import callback_list
from fitkit.events.handler import CallbackHandler, TrainerCallback


class CallbackOwner:
    """The callbacks list of a model, held by its `callback_handler`."""

    callback_handler: CallbackHandler

    @property
    def callbacks(self) -> list[TrainerCallback | Callback]:
        """The callbacks in firing order (`DefaultFlowCallback` first)."""
        return list(self.callback_handler.callbacks)

    def add_callback(self, callback: TrainerCallback | Callback | type) -> None:
        """Add a callback (a class or an instance) to every later fit / evaluate / predict. One of
        Keras' own that fitkit cannot run raises `TypeError` naming fitkit's equivalent."""
        refuse_unsupported(callback, "callback")
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | Callback | type) -> TrainerCallback | Callback | None:
        """Remove and return a callback (by class: the first of that class), or None."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | Callback | type) -> None:
        """Remove a callback (a class or an instance)."""
        self.callback_handler.remove_callback(callback)


def checked_callbacks(callbacks: Any) -> list:
    """The `callbacks` argument of fit / evaluate / predict checked (`callback_list`), and Keras' own
    callbacks that fitkit cannot run refused with `TypeError` naming `callbacks[i]` and fitkit's
    equivalent, before anything starts."""
    for i, cb in enumerate(callbacks if isinstance(callbacks, (list, tuple)) else ()):
        refuse_unsupported(cb, f"callbacks[{i}]")  # also a class, before it is built
    return callback_list(callbacks)


def run_handler(model: Any, callbacks: Iterable[Any]) -> CallbackHandler:
    """The handler of one call of `model`: `callbacks` (checked instances) in order, each Keras-style
    one (fitkit's or Keras' `Callback`, ...) in a `KerasAdapter` whose `set_model` gives `model`
    itself, as Keras does; a `TrainerCallback` with Keras' method names gets a warning."""
    wrapped = []
    for cb in callbacks:
        if is_keras_style(cb):
            wrapped.append(KerasAdapter(cb, model=model))
            continue
        _warn_keras_names(type(cb), cb)
        wrapped.append(cb)
    return CallbackHandler(wrapped)


def _warn_keras_names(cls: type, callback: Any) -> None:
    message = keras_named_methods_warning(callback)
    if message:
        _warn_once(cls, message)


@functools.lru_cache(maxsize=256)
def _warn_once(cls: type, message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=6)  # the user's fit / evaluate / predict call
