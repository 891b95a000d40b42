"""Callbacks: the `TrainerCallback` event system and the built-in callbacks.

    from fitkit.callbacks import EarlyStopping, ModelCheckpoint

Each name loads its module on first use, so importing the contract (`fitkit.events.state`,
`fitkit.events.handler`) does not load every built-in callback.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fitkit.events.builtin import CALLBACK_CLASSES

_EXPORTS = {
    **CALLBACK_CLASSES,
    "Order": "fitkit.events.state",
    "no_op": "fitkit.events.base_defaults",
    "Stateful": "fitkit.events.state",
    "StopTraining": "fitkit.events.state",
    "TrainerControl": "fitkit.events.state",
    "TrainerState": "fitkit.events.state",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and the API docs; nothing is imported at run time
    from fitkit.callbacks.backup_and_restore import BackupAndRestore
    from fitkit.callbacks.csv_logger import CSVLogger
    from fitkit.callbacks.display.printer import PrinterCallback
    from fitkit.callbacks.display.progress import ProgressBar
    from fitkit.callbacks.early_stopping import EarlyStopping
    from fitkit.callbacks.flow import DefaultFlowCallback
    from fitkit.callbacks.hf_compat import EarlyStoppingCallback, ProgressCallback
    from fitkit.callbacks.history import History
    from fitkit.callbacks.keras.callback import Callback
    from fitkit.callbacks.keras.lambda_callback import LambdaCallback
    from fitkit.callbacks.learning_rate_scheduler import LearningRateScheduler
    from fitkit.callbacks.model_checkpoint import ModelCheckpoint
    from fitkit.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
    from fitkit.callbacks.terminate_on_nan import TerminateOnNaN
    from fitkit.events.handler import CallbackHandler, TrainerCallback
    from fitkit.events.state import Order, Stateful, StopTraining, TrainerControl, TrainerState


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fitkit.callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
