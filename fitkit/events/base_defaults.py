"""A base class's empty event methods: marking them (`no_op`) and recognising them (`is_base_default`).

A callback that does not override an event costs nothing because the method it inherits is known
to be its base class's empty default, and never called. One rule says which methods those are,
for the handler's listeners and for the Keras adapter alike::

    class Base(TrainerCallback):
        @no_op
        def on_log(self, args, state, control, logs=None, **kwargs):
            ...  # the subclasses that log override it

    is_base_default(Base().on_log)   # True: the handler skips it
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

#: The attribute `no_op` sets on a hook.
NO_OP = "__fitkit_no_op__"
#: The attributes other libraries set on their base classes' empty methods: Keras'
#: `utils.default` (`keras.src.utils.python_utils.default`), read without importing Keras.
_MARKERS = (NO_OP, "_is_default")

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


def is_base_default(method: Any) -> bool:
    """True for a base class's empty method (a function or a bound method): one marked by
    fitkit's `no_op` or Keras' `utils.default`, or transformers' own `TrainerCallback` hook.
    Calling it would do nothing, so nothing calls it; a callback that does not override an
    event is skipped by the same test."""
    func = getattr(method, "__func__", method)
    if any(getattr(func, marker, False) is True for marker in _MARKERS):
        return True
    hf = sys.modules.get("transformers.trainer_callback")  # loaded when such a callback exists
    base = getattr(getattr(hf, "TrainerCallback", None), getattr(func, "__name__", ""), None)
    return base is not None and func is base
