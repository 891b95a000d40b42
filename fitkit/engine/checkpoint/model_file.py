"""The file `Model.save` writes and `Model.load` reads (also `ModelCheckpoint`'s): weights-only,
written atomically, with the compile configuration and the optimizer and scheduler states."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fitkit.common.io import atomic_torch_save
from fitkit.common.wrappers import torch_optimizer

if TYPE_CHECKING:
    from fitkit.config.compile_config import CompileConfig


def write_model_file(path: str, module: torch.nn.Module, config: CompileConfig | None = None,
                     optimizer: Any = None, scheduler: Any = None) -> None:
    """Write the file `Model.save` writes and `Model.load` reads, atomically: `module`'s weights
    (CPU copies) and the compile configuration (None: `Model.load` returns an uncompiled model)::

        write_model_file("best.pt", net)                 # what ModelCheckpoint writes
        model = Model.load("best.pt", make_net())
    """
    payload = {"format": "fitkit-model", "version": 1,
               "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
               "config": config.to_json() if config is not None else None,
               "optimizer": _state_of(optimizer), "scheduler": _state_of(scheduler)}
    atomic_torch_save(payload, path)


def _state_of(obj: Any) -> dict | None:
    """CPU copies of `obj.state_dict()` (the torch optimizer inside Fabric's wrapper), or None."""
    obj = torch_optimizer(obj) if obj is not None and not hasattr(obj, "last_epoch") else obj
    if obj is None or not hasattr(obj, "state_dict"):
        return None
    from fitkit.common.tensors import to_cpu

    return to_cpu(obj.state_dict())
