"""`ModelCheckpoint`: save the model (or its weights) to a file during training (Keras)."""

from __future__ import annotations

import math
import os
import string
from collections.abc import Mapping
from typing import Any, cast

from fitkit.callbacks._monitor import MonitorCallback, available_names, epoch_index, improves
from fitkit.callbacks._run import epoch_steps
from fitkit.common.io import atomic_torch_save
from fitkit.common.logs import as_number


class ModelCheckpoint(MonitorCallback):
    """Save the model to `filepath` at the end of every epoch or every `save_freq` steps.

    `filepath` is formatted with `epoch` (1-based), `step` (the global step), with an integer
    `save_freq` also `batch` (the step's number within its epoch, 1-based, as Keras), and every
    value logged so far in the epoch, so `"ckpt/w-{epoch:02d}-{val_loss:.3f}.pt"` keeps one file
    per epoch; a fixed name is overwritten each time. `{batch}` with `save_freq="epoch"` is a
    `ValueError` when the callback is built; a logged name that is not available when saving
    raises a `KeyError` listing the available ones.

    Args:
        filepath: where to save (a format string; folders are created).
        monitor: the value compared with `save_best_only`.
        save_best_only: only save when `monitor` improves on the best value seen so far
            (strictly, in the direction given by `mode`). When `monitor` is not logged, a
            warning (once per run) says so and the model is saved anyway, as in Keras.
        save_weights_only: True writes `module.state_dict()` (CPU tensors), which loads with
            `module.load_state_dict(torch.load(path, weights_only=True))`. False writes the file
            `Model.save` writes, which `Model.load(path, module)` reads (the weights; no compile
            configuration, so compile the loaded model again to train it).
        mode: `"min"`, `"max"` or `"auto"` (from the name, as `EarlyStopping`).
        save_freq: `"epoch"`, or an integer: save every that many optimizer steps, with the
            values logged so far.
        initial_value_threshold: with `save_best_only`, the value the first save must beat.
        verbose: 1 prints a line for each save (and each skipped save), worded as Keras'
            (the first improvement is "from inf", or "from -inf" for a value that goes up).

    When an epoch is saved: after that epoch's records are complete, that is at its
    end-of-epoch evaluation when there is one (so `val_` values are in the name and the
    comparison), else at its end-of-epoch training log, else at `on_epoch_end`. Files are
    written to a temporary name in the same folder and renamed, so a crash never leaves a
    half-written file; only the world-zero process writes. `last_filepath` is the last file
    written. Under a sharded strategy (FSDP, DeepSpeed) use `save_strategy` checkpoints instead:
    this callback saves the world-zero process's `state_dict()`.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import ModelCheckpoint

        x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
        model = Model(torch.nn.Linear(8, 2)).compile("adam", "cross_entropy")
        best = ModelCheckpoint("ckpt/best.pt", monitor="val_loss", save_best_only=True)
        model.fit(x, y, epochs=5, validation_split=0.2, callbacks=[best], verbose=0)
        restored = Model.load("ckpt/best.pt", torch.nn.Linear(8, 2))
    """

    takes_batch = False  # its step events ignore `batch`, `outputs` and `loss`

    def __init__(
        self,
        filepath: str | os.PathLike,
        monitor: str = "val_loss",
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: str = "auto",
        save_freq: str | int = "epoch",
        initial_value_threshold: float | None = None,
        verbose: int = 0,
    ) -> None:
        self.filepath = os.fspath(filepath)
        if not self.filepath:
            raise ValueError("ModelCheckpoint: `filepath` is empty; pass a file name such as 'ckpt/w-{epoch:02d}.pt'")
        if save_freq != "epoch" and not (isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0):
            raise ValueError(f"ModelCheckpoint: Unrecognized save_freq={save_freq!r}; pass 'epoch' or an integer > 0 "
                             "(optimizer steps)")
        if "batch" in _field_names(self.filepath) and save_freq == "epoch":
            raise ValueError(
                f"ModelCheckpoint: `filepath`={self.filepath!r} uses {{batch}}, the step's number within its epoch, "
                "which only an integer `save_freq` gives; pass save_freq=<steps> (e.g. save_freq=100) or remove {batch}"
            )
        # the monitor matters only with save_best_only: only then must its direction be known
        super().__init__(monitor, mode, required=bool(save_best_only))
        self.save_best_only = bool(save_best_only)
        self.save_weights_only = bool(save_weights_only)
        self.save_freq = save_freq
        self.initial_value_threshold = None if initial_value_threshold is None else float(initial_value_threshold)
        self.verbose = verbose
        self.best: float | None = self.initial_value_threshold
        self.last_filepath: str | None = None
        self._per_epoch: int | None = None  # optimizer steps per epoch, for {batch}
        self._epoch_first_step = 0  # the global step before the epoch's first step

    def reset(self) -> None:
        self.best = self.initial_value_threshold

    # -- monitoring points ----------------------------------------------------------------------
    def epoch_done(self, record: dict, args, state, control, **kwargs):
        """Each epoch is saved once its record is complete (the safety net at train end too)."""
        if self.save_freq == "epoch":
            self._save(record, state, kwargs)
        return None

    def evaluation_done(self, metrics: dict, args, state, control, **kwargs):
        """Nothing: an epoch-end evaluation completes the epoch's record, saved by `epoch_done`."""
        return None

    def missing_message(self, values: Mapping[str, Any]) -> str:
        return (f"ModelCheckpoint: can save the best model only with {self.monitor!r} available; saving the model "
                f"each time instead (as Keras). Values available: {available_names(values)}.")

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self._per_epoch = epoch_steps(args, state, train_dataloader, kwargs.get("steps_per_epoch"))
        self._epoch_first_step = state.global_step
        return super().on_train_begin(args, state, control, train_dataloader=train_dataloader, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        done = super().on_epoch_begin(args, state, control, **kwargs)  # may save the previous epoch
        epoch = state.epoch or 0.0
        into = round((epoch - math.floor(epoch)) * self._per_epoch) if self._per_epoch else 0  # resumed mid-epoch
        self._epoch_first_step = state.global_step - into
        return done

    def on_step_end(self, args, state, control, **kwargs):
        if self.save_freq != "epoch" and state.global_step % self.save_freq == 0:
            if control.should_log:  # this step logs: saved at its on_log, with the values it brings
                self._deferred = (state.global_step, kwargs)
                return
            self._save(dict(self._records.latest), state, kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        result = super().on_log(args, state, control, logs=logs, **kwargs)
        self._flush_deferred(state)
        return result

    def on_train_end(self, args, state, control, **kwargs):
        self._flush_deferred(state)
        return super().on_train_end(args, state, control, **kwargs)

    def _flush_deferred(self, state) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._save(dict(self._records.latest), state, deferred[1])

    _deferred: tuple | None = None  # (step, event keywords) of a step save waiting for its log

    # -- saving ---------------------------------------------------------------------------------
    def _format(self, values: dict, epoch: int, state) -> str:
        fields = {k: as_number(v) if as_number(v) is not None else v for k, v in values.items()}
        fields.update(epoch=epoch, step=state.global_step)
        if self.save_freq != "epoch":
            fields["batch"] = state.global_step - self._epoch_first_step
        try:
            return self.filepath.format(**fields)
        except KeyError as err:
            fix = ""
            if self.save_freq != "epoch":  # a save between epochs sees the values of the last logging step
                fix = (f"; a save every {self.save_freq} steps sees the values logged by then: pass "
                       f"`logging_strategy=\"steps\"` with `logging_steps` dividing {self.save_freq} to `fit` (the "
                       "training values are then logged at those steps), or save per epoch")
            raise KeyError(
                f"ModelCheckpoint: `filepath`={self.filepath!r} uses {{{err.args[0]}}}, which is not logged at "
                f"this point; available: {', '.join(sorted(fields))}{fix}"
            ) from None

    def _best_text(self) -> str:
        """The best value as Keras words it: before any value, inf (-inf for a value that goes up)."""
        best = self.best if self.best is not None else (-math.inf if self._direction == "max" else math.inf)
        return f"{best:.5f}"

    def _save(self, values: dict, state, kwargs: dict) -> None:
        epoch = epoch_index(state) + 1
        speak = bool(self.verbose) and state.is_world_process_zero
        where = f"Epoch {epoch}" if self.save_freq == "epoch" else f"Epoch {epoch}, step {state.global_step}"
        current = self._value(values) if self.save_best_only else None  # missing: warned once, saved
        if current is not None:
            direction = cast(str, self._direction)  # resolved at construction: save_best_only requires it
            if not improves(current, self.best, direction):
                if speak:
                    print(f"{where}: {self.monitor} did not improve from {self._best_text()}", flush=True)
                return
            previous, self.best = self._best_text(), current
        path = self._format(values, epoch, state)
        if speak:
            if current is not None:
                print(f"{where}: {self.monitor} improved from {previous} to {current:.5f}, saving model to {path}",
                      flush=True)
            else:
                print(f"{where}: saving model to {path}", flush=True)
        if state.is_world_process_zero:
            self._write(path, kwargs.get("model"), kwargs.get("optimizer"), kwargs.get("lr_scheduler"))
        self.last_filepath = path

    def _write(self, path: str, model: Any, optimizer: Any = None, scheduler: Any = None) -> None:
        if model is None:
            raise RuntimeError("ModelCheckpoint: the event carried no `model` to save")
        if "://" not in path and os.path.isdir(path):  # a URL (s3://...) is one object, written whole
            raise IsADirectoryError(f"ModelCheckpoint: `filepath` gives {path!r}, an existing directory; pass a file "
                                    f"name, e.g. {os.path.join(path, 'model.pt')!r}")
        if self.save_weights_only:
            atomic_torch_save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
        else:
            from fitkit.engine.checkpoint.model_file import write_model_file  # the format of Model.save / Model.load

            write_model_file(path, model, optimizer=optimizer, scheduler=scheduler)  # the whole model, as Keras'

    # -- checkpoint state ---------------------------------------------------------------------------
    def state(self) -> dict:
        """The best value so far, as a JSON-able dict."""
        return {"best": self.best}

    def load_state(self, state: dict) -> None:
        """Restore from `state()`; the next `fit` continues from it instead of resetting."""
        best = state.get("best")
        self.best = None if best is None else float(best)
        self._mark_restored()

    def __repr__(self) -> str:
        return (f"ModelCheckpoint(filepath={self.filepath!r}, monitor={self.monitor!r}, "
                f"save_best_only={self.save_best_only}, save_freq={self.save_freq!r})")


def _field_names(filepath: str) -> set[str]:
    """The names `filepath` formats (`{epoch:02d}` -> "epoch"); a malformed one is a ValueError."""
    try:
        parsed = list(string.Formatter().parse(filepath))
    except ValueError as err:
        raise ValueError(f"ModelCheckpoint: `filepath`={filepath!r} is not a valid format string ({err}); "
                         "write fields as {epoch:02d} and a literal brace as {{ or }}") from None
    return {name.split(".")[0].split("[")[0] for _, name, _, _ in parsed if name}
