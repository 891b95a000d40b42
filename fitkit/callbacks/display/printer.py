"""`PrinterCallback`: prints every log record (HF's bare printer)."""

from __future__ import annotations

from fitkit.common.logs import TOTAL_FLOS
from fitkit.events.handler import TrainerCallback


class PrinterCallback(TrainerCallback):
    """Print each `on_log` record on the world-zero process.

    Example::

        model.fit(x, y, verbose=0, callbacks=[PrinterCallback()])
        # {'loss': 0.6931, 'learning_rate': 0.001, 'epoch': 1.0}
    """

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            print({k: v for k, v in logs.items() if k != TOTAL_FLOS}, flush=True)
