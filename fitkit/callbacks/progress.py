"""`ProgressBar`: a rich progress bar per epoch (verbose=1) or one line per epoch (verbose=2)."""

from __future__ import annotations

import time

from fitkit.callbacks.base import TrainerCallback

_HIDDEN = {"epoch", "step", "total_flos", "learning_rate"}


def format_logs(logs: dict) -> str:
    """Keras' epoch line: `loss: 0.1234 - accuracy: 0.9612 - val_loss: ...`."""
    parts = []
    for key, value in logs.items():
        if key in _HIDDEN or not isinstance(value, (int, float)):
            continue
        parts.append(f"{key}: {value:.4f}")
    return " - ".join(parts)


class ProgressBar(TrainerCallback):
    """Shows training progress on the world-zero process.

    `bar=True` draws a rich bar per epoch (steps, rate, ETA, the latest logged loss and
    metrics), refreshed on a timer rather than per step; `bar=False` prints one Keras-style
    line per epoch. `fit(verbose=1)` and `fit(verbose=2)` add one for you.

    Example::

        model.fit(x, y, epochs=3, verbose=0, callbacks=[ProgressBar()])
    """

    order = 100  # after callbacks that add values to the logs

    def __init__(self, bar: bool = True, refresh_seconds: float = 0.1):
        self.bar = bar
        self.refresh_seconds = refresh_seconds
        self._progress = None
        self._task = None
        self._epoch_logs: dict = {}
        self._epoch_index = 0
        self._steps = 0
        self._active = False

    # -- helpers ---------------------------------------------------------------------------
    def _steps_per_epoch(self, state) -> int | None:
        if state.max_steps and state.num_train_epochs:
            return max(1, -(-state.max_steps // state.num_train_epochs))
        return None

    def _finish_epoch(self) -> None:
        if self._epoch_index == 0:
            return
        elapsed = time.monotonic() - self._epoch_started
        text = format_logs(self._epoch_logs)
        head = f"Epoch {self._epoch_index}/{self._epochs}"
        if self.bar and self._progress is not None:
            self._progress.update(self._task, completed=self._steps, description=head, metrics=text)
        else:
            took = f"{elapsed:.1f}s" if elapsed >= 1 else f"{elapsed * 1000:.0f}ms"
            per_step = f"{elapsed * 1000 / self._steps:.1f}ms/step" if self._steps else ""
            line = " - ".join(p for p in (head, took, per_step) if p)
            print(f"{line} - {text}" if text else line, flush=True)
        self._epoch_index = 0

    # -- events --------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._active = state.is_world_process_zero
        if not self._active:
            return
        self._epochs = state.num_train_epochs
        self._epoch_index = 0
        if self.bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[metrics]}"), refresh_per_second=8,
            )
            self._progress.start()

    def on_epoch_begin(self, args, state, control, **kwargs):
        if not self._active:
            return
        self._finish_epoch()
        self._epoch_index = int(state.epoch or 0) + 1
        self._epoch_logs = {}
        self._steps = 0
        self._epoch_started = self._last = time.monotonic()
        if self._progress is not None:
            self._task = self._progress.add_task(
                f"Epoch {self._epoch_index}/{self._epochs}", total=self._steps_per_epoch(state), metrics=""
            )

    def on_step_end(self, args, state, control, **kwargs):
        self._steps += 1
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last >= self.refresh_seconds:
            self._last = now
            self._progress.update(self._task, completed=self._steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._active or not logs or "train_runtime" in logs:  # the run's summary is not an epoch's
            return
        self._epoch_logs.update(logs)
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, metrics=format_logs(self._epoch_logs))

    def on_train_end(self, args, state, control, **kwargs):
        if not self._active:
            return
        self._finish_epoch()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
