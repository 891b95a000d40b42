"""fitkit: Keras-style compile / fit for PyTorch on Lightning Fabric.

    from fitkit import Model
    Model(net).compile("adam", "cross_entropy", ["accuracy"]).fit(x, y, epochs=5)

Public names load on first use, so `import fitkit` stays light (Fabric, torchmetrics, rich
and optuna are imported only when a run needs them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from fitkit.common import launch_env as _launch_env

_launch_env.complete()  # a process fitkit's launcher started: RANK set before the script reads it

_EXPORTS = {
    "Model": "fitkit.model",
    "TrainingArguments": "fitkit.config.arguments",
    "TrainerCallback": "fitkit.events.handler",
    "TrainerState": "fitkit.events.state",
    "TrainerControl": "fitkit.events.state",
    "CallbackHandler": "fitkit.events.handler",
    "StopTraining": "fitkit.events.state",
    "History": "fitkit.callbacks.history",
    "BestRun": "fitkit.search",
    "unpack_data": "fitkit.facade.steps",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from fitkit.callbacks.history import History
    from fitkit.config.arguments import TrainingArguments
    from fitkit.events.handler import CallbackHandler, StopTraining, TrainerCallback, TrainerControl, TrainerState
    from fitkit.facade.steps import unpack_data
    from fitkit.model import Model
    from fitkit.search import BestRun


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fitkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
