"""`ProgressBar`: a live progress bar per epoch (verbose=1) or one line per epoch (verbose=2).

Per training step the callback adds one to a counter and compares the clock with the next
refresh time; the display itself is redrawn on that timer, never per step, and it only shows
values that were already logged (it never reads a tensor).
"""

from __future__ import annotations

import atexit
import math
import sys
import time
from typing import Any

from fitkit.common.logs import NOT_VALUES
from fitkit.common.schedule import steps_in_epoch, steps_per_epoch
from fitkit.common.terminal import stdout_is_tty
from fitkit.events.handler import Order, TrainerCallback


def _number(value: float) -> str:
    if value == 0 or not math.isfinite(value) or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.4e}"


def format_logs(logs: dict) -> str:
    """Keras' epoch values: `loss: 0.1234 - accuracy: 0.9612 - val_loss: ...`.

    Numbers only: training values first, then validation (`val_`) ones, each in the order
    they were logged (with `eval_strategy="steps"` an evaluation may be logged before the
    epoch's training values); positions (`epoch`, `step`) and the learning rate are left out.
    """
    training: list[str] = []
    validation: list[str] = []
    for key, value in logs.items():
        if key in NOT_VALUES or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        (validation if key.startswith("val_") else training).append(f"{key}: {_number(float(value))}")
    return " - ".join(training + validation)


def format_duration(seconds: float) -> str:
    """`850ms`, `1.2s`, `2m 05s`, `1h 02m`."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def keras_number(value: float) -> str:
    """A value as Keras 3 prints it: 4 decimals, scientific below 1e-3."""
    return f"{value:.4f}" if abs(value) > 1e-3 or not math.isfinite(value) else f"{value:.4e}"


def keras_values(logs: dict) -> str:
    """`loss: 0.1234 - accuracy: 0.9612 - val_loss: ...` with Keras' number format."""
    training: list[str] = []
    validation: list[str] = []
    for key, value in logs.items():
        if key in NOT_VALUES or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        (validation if key.startswith("val_") else training).append(f"{key}: {keras_number(float(value))}")
    return " - ".join(training + validation)


def keras_per_step(seconds: float) -> str:
    """Keras 3's time per step: `3ms/step`, `265ms/step`, `2s/step`, `850us/step`."""
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.0f}s/step"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/step"
    return f"{seconds * 1e6:.0f}us/step"


#: Keras' bar width in its final frame.
KERAS_BAR = 20


def keras_epoch_line(steps: int, seconds: float, per_step: float | None, logs: dict, extras: str = "",
                     bar: bool = False) -> str:
    """The line an epoch ends with, in Keras 3's format, then fitkit's extras after `|`::

        13/13 - 3s - 265ms/step - loss: 0.2213 - val_loss: 0.1263 | 4.9 steps/s - 157 samples/s - ...
        13/13 ━━━━━━━━━━━━━━━━━━━━ 3s 265ms/step - loss: 0.2213 - val_loss: 0.1263 | ...   (bar=True)
    """
    step = keras_per_step(per_step if per_step is not None else 0.0)
    head = (f"{steps}/{steps} {'━' * KERAS_BAR} {seconds:.0f}s {step}" if bar
            else f"{steps}/{steps} - {seconds:.0f}s - {step}")
    values = keras_values(logs)
    line = f"{head} - {values}" if values else head
    return f"{line} | {extras}" if extras else line


def extras_text(steps_per_second: float | None, samples_per_second: float | None, run_eta: float | None,
                peak_bytes: int | None, tokens_per_second: float | None = None) -> str:
    """fitkit's figures beside Keras' line: `4.9 steps/s - 157 samples/s - ETA 0:00:12 - peak 812 MiB`
    (the ETA is the whole run's, evaluations included; `tokens/s` follows `samples/s` when the
    batches carry `input_ids`)."""
    parts = []
    if steps_per_second:
        parts.append(f"{steps_per_second:.1f} steps/s")
    if samples_per_second:
        parts.append(f"{samples_per_second:.0f} samples/s")
    if tokens_per_second:
        parts.append(f"{tokens_per_second:.0f} tokens/s")
    if run_eta is not None:
        minutes, secs = divmod(int(run_eta + 0.5), 60)
        hours, minutes = divmod(minutes, 60)
        parts.append(f"ETA {hours}:{minutes:02d}:{secs:02d}")
    if peak_bytes:
        parts.append(f"peak {peak_bytes / 2**20:.0f} MiB")
    return " - ".join(parts)


def peak_memory(device: Any = None) -> int | None:
    """The epoch's peak memory: CUDA's max allocated on a GPU (a host-side allocator figure, no
    device sync), else the process's peak resident set size."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux
    except (ImportError, OSError):
        return None


def reset_peak_memory() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _epoch_title(epoch: int, epochs: int | None) -> str:
    # `max_steps` without a known epoch count leaves `num_train_epochs` at sys.maxsize.
    if epochs and epochs < 10**9:
        return f"Epoch {epoch}/{epochs}"
    return f"Epoch {epoch}"


def _live_console() -> Any:
    """A rich console when stdout can show a live display (a terminal, a notebook), else None.

    A pipe, a file, `TERM=dumb` or `TTY_COMPATIBLE=0` get plain lines instead: no cursor
    movement and no colour codes in logs.
    """
    from rich.console import Console

    console = Console()
    if console.is_jupyter:
        return console
    if stdout_is_tty() and console.is_terminal and not console.is_dumb_terminal:
        return console
    return None


#: Live displays started and not yet stopped. No event follows an exception (a
#: `KeyboardInterrupt` from a notebook's stop button included), so `fit` calls
#: `close_displays` on its way out, whatever the way; the interpreter's exit does too. That
#: gives the terminal back its cursor and sys.stdout / sys.stderr back their streams.
_OPEN_DISPLAYS: list[ProgressBar] = []


def close_displays() -> None:
    """Stop every live display still open (the engine calls this when `fit` exits)."""
    while _OPEN_DISPLAYS:
        bar = _OPEN_DISPLAYS.pop()
        try:
            bar._stop_display()
        except Exception:  # noqa: BLE001 - best effort on a display left by a failed run
            pass


_stop_open_displays = close_displays  # its former name, which tests/test_display.py calls
atexit.register(close_displays)


class ProgressBar(TrainerCallback):
    """Shows training progress on the world-zero process.

    With `bar=True` (`fit(verbose=1)`), in a terminal or a notebook, each epoch draws a
    bar with the step count, the rate (steps/s), the ETA and the latest logged loss and
    metrics; validation during `fit` shows a transient bar of its own; each epoch ends with a
    Keras-style line::

        Epoch 3/10 - 1.2s - 4.1ms/step - loss: 0.1234 - accuracy: 0.9612 - val_loss: 0.1502 - val_accuracy: 0.9555

    When stdout is not a terminal (a pipe, a log file), and with `bar=False`
    (`fit(verbose=2)`), only that line is printed, once per epoch, with no control
    characters. In a notebook the bars are an IPython display updated in place (no
    ipywidgets needed) that becomes the epoch's line.

    The bar is redrawn at most every `refresh_seconds`; a training step costs a counter
    increment and a clock read. Values come from `on_log` records only: the live loss appears
    as often as `logging_steps` logs it (with the default `logging_strategy="epoch"`, at the
    epoch's end).

    Example::

        model.fit(x, y, epochs=3, verbose=0, callbacks=[ProgressBar()])
    """

    takes_batch = False  # its step events ignore `batch`, `outputs` and `loss`

    order = Order.DISPLAY  # after callbacks that add values to the logs

    def __init__(self, bar: bool = True, refresh_seconds: float = 0.1, values_seconds: float = 0.5) -> None:
        self.bar = bar
        self.refresh_seconds = refresh_seconds
        self.values_seconds = values_seconds  # running values: one host read per refresh of them
        self._running: Any = None
        self._next_values = 0.0
        self._run_started, self._epochs_done, self._world_size = 0.0, 0, 1
        self._progress: Any = None
        self._active = False
        self._reset_epoch()
        self._epochs: int | None = None
        self._steps_per_epoch: int | None = None

    def close_run(self) -> None:
        """At the end of `fit`, however it ends: every live display closed (streams and cursor back)."""
        close_displays()

    def _reset_epoch(self) -> None:
        self._epoch_index = 0  # 1-based; 0: no epoch on display
        self._epoch_logs: dict = {}
        self._steps = self._steps_before = 0
        self._epoch_started = self._train_ended = 0.0
        self._eval_seconds, self._eval_started = 0.0, None  # evaluations within the training (eval_strategy="steps")
        self._ending = False  # on_epoch_end has fired: the next closing record ends the line
        self._task = self._val_task = None
        self._total: int | None = None  # the epoch's steps, when known up front
        self._val_steps = 0
        self._next_refresh = 0.0

    # -- display ---------------------------------------------------------------------------
    def _start_display(self) -> None:
        self._progress = None
        close_displays()  # one left behind by a run that died before `fit` could close it
        console = _live_console() if self.bar else None
        if console is not None:
            from fitkit.callbacks.display.bar import bars_for

            self._progress = bars_for(console)
            _OPEN_DISPLAYS.append(self)
            self._progress.start()

    def _stop_display(self) -> None:
        """Close the display. Bars still up (a fit that raised) first count what was done, so
        a display that keeps its last frame (a notebook's) shows where the run stopped."""
        progress, self._progress = self._progress, None
        if self in _OPEN_DISPLAYS:
            _OPEN_DISPLAYS.remove(self)
        if progress is not None:
            for row, done in ((self._task, self._steps), (self._val_task, self._val_steps)):
                if row is not None:
                    row.update(completed=done)
            progress.stop()

    def _refresh(self, now: float) -> None:
        self._next_refresh = now + self.refresh_seconds
        if self._task is not None:
            self._task.update(completed=self._steps)
        if self._val_task is not None:
            self._val_task.update(completed=self._val_steps)
        self._progress.refresh()

    def _epoch_total(self, state, epoch: int) -> int | None:
        """Optimizer steps in this epoch, when they can be known."""
        if self._steps_per_epoch is None:
            return None
        return steps_in_epoch(epoch, per_epoch=self._steps_per_epoch, max_steps=state.max_steps)

    def _finish_epoch(self) -> None:
        """Print the epoch's line (Keras 3's, then fitkit's figures) in place of its bars."""
        if not self._epoch_index:
            return
        now = time.monotonic()
        train_seconds = (self._train_ended or now) - self._epoch_started - self._eval_seconds
        run = self._steps - self._steps_before
        per_step = train_seconds / run if run > 0 else None
        self._epochs_done += 1
        samples = self._running.samples() * self._world_size if self._running is not None else 0
        tokens = self._running.tokens() * self._world_size if self._running is not None else 0
        left = (self._epochs or 0) - self._epoch_index
        run_eta = (now - self._run_started) / self._epochs_done * left if 0 <= left < 10**9 else None
        extras = extras_text(1 / per_step if per_step else None,
                             samples / train_seconds if samples and train_seconds > 0 else None, run_eta,
                             peak_memory(), tokens / train_seconds if tokens and train_seconds > 0 else None)
        line = keras_epoch_line(self._steps, now - self._epoch_started, per_step, self._epoch_logs, extras,
                                bar=self._progress is not None)
        if self._progress is not None:
            self._progress.finish(line)
        else:
            print(line, flush=True)
        self._reset_epoch()

    # -- events --------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self._active = bool(state.is_world_process_zero)
        self._reset_epoch()
        self._steps_per_epoch = None
        if not self._active:
            return
        self._epochs = state.num_train_epochs
        self._running = kwargs.get("running_logs")
        self._run_started, self._epochs_done = time.monotonic(), 0
        self._world_size = max(getattr(args, "world_size", 1) or 1, 1)
        if state.max_steps and state.num_train_epochs and args.max_steps <= 0:
            # the engine planned max_steps = epochs x steps per epoch (fitkit.common.schedule.plan)
            self._steps_per_epoch = max(1, state.max_steps // state.num_train_epochs)
        else:
            loader = kwargs.get("train_dataloader")
            try:
                self._steps_per_epoch = steps_per_epoch(len(loader), args.gradient_accumulation_steps)
            except TypeError:  # no loader, or one without a length: learned after the first epoch
                pass
        self._start_display()

    def on_epoch_begin(self, args, state, control, **kwargs):
        if not self._active:
            return
        self._finish_epoch()
        self._reset_epoch()
        epoch = int(state.epoch or 0)
        self._epoch_index = epoch + 1
        self._epoch_started = self._next_refresh = time.monotonic()
        self._next_values = self._epoch_started  # the first step's values show at once, then every values_seconds
        reset_peak_memory()
        if self._epochs and 1 < self._epochs < 10**9:  # Keras prints no title for a single epoch
            title = _epoch_title(self._epoch_index, self._epochs)
            if self._progress is not None:
                self._progress.print(title)
            else:
                print(title, flush=True)
        total = self._total = self._epoch_total(state, epoch)
        if self._steps_per_epoch and total and state.global_step > epoch * self._steps_per_epoch:
            self._steps = min(state.global_step - epoch * self._steps_per_epoch, total)  # resumed mid-epoch
        self._steps_before = self._steps
        if self._progress is not None:
            self._task = self._progress.add_row("", total, self._steps)
            self._refresh(self._epoch_started)

    def on_step_end(self, args, state, control, **kwargs):
        self._steps += 1
        if self._progress is not None:
            now = time.monotonic()
            if now >= self._next_refresh:
                if now >= self._next_values and self._running is not None and self._task is not None:
                    self._next_values = now + self.values_seconds  # the running values: one host read
                    self._task.values = keras_values({**self._epoch_logs, **self._running.read("train")})
                self._refresh(now)

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self._active or not self._epoch_index:
            return
        self._train_ended = time.monotonic()
        self._ending = True
        if self._steps_per_epoch is None and not control.should_epoch_stop and not control.should_training_stop:
            self._steps_per_epoch = self._steps  # a full epoch of an unsized loader
        if self._task is not None:
            if self._total is None:  # now it is known
                self._task.update(total=self._steps)
            self._refresh(self._train_ended)

    def on_prediction_step(self, args, state, control, **kwargs):
        if not self._active or not self._epoch_index:  # evaluate() / predict() outside fit
            return
        self._val_steps += 1
        if self._eval_started is None:
            self._eval_started = time.monotonic()
        if self._progress is None:
            return
        if self._val_task is None:
            try:
                total = len(kwargs.get("eval_dataloader"))
            except TypeError:  # unknown up front: an indeterminate bar that counts
                total = None
            self._val_task = self._progress.add_row("  validation", total)
        now = time.monotonic()
        if now >= self._next_refresh:
            self._refresh(now)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._active or not logs:
            return
        if "train_runtime" in logs:  # the run's closing summary is not an epoch's
            self._finish_epoch()
            return
        self._epoch_logs.update(logs)
        if self._task is not None:
            self._task.values = keras_values(self._epoch_logs)
            now = time.monotonic()
            if self._ending or now >= self._next_refresh:  # per-step logging still redraws on the timer
                self._refresh(now)
        validated = any(key.startswith("val_") for key in logs)
        if self._ending and (validated or not control.should_evaluate):
            self._finish_epoch()  # the epoch's last record: its line goes out now, as in Keras

    def on_evaluate(self, args, state, control, **kwargs):
        if not self._active:
            return
        if self._eval_started is not None and not self._ending:  # inside the training time: not a step's
            self._eval_seconds += time.monotonic() - self._eval_started
        self._eval_started = None
        if self._val_task is not None:
            self._progress.remove_row(self._val_task)
            self._val_task = None
            self._refresh(time.monotonic())
        self._val_steps = 0

    def on_train_end(self, args, state, control, **kwargs):
        if not self._active:
            return
        try:
            self._finish_epoch()
        finally:
            self._stop_display()
            self._active = False
