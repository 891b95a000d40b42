"""`TerminateOnNaN`: stop training when the training loss becomes NaN or infinite (Keras)."""

from __future__ import annotations

import logging
import math

from fitkit.callbacks.base import TrainerCallback
from fitkit.logs import as_number

logger = logging.getLogger("fitkit")


class TerminateOnNaN(TrainerCallback):
    """Stop training at the first non-finite training loss.

    The loop never reads the loss back from the device at each step (that would slow every
    step down), so this callback checks the `loss` of each training log record: by default
    that is once per epoch. To check every step, log every step::

        model.fit(x, y, callbacks=[TerminateOnNaN()], logging_strategy="steps", logging_steps=1)

    With `logging_steps=n` the average loss of the last `n` steps is checked, which is
    non-finite as soon as one of them is. Training stops at the step that logged it
    (`control.should_training_stop`; the epoch's end-of-epoch work and `on_train_end` still
    run). `stopped_step` is that global step (None when the loss stayed finite).

    Args:
        raise_error: raise a `RuntimeError` naming the step instead of stopping quietly.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import TerminateOnNaN

        x, y = torch.randn(64, 4), torch.randn(64, 1)
        x[40] = float("nan")                      # reached at step 3 with batch_size=16
        model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
        stop = TerminateOnNaN()
        model.fit(x, y, batch_size=16, shuffle=False, logging_strategy="steps", logging_steps=1,
                  callbacks=[stop], verbose=0)
        print(stop.stopped_step, model.state.global_step)   # 3 3
    """

    def __init__(self, raise_error: bool = False) -> None:
        self.raise_error = bool(raise_error)
        self.stopped_step: int | None = None
        self._training = False

    def on_train_begin(self, args, state, control, **kwargs):
        self._training = True
        self.stopped_step = None

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._training or not logs or self.stopped_step is not None:
            return None
        loss = as_number(logs.get("loss"))
        if loss is None or math.isfinite(loss):
            return None
        step = state.global_step
        if self.raise_error:
            raise RuntimeError(f"TerminateOnNaN: the training loss is {loss} at step {step}")
        self.stopped_step = step
        logger.warning("Batch %d: Invalid loss, terminating training", step)
        control.should_training_stop = True
        return control
