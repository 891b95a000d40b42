"""`EvaluationLine`: the line Keras prints after `evaluate` and `predict` (`verbose` 1 or 2).

    model.evaluate(x, y)              # 4/4 - 0s 2ms/step - loss: 0.3512 - accuracy: 0.8750
    model.predict(x, verbose=0)       # nothing

Printed by the world-zero process only; `evaluate` and `predict` add it for you unless
`verbose=0`.
"""

from __future__ import annotations

import time

from fitkit.events.handler import Order, TrainerCallback


class EvaluationLine(TrainerCallback):
    """Counts the batches of one `evaluate` / `predict` call and prints one line at its end."""

    takes_batch = False  # its step events ignore `batch`, `outputs` and `loss`

    order = Order.DISPLAY

    def __init__(self) -> None:
        self.steps = 0
        self.started: float | None = None

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.started is None:
            self.started = time.perf_counter()
        self.steps += 1

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._line(state, metrics or {})

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._line(state, {})

    def _line(self, state, metrics: dict) -> None:
        from fitkit.callbacks.display.progress import format_duration, format_logs

        elapsed = time.perf_counter() - self.started if self.started is not None else 0.0
        steps, self.steps, self.started = self.steps, 0, None
        if not state.is_world_process_zero:
            return
        each = elapsed / steps if steps else 0.0
        per_step = "" if not steps else f"{each * 1e3:.0f}ms/step" if each >= 1e-3 else f"{each * 1e6:.0f}us/step"
        parts = [f"{steps}/{steps}", f"{format_duration(elapsed)} {per_step}".strip(), format_logs(metrics)]
        print(" - ".join(part for part in parts if part), flush=True)


def evaluation_line_for(verbose: int | str) -> list[TrainerCallback]:
    """The line `evaluate` / `predict` print (none for `verbose=0`), as Keras."""
    if isinstance(verbose, bool) or verbose not in (0, 1, 2, "auto"):
        raise ValueError(f"`verbose`={verbose!r} is invalid: use 0 (silent), 1, 2 or 'auto' (a line at the end)")
    return [] if verbose == 0 else [EvaluationLine()]
