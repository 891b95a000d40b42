"""Keras' own callback classes (`keras.callbacks.*`) handed to fitkit: the ones that run with Keras'
effect (`KerasAdapter` calls them as Keras does) and the ones refused before a run starts, with an
error naming fitkit's equivalent::

    refuse_unsupported(keras.callbacks.ModelCheckpoint("m.keras"), "callbacks[0]")
    # TypeError: `callbacks[0]` is keras.callbacks.ModelCheckpoint, which writes Keras' model format ...

A class is recognised by its module (`keras.src.callbacks...`), so keras is never imported here, and
a user's subclass of a refused class is refused too (it keeps Keras' machinery).
"""

from __future__ import annotations

from typing import Any

#: Keras' callbacks that run on a fitkit run with their Keras effect.
RUNS: frozenset[str] = frozenset({
    "Callback",               # any subclass: its methods, positionally
    "LambdaCallback",         # its functions, positionally
    "History",                # records every epoch's logs in its own `history`
    "CSVLogger",              # one row per epoch's logs
    "EarlyStopping",          # `model.stop_training`, `get_weights` / `set_weights`
    "LearningRateScheduler",  # `model.optimizer.learning_rate`, and `learning_rate` in the epoch's logs
    "ReduceLROnPlateau",      # the same
    "TerminateOnNaN",         # `model.stop_training` after a NaN running loss
    "RemoteMonitor",          # posts each epoch's logs
})

#: Keras' callbacks that change the optimizer's rate: `History` records `learning_rate` beside them, as Keras'.
CHANGES_LEARNING_RATE: frozenset[str] = frozenset({"LearningRateScheduler", "ReduceLROnPlateau"})
#: fitkit's callback that does what a Keras monitor callback does, taking the direction from the metric.
_MONITOR_EQUIVALENT = {"EarlyStopping": "fitkit.callbacks.EarlyStopping",
                       "ReduceLROnPlateau": "fitkit.callbacks.ReduceLROnPlateau"}

#: Keras' callbacks fitkit refuses, and why, with what to use instead.
REFUSED: dict[str, str] = {
    "ModelCheckpoint": "it writes Keras' model format through Keras' `Model.save`; use "
                       "fitkit.callbacks.ModelCheckpoint (the same arguments: filepath, monitor, save_best_only, "
                       "save_weights_only, mode, save_freq, initial_value_threshold)",
    "BackupAndRestore": "it restores Keras' training state (optimizer variables, epoch counters) that a fitkit run "
                        "does not have; use fitkit.callbacks.BackupAndRestore (the same arguments: backup_dir, "
                        "save_freq, delete_checkpoint)",
    "OrbaxCheckpoint": "it checkpoints JAX arrays through Orbax; use fitkit.callbacks.ModelCheckpoint or "
                       "fitkit.callbacks.BackupAndRestore",
    "ProgbarLogger": "fitkit draws its own progress bar; use verbose=1 (fitkit.callbacks.ProgressBar) or verbose=2",
    "TensorBoard": "it writes summaries through TensorFlow; use report_to=\"tensorboard\" "
                   "(fitkit.integrations.TensorBoardCallback)",
    "SwapEMAWeights": "it swaps the EMA weights of a Keras optimizer built with use_ema=True, which a torch optimizer "
                      "does not keep; fitkit has no equivalent yet: keep a torch.optim.swa_utils.AveragedModel in a "
                      "fitkit.callbacks.Callback (on_train_batch_end) and evaluate with it",
    "CallbackList": "it is Keras' container of callbacks, not a callback; pass the callbacks themselves in a list, "
                    "callbacks=[...] (each a fitkit.callbacks.Callback, or one of Keras' own that fitkit runs)",
}


def keras_callback_name(callback: Any) -> str | None:
    """The name of the Keras callback class `callback` is (or derives from), or None when it is none
    of Keras' own: the most derived class of `keras.src.callbacks` in its class's MRO."""
    cls = callback if isinstance(callback, type) else type(callback)
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras.src.callbacks.") or klass.__module__.startswith("keras.callbacks"):
            return klass.__name__
    return None


def refuse_unsupported(callback: Any, where: str) -> None:
    """Raise `TypeError` naming `where` and fitkit's equivalent when `callback` (an instance or a
    class) is one of Keras' own callbacks that fitkit cannot run."""
    name = keras_callback_name(callback)
    if name is None:
        return
    if name in RUNS:
        problem = None if isinstance(callback, type) else _monitor_problem(callback, name)
        if problem:
            raise TypeError(f"`{where}` is {problem}")
        return
    reason = REFUSED.get(name)
    if reason is None:  # a class a newer Keras added: not tried on fitkit
        reason = ("fitkit has not been checked against it; write the behaviour as a fitkit.callbacks.Callback, "
                  "or see docs/callbacks.md for fitkit's callbacks")
    shown = type(callback).__name__ if not isinstance(callback, type) else callback.__name__
    what = f"keras.callbacks.{name}" if shown == name else f"{shown} (a subclass of keras.callbacks.{name})"
    raise TypeError(f"`{where}` is {what}, which fitkit does not run: {reason}")


def _monitor_problem(callback: Any, name: str) -> str | None:
    """Keras' monitor callbacks (`EarlyStopping`, `ReduceLROnPlateau`) with `mode="auto"` read the
    direction of a monitored metric from Keras' own metric objects, which a fitkit model has not: such
    a callback would fail at its first epoch's end. Why, with the fix, or None when it runs."""
    if not any(k.__name__ == "MonitorCallback" for k in type(callback).__mro__):
        return None
    monitor, mode = str(getattr(callback, "monitor", "")), getattr(callback, "mode", "auto")
    if mode in ("min", "max") or monitor.removeprefix("val_") == "loss":
        return None
    return (f"keras.callbacks.{name}(monitor={monitor!r}, mode={mode!r}): Keras takes the direction of a metric "
            f"from Keras' metric objects, which a fitkit model has not; pass mode='min' or mode='max', or use "
            f"{_MONITOR_EQUIVALENT.get(name, 'fitkit.callbacks.EarlyStopping')} (the same arguments; it takes the "
            "direction from the metric)")
