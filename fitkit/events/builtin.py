"""The names of the callbacks fitkit ships, by the module that defines each: data only, so the
handler can suggest them in errors and `fitkit.callbacks` can load them lazily."""

#: The callback classes fitkit ships, by the module that defines each.
CALLBACK_CLASSES = {
    "CallbackHandler": "fitkit.events.handler",
    "TrainerCallback": "fitkit.events.handler",
    "DefaultFlowCallback": "fitkit.callbacks.flow",
    "History": "fitkit.callbacks.history",
    "PrinterCallback": "fitkit.callbacks.display.printer",
    "ProgressBar": "fitkit.callbacks.display.progress",
    # Keras-like callbacks
    "BackupAndRestore": "fitkit.callbacks.backup_and_restore",
    "Callback": "fitkit.callbacks.keras.callback",
    "CSVLogger": "fitkit.callbacks.csv_logger",
    "EarlyStopping": "fitkit.callbacks.early_stopping",
    "LambdaCallback": "fitkit.callbacks.keras.lambda_callback",
    "LearningRateScheduler": "fitkit.callbacks.learning_rate_scheduler",
    "ModelCheckpoint": "fitkit.callbacks.model_checkpoint",
    "ReduceLROnPlateau": "fitkit.callbacks.reduce_lr_on_plateau",
    "TerminateOnNaN": "fitkit.callbacks.terminate_on_nan",
    # Hugging Face names
    "EarlyStoppingCallback": "fitkit.callbacks.hf_compat",
    "ProgressCallback": "fitkit.callbacks.hf_compat",
}
