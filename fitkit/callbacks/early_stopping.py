"""`EarlyStopping`: stop training when a monitored value has stopped improving (Keras)."""

from __future__ import annotations

from typing import Any

from fitkit.callbacks._monitor import MonitorCallback, epoch_index, improves


class EarlyStopping(MonitorCallback):
    """Stop training when `monitor` has not improved for `patience` evaluations.

    The value is checked at each evaluation during `fit` (`patience` counts evaluations; with
    the default `eval_strategy="epoch"` that is one per epoch). Without validation data the
    check runs once per epoch on the training logs, so `monitor="loss"` works there too.

    Args:
        monitor: the logged value to watch (`"val_loss"`, `"val_accuracy"`, `"loss"`, ...).
        min_delta: a change smaller than this does not count as an improvement.
        patience: evaluations without improvement after which training stops.
        mode: `"min"`, `"max"`, or `"auto"` (from the name: `loss`/`error`/`mae`/`mse` go down,
            `accuracy`/`f1`/`precision`/`recall`/`auroc` go up, a torchmetrics class tells its
            own; anything else raises `ValueError` asking for `mode`).
        baseline: a value to reach; training stops if the model has not beaten it within
            `patience` evaluations (the wait counter only restarts on values that beat both the
            best so far and the baseline).
        restore_best_weights: at the end of training, load the weights of the best evaluation
            (a CPU copy is kept), whether or not training stopped early.
        start_from_epoch: evaluations during the first `start_from_epoch` epochs are ignored
            (a warm-up in which the model is not expected to improve).
        verbose: 1 prints when training stops and when weights are restored.

    Stopping sets `control.should_training_stop`; the current epoch finishes its end-of-epoch
    work and `on_train_end` fires. With `mode="auto"`, a compiled metric's own
    `higher_is_better` (the run's `metric_directions`) decides over the name. The counters
    reset at each `fit`. `state()` / `load_state()` give and take a JSON-able dict for
    checkpoints.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import EarlyStopping

        x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
        model = Model(torch.nn.Linear(8, 2)).compile("adam", "cross_entropy", ["accuracy"])
        stop = EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True)
        history = model.fit(x, y, epochs=100, validation_split=0.2, callbacks=[stop], verbose=0)
        print(len(history.epoch), stop.stopped_epoch, stop.best_epoch)
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        min_delta: float = 0.0,
        patience: int = 0,
        mode: str = "auto",
        baseline: float | None = None,
        restore_best_weights: bool = False,
        start_from_epoch: int = 0,
        verbose: int = 0,
    ) -> None:
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 0:
            raise ValueError(f"EarlyStopping: `patience`={patience!r} is invalid; pass an integer >= 0")
        if not isinstance(start_from_epoch, int) or isinstance(start_from_epoch, bool) or start_from_epoch < 0:
            raise ValueError(f"EarlyStopping: `start_from_epoch`={start_from_epoch!r} is invalid; pass an integer >= 0")
        super().__init__(monitor, mode)
        self.min_delta = abs(float(min_delta))
        self.patience = patience
        self.baseline = None if baseline is None else float(baseline)
        self.restore_best_weights = bool(restore_best_weights)
        self.start_from_epoch = start_from_epoch
        self.verbose = verbose
        self.best_weights: dict[str, Any] | None = None
        self.reset()

    def reset(self) -> None:
        self.wait = 0
        self.best: float | None = None
        self.best_epoch = 0
        self.stopped_epoch = 0
        self.stopped = False
        self.best_weights = None

    # -- checking -------------------------------------------------------------------------
    def _snapshot(self, model) -> None:
        if model is None:
            return
        self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def check(self, current, args, state, control, model=None, **kwargs):
        epoch = epoch_index(state)
        if epoch < self.start_from_epoch:
            return None
        if self.restore_best_weights and self.best_weights is None:
            self._snapshot(model)  # something to restore even if no value ever improves (all NaN)
        self.wait += 1
        if improves(current, self.best, self._direction, self.min_delta):
            self.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self._snapshot(model)
            if self.baseline is None or improves(current, self.baseline, self._direction, self.min_delta):
                self.wait = 0
            return None
        if self.wait >= self.patience:
            self.stopped_epoch = epoch
            self.stopped = True
            control.should_training_stop = True
            return control
        return None

    def on_train_end(self, args, state, control, model=None, **kwargs):
        super().on_train_end(args, state, control, model=model, **kwargs)
        speak = self.verbose and state.is_world_process_zero
        if self.stopped and speak:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping", flush=True)
        if self.restore_best_weights and self.best_weights is not None and model is not None:
            if speak:
                print(f"Restoring model weights from the end of the best epoch: {self.best_epoch + 1}.", flush=True)
            model.load_state_dict(self.best_weights)
        return None

    # -- checkpoint state -------------------------------------------------------------------------
    def state(self) -> dict:
        """The counters as a JSON-able dict (the weights copy is not included)."""
        return {"wait": self.wait, "best": self.best, "best_epoch": self.best_epoch,
                "stopped_epoch": self.stopped_epoch}

    def load_state(self, state: dict) -> None:
        """Restore the counters from `state()`; the next `fit` continues from them instead of resetting."""
        self.wait = int(state.get("wait", 0))
        best = state.get("best")
        self.best = None if best is None else float(best)
        self.best_epoch = int(state.get("best_epoch", 0))
        self.stopped_epoch = int(state.get("stopped_epoch", 0))
        self.stopped = False
        self._mark_restored()

    def __repr__(self) -> str:
        return (f"EarlyStopping(monitor={self.monitor!r}, patience={self.patience}, mode={self.mode!r}, "
                f"min_delta={self.min_delta}, restore_best_weights={self.restore_best_weights})")
