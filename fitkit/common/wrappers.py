"""The user's module inside the wrappers Fabric, DDP and `torch.compile` put around it."""

from __future__ import annotations

from typing import Any

import torch

_WRAPPERS = {"_FabricModule": "_forward_module", "DistributedDataParallel": "module", "OptimizedModule": "_orig_mod"}


def unwrapped(module: Any) -> Any:
    """The user's module inside Fabric's, DDP's or torch.compile's wrappers."""
    attr = _WRAPPERS.get(type(module).__name__)
    inner = getattr(module, attr, None) if attr else None
    return unwrapped(inner) if isinstance(inner, torch.nn.Module) else module
