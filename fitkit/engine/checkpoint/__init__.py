"""Checkpoints: what one holds and when it is written (`checkpointer`), writing files (`files`,
`state_file`, `async_save`), verifying and loading (`files`, `elastic`), and HF export.

The names tools outside fitkit use load on first use:

    from fitkit.engine.checkpoint import verified, is_complete, CheckpointError
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = ("CheckpointError", "is_complete", "verified")

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from fitkit.engine.checkpoint.files import CheckpointError, is_complete, verified


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fitkit.engine.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module("fitkit.engine.checkpoint.files"), name)
    globals()[name] = value
    return value
