"""Checkpoints: what one holds and when it is written (`checkpointer`); its files' names and the
errors (`layout`); writing them (`writing`, synchronous, and `background` behind one
`CheckpointWriter` interface, with `state_file`, `async_save`, `write_errors`); finding,
verifying and loading them (`listing`, `verify`, `loading`, `elastic`); and HF export.

The names tools outside fitkit use load on first use:

    from fitkit.engine.checkpoint import verified, is_complete, CheckpointError
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_EXPORTS = {"CheckpointError": "layout", "is_complete": "listing", "verified": "verify"}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from fitkit.engine.checkpoint.layout import CheckpointError
    from fitkit.engine.checkpoint.listing import is_complete
    from fitkit.engine.checkpoint.verify import verified


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fitkit.engine.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fitkit.engine.checkpoint.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
