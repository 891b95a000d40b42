"""Callbacks: the `TrainerCallback` event system and the built-in callbacks.

    from fitkit.callbacks import EarlyStopping, ModelCheckpoint

Each name loads its module on first use, so importing the contract (`fitkit.callbacks.state`,
`fitkit.callbacks.base`) does not load every built-in callback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: The callback classes fitkit ships, by the module that defines each.
CALLBACK_CLASSES = {
    "CallbackHandler": "fitkit.callbacks.base",
    "TrainerCallback": "fitkit.callbacks.base",
    "DefaultFlowCallback": "fitkit.callbacks.flow",
    "History": "fitkit.callbacks.history",
    "PrinterCallback": "fitkit.callbacks.printer",
    "ProgressBar": "fitkit.callbacks.progress",
    # Keras-like callbacks
    "BackupAndRestore": "fitkit.callbacks.backup_and_restore",
    "Callback": "fitkit.callbacks.keras_callback",
    "CSVLogger": "fitkit.callbacks.csv_logger",
    "EarlyStopping": "fitkit.callbacks.early_stopping",
    "LambdaCallback": "fitkit.callbacks.lambda_callback",
    "LearningRateScheduler": "fitkit.callbacks.learning_rate_scheduler",
    "ModelCheckpoint": "fitkit.callbacks.model_checkpoint",
    "ReduceLROnPlateau": "fitkit.callbacks.reduce_lr_on_plateau",
    "TerminateOnNaN": "fitkit.callbacks.terminate_on_nan",
    # Hugging Face names
    "EarlyStoppingCallback": "fitkit.callbacks.hf_compat",
    "ProgressCallback": "fitkit.callbacks.hf_compat",
}

_EXPORTS = {
    **CALLBACK_CLASSES,
    "Order": "fitkit.callbacks.state",
    "Stateful": "fitkit.callbacks.state",
    "StopTraining": "fitkit.callbacks.state",
    "TrainerControl": "fitkit.callbacks.state",
    "TrainerState": "fitkit.callbacks.state",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and the API docs; nothing is imported at run time
    from fitkit.callbacks.backup_and_restore import BackupAndRestore
    from fitkit.callbacks.base import CallbackHandler, TrainerCallback
    from fitkit.callbacks.csv_logger import CSVLogger
    from fitkit.callbacks.early_stopping import EarlyStopping
    from fitkit.callbacks.flow import DefaultFlowCallback
    from fitkit.callbacks.hf_compat import EarlyStoppingCallback, ProgressCallback
    from fitkit.callbacks.history import History
    from fitkit.callbacks.keras_callback import Callback
    from fitkit.callbacks.lambda_callback import LambdaCallback
    from fitkit.callbacks.learning_rate_scheduler import LearningRateScheduler
    from fitkit.callbacks.model_checkpoint import ModelCheckpoint
    from fitkit.callbacks.printer import PrinterCallback
    from fitkit.callbacks.progress import ProgressBar
    from fitkit.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
    from fitkit.callbacks.state import Order, Stateful, StopTraining, TrainerControl, TrainerState
    from fitkit.callbacks.terminate_on_nan import TerminateOnNaN


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fitkit.callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
