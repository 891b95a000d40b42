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

from fitkit import launch_env as _launch_env  # noqa: E402

_launch_env.complete()  # a process fitkit's launcher started: RANK set before the script reads it

_EXPORTS = {
    "Model": "fitkit.model",
    "TrainingArguments": "fitkit.arguments",
    "TrainerCallback": "fitkit.callbacks.base",
    "TrainerState": "fitkit.callbacks.base",
    "TrainerControl": "fitkit.callbacks.base",
    "CallbackHandler": "fitkit.callbacks.base",
    "StopTraining": "fitkit.callbacks.base",
    "History": "fitkit.callbacks.history",
    "BestRun": "fitkit.search",
    "unpack_data": "fitkit.steps",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from fitkit.arguments import TrainingArguments
    from fitkit.callbacks.base import CallbackHandler, StopTraining, TrainerCallback, TrainerControl, TrainerState
    from fitkit.callbacks.history import History
    from fitkit.model import Model
    from fitkit.search import BestRun
    from fitkit.steps import unpack_data


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fitkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
