"""Callbacks: the `TrainerCallback` event system and the built-in callbacks."""

from fitkit.callbacks.backup_and_restore import BackupAndRestore
from fitkit.callbacks.base import (
    CallbackHandler, Order, Stateful, StopTraining, TrainerCallback, TrainerControl, TrainerState,
)
from fitkit.callbacks.csv_logger import CSVLogger
from fitkit.callbacks.early_stopping import EarlyStopping
from fitkit.callbacks.flow import DefaultFlowCallback
from fitkit.callbacks.keras_callback import Callback
from fitkit.callbacks.hf_compat import EarlyStoppingCallback, ProgressCallback
from fitkit.callbacks.history import History
from fitkit.callbacks.lambda_callback import LambdaCallback
from fitkit.callbacks.learning_rate_scheduler import LearningRateScheduler
from fitkit.callbacks.model_checkpoint import ModelCheckpoint
from fitkit.callbacks.printer import PrinterCallback
from fitkit.callbacks.progress import ProgressBar
from fitkit.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from fitkit.callbacks.terminate_on_nan import TerminateOnNaN

__all__ = [
    "CallbackHandler", "DefaultFlowCallback", "History", "Order", "PrinterCallback", "ProgressBar", "Stateful",
    "StopTraining", "TrainerCallback", "TrainerControl", "TrainerState",
    # Keras-like callbacks
    "BackupAndRestore", "Callback", "CSVLogger", "EarlyStopping", "LambdaCallback", "LearningRateScheduler", "ModelCheckpoint",
    "ReduceLROnPlateau", "TerminateOnNaN",
    # Hugging Face names
    "EarlyStoppingCallback", "ProgressCallback",
]
