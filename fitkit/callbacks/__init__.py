"""Callbacks: the `TrainerCallback` event system and the built-in callbacks."""

from fitkit.callbacks.base import CallbackHandler, StopTraining, TrainerCallback, TrainerControl, TrainerState
from fitkit.callbacks.flow import DefaultFlowCallback
from fitkit.callbacks.history import History
from fitkit.callbacks.printer import PrinterCallback
from fitkit.callbacks.progress import ProgressBar

__all__ = [
    "CallbackHandler", "DefaultFlowCallback", "History", "PrinterCallback", "ProgressBar", "StopTraining",
    "TrainerCallback", "TrainerControl", "TrainerState",
]
