"""`PrinterCallback`: prints every log record (HF's bare printer)."""

from __future__ import annotations

from fitkit.common.logs import TOTAL_FLOS
from fitkit.events.handler import TrainerCallback


class PrinterCallback(TrainerCallback):
    """Print each `on_log` record on the world-zero process; `hf_format=True` writes floats with
    four significant digits, as HF's Trainer prints them (what a fit under HF's arguments with
    `disable_tqdm=True` adds for you).

    Example::

        model.fit(x, y, verbose=0, callbacks=[PrinterCallback()])
        # {'loss': 0.6931471824645996, 'learning_rate': 0.001, 'epoch': 1.0}
        model.fit(x, y, verbose=0, callbacks=[PrinterCallback(hf_format=True)])
        # {'loss': '0.6931', 'learning_rate': '0.001', 'epoch': '1'}
    """

    takes_batch = False

    def __init__(self, hf_format: bool = False):
        self.hf_format = hf_format

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            shown = {k: v for k, v in logs.items() if k != TOTAL_FLOS}
            if self.hf_format:
                shown = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in shown.items()}
            print(shown, flush=True)
