"""Which events a callback really handles: the methods it has that are not a base class's empty
default (`fitkit.events.base_defaults.is_base_default`), and whether each comes from
transformers. Decided once per class, unless an instance holds events itself::

    listening(callback, "on_log")   # (True, False): it handles on_log, with fitkit's arguments
    class_events(type(callback))    # (("on_log", False), ...): each documented event it handles
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fitkit.events.base_defaults import is_base_default
from fitkit.events.hf_view import class_from_transformers, from_transformers
from fitkit.events.state import EVENTS

#: The documented events, for membership tests.
EVENT_SET = frozenset(EVENTS)

def listening(callback: Any, event: str) -> tuple[bool, bool]:
    """Whether `callback` handles `event`, and whether that handler comes from transformers.
    Decided by the class (remembered: a handler runs once per fit for each event) unless the
    instance holds the event itself or the class makes attributes on the fly."""
    cls: type = type(callback)  # `type`: mypy takes a `type[Any]` for unhashable
    if event in getattr(callback, "__dict__", ()) or makes_attributes(cls):
        if event not in EVENTS and not _really_defined(callback, event):
            return False, False  # a custom event reaches only a method really written, not one made on the fly
        method = getattr(callback, event, None)
        return callable(method) and not is_base_default(method), from_transformers(callback, event)
    return class_listening(cls, event)


def listened(decide: Callable[[str], tuple[bool, bool]]) -> tuple[tuple[str, bool], ...]:
    """(event, from transformers) of each documented event that `decide(event)` (`listening` of a
    callback, or `class_listening` of a class) says is handled, in `EVENTS` order."""
    return tuple((event, hf) for event in EVENTS for listens, hf in [decide(event)] if listens)


@functools.lru_cache(maxsize=1024)
def class_events(cls: type) -> tuple[tuple[str, bool], ...]:
    """`listened` of a class, decided once per class."""
    return listened(functools.partial(class_listening, cls))


@functools.lru_cache(maxsize=4096)
def class_listening(cls: type, event: str) -> tuple[bool, bool]:
    """`listening` of any instance of `cls` that holds no events itself."""
    method = getattr(cls, event, None)
    listens = callable(method) and not is_base_default(method)
    return listens, class_from_transformers(cls, event)


def _really_defined(callback: Any, name: str) -> bool:
    """Whether `name` is written on the instance or a class of its MRO (not made on the fly)."""
    return name in getattr(callback, "__dict__", ()) or any(name in k.__dict__ for k in type(callback).__mro__)


@functools.lru_cache(maxsize=1024)
def makes_attributes(cls: type) -> bool:
    """Whether `cls` makes attributes on the fly (`__getattr__`, its own `__getattribute__`)."""
    return cls.__getattribute__ is not object.__getattribute__ or hasattr(cls, "__getattr__")



def forget() -> None:
    """Forget what was decided per class (after a class's methods changed at run time)."""
    class_listening.cache_clear()
    class_events.cache_clear()
