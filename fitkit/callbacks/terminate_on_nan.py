"""`TerminateOnNaN`: stop training after the first batch whose loss is NaN or infinite (Keras)."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from fitkit.common.logs import as_number
from fitkit.events.handler import TrainerCallback

if TYPE_CHECKING:
    import torch

logger = logging.getLogger("fitkit")


class TerminateOnNaN(TrainerCallback):
    """Stop training after the first optimizer step whose loss is not finite.

    Each step's loss (the `loss` keyword of `on_step_end` / `on_substep_end`, summed over the
    micro-batches of a gradient-accumulation cycle) is checked without stalling the device:

    - on CPU the value is read at once (a read there costs nothing): training stops after the
      step whose loss is NaN or infinite;
    - on a CUDA GPU the value is copied, without blocking, into pinned host memory and read at
      the next step's end, once the GPU has finished the step before (the current step's work
      is already queued, so the GPU never waits): training stops **one step later**;
    - on other accelerators only the logged losses are checked (below).

    With several processes the losses are summed over all of them first (one small
    collective a step), so every process stops at the same step. Every training log's `loss`
    is checked too (the epoch averages included), which also covers `train_step` overrides
    that return no loss tensor.

    Stopping sets `control.should_training_stop`: the step ends, the epoch's end-of-epoch work
    and `on_train_end` still run. `stopped_step` is the global step whose loss was not finite
    (None while the loss stayed finite).

    Args:
        raise_error: raise a `RuntimeError` naming the batch and step instead of stopping
            gracefully (`on_train_end` then does not run, as in Keras, so a backup is kept).

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import TerminateOnNaN

        x, y = torch.randn(64, 4), torch.randn(64, 1)
        x[40] = float("nan")                      # in the 3rd batch with batch_size=16
        model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
        stop = TerminateOnNaN()
        model.fit(x, y, batch_size=16, shuffle=False, callbacks=[stop], verbose=0)
        print(stop.stopped_step, model.state.global_step)   # 3 3 (on a GPU: 3 4)
    """

    def __init__(self, raise_error: bool = False) -> None:
        self.raise_error = bool(raise_error)
        self.stopped_step: int | None = None
        self._training = False
        self._watch: LossWatch | None = None
        self._epoch_first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._training = True
        self.stopped_step = None
        self._watch = None
        self._epoch_first_step = state.global_step

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_first_step = state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self._training = False
        self._watch = None

    def on_substep_end(self, args, state, control, loss=None, **kwargs):
        if loss is not None and self._training and self.stopped_step is None:
            self._watch_for(loss).add(loss)

    def on_step_end(self, args, state, control, loss=None, **kwargs):
        if not self._training or self.stopped_step is not None:
            return None
        watch = self._watch if loss is None else self._watch_for(loss)
        if watch is None:
            return None
        if loss is not None:
            watch.add(loss)
        found = watch.step_end(state.global_step)
        if found is None:
            return None
        step, value = found
        return self._stop(control, state, step, value)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._training or not logs or self.stopped_step is not None:
            return None
        loss = as_number(logs.get("loss"))
        if loss is None or math.isfinite(loss):
            return None
        return self._stop(control, state, state.global_step, loss)

    def _watch_for(self, loss: Any) -> LossWatch:
        if self._watch is None:
            self._watch = LossWatch(loss.device)
        return self._watch

    def _stop(self, control, state, step: int, value: float):
        batch = max(step - 1 - self._epoch_first_step, 0)
        if self.raise_error:
            raise RuntimeError(f"TerminateOnNaN: NaN or Inf loss encountered at batch {batch} (global step {step}). "
                               f"Loss value: {value}. Terminating training immediately.")
        self.stopped_step = step
        if state.is_world_process_zero:
            logger.warning("Batch %d: Invalid loss, terminating training (global step %d, loss %s)", batch, step, value)
        control.should_training_stop = True
        return control


class LossWatch:
    """Whether each optimizer step's loss is finite, read without stalling the device.

        watch = LossWatch(loss.device)
        watch.add(loss)                      # each micro-batch of the step
        watch.step_end(global_step)          # (step, value) of a non-finite loss, or None

    On CPU `step_end` reads the step's summed loss at once. On CUDA it returns the previous
    step's verdict (its value was copied into pinned memory without blocking) and starts the
    copy of this one. On other devices it never reads (`step_end` returns None). With several
    processes the sum is all-reduced first, so every process reaches the same verdict.
    """

    def __init__(self, device: Any, deferred: bool | None = None) -> None:
        import torch

        kind = getattr(device, "type", "cpu")
        self.cuda = kind == "cuda"
        if deferred is None:
            self.mode = {"cpu": "now", "cuda": "next"}.get(kind, "off")
        else:  # forced (tests run the deferred reading on CPU)
            self.mode = "next" if deferred else "now"
        self._sum: torch.Tensor | None = None  # this step's losses, summed on the device
        self._distributed = torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1
        self._host: torch.Tensor | None = None  # the pinned buffer the previous step's sum was copied into
        self._event: torch.cuda.Event | _Finished | None = None  # recorded after that copy
        self._pending_step: int | None = None  # the step whose sum the buffer holds

    def add(self, loss: Any) -> None:
        if self.mode == "off":
            return
        value = loss.detach().double()
        self._sum = value if self._sum is None else self._sum + value

    def step_end(self, step: int) -> tuple[int, float] | None:
        total, self._sum = self._sum, None
        if total is None:
            return None
        if self._distributed:
            import torch.distributed as dist

            dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if self.mode == "now":
            value = float(total)
            return None if math.isfinite(value) else (step, value)
        return self._swap(total, step)

    def _swap(self, total: Any, step: int) -> tuple[int, float] | None:
        """Read the previous step's copy (finished by now), then copy this step's sum."""
        import torch

        found = None
        if self._event is not None:
            assert self._host is not None and self._pending_step is not None  # set with the event
            self._event.synchronize()  # the previous step: the GPU is done with it, or nearly
            value = float(self._host)  # a read of host memory
            if not math.isfinite(value):
                found = (self._pending_step, value)
        else:
            self._host = torch.empty((), dtype=torch.float64, pin_memory=self.cuda)
            self._event = torch.cuda.Event() if self.cuda else _Finished()
        self._host.copy_(total, non_blocking=True)
        self._event.record()
        self._pending_step = step
        return found


class _Finished:
    """An event that is always complete (for the deferred reading of a CPU tensor)."""

    def record(self) -> None:
        return None

    def synchronize(self) -> None:
        return None
