"""The user's module and optimizer inside the wrappers Fabric, DDP and `torch.compile` put around them."""

from __future__ import annotations

from typing import Any

import torch

_WRAPPERS = {"_FabricModule": "_forward_module", "DistributedDataParallel": "module", "OptimizedModule": "_orig_mod"}


def unwrapped(module: Any) -> Any:
    """The user's module inside Fabric's, DDP's or torch.compile's wrappers."""
    attr = _WRAPPERS.get(type(module).__name__)
    inner = getattr(module, attr, None) if attr else None
    return unwrapped(inner) if isinstance(inner, torch.nn.Module) else module


def torch_optimizer(optimizer: Any) -> Any:
    """The `torch.optim.Optimizer` inside Fabric's optimizer wrapper (or the view a custom step
    sees), which is what a scheduler, a checkpoint or a state dict needs; anything else as is::

        torch_optimizer(fabric.setup_optimizers(torch.optim.SGD(params, lr=0.1)))   # the SGD
    """
    while True:  # Fabric's wrapper is itself of a subclass of the optimizer's class: look inside first
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer or not hasattr(inner, "param_groups"):
            return optimizer
        optimizer = inner
