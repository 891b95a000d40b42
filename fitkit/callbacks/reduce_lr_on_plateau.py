"""`ReduceLROnPlateau`: lower the learning rate when a monitored value stops improving (Keras)."""

from __future__ import annotations

from fitkit.callbacks._monitor import MonitorCallback, epoch_index, improves, rate_text, set_learning_rates


class ReduceLROnPlateau(MonitorCallback):
    """Multiply the learning rate by `factor` after `patience` evaluations without improvement.

    Checked at each evaluation during `fit` (once per epoch on the training logs when there
    is no validation data), like `EarlyStopping`. Every param group's `lr` is multiplied by
    `factor` (never below `min_lr`); when a step-wise scheduler drives the rate (fitkit's
    `"linear"` / `"cosine"` / warm-up schedules, or any scheduler with `base_lrs`) its base
    rates are scaled too, so the next scheduler step keeps the cut.

    Args:
        monitor: the logged value to watch.
        factor: the multiplier, in (0, 1).
        patience: evaluations without improvement before the rate is cut.
        mode: `"min"`, `"max"` or `"auto"` (from the name, as `EarlyStopping`).
        min_delta: the smallest change that counts as an improvement.
        cooldown: evaluations to wait after a cut before counting again.
        min_lr: the lowest rate.
        verbose: 1 prints each cut.

    The counters reset at each `fit`; `state()` / `load_state()` carry them in checkpoints.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import ReduceLROnPlateau

        x, y = torch.randn(256, 8), torch.randn(256, 1)
        model = Model(torch.nn.Linear(8, 1)).compile("sgd", "mse", learning_rate=0.1)
        plateau = ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2, min_lr=1e-4)
        history = model.fit(x, y, epochs=20, validation_split=0.25, callbacks=[plateau], verbose=0)
        print(history.history["learning_rate"])   # one rate per epoch, as in Keras
    """

    #: `History` and `CSVLogger` show `learning_rate` in runs with this callback.
    changes_learning_rate = True

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.1,
        patience: int = 10,
        mode: str = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        min_lr: float = 0.0,
        verbose: int = 0,
    ) -> None:
        if not 0.0 < float(factor) < 1.0:
            raise ValueError(f"ReduceLROnPlateau: `factor`={factor!r} is invalid; pass a number in (0, 1)")
        for name, value in (("patience", patience), ("cooldown", cooldown)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ReduceLROnPlateau: `{name}`={value!r} is invalid; pass an integer >= 0")
        if float(min_lr) < 0:
            raise ValueError(f"ReduceLROnPlateau: `min_lr`={min_lr!r} is invalid; pass a number >= 0")
        super().__init__(monitor, mode)
        self.factor = float(factor)
        self.patience = patience
        self.min_delta = abs(float(min_delta))
        self.cooldown = cooldown
        self.min_lr = float(min_lr)
        self.verbose = verbose
        self.reset()

    def reset(self) -> None:
        self.wait = 0
        self.cooldown_counter = 0
        self.best: float | None = None

    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def check(self, current, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if self.in_cooldown():
            self.cooldown_counter -= 1
            self.wait = 0
        if improves(current, self.best, self._direction, self.min_delta):
            self.best = current
            self.wait = 0
            return None
        if self.in_cooldown():
            return None
        self.wait += 1
        if self.wait < self.patience:
            return None

        def cut(_: int, lr: float) -> float:
            return max(lr * self.factor, self.min_lr) if lr > self.min_lr else lr

        changes = set_learning_rates(optimizer, lr_scheduler, cut)
        if any(new != old for old, new in changes):
            self.cooldown_counter = self.cooldown
            self.wait = 0
            if self.verbose and state.is_world_process_zero:
                rates = ", ".join(rate_text(new) for _, new in changes)
                print(f"Epoch {epoch_index(state) + 1}: ReduceLROnPlateau reducing learning rate to {rates}.",
                      flush=True)
        return None

    def state(self) -> dict:
        """The counters as a JSON-able dict (the rate itself lives in the optimizer's state)."""
        return {"wait": self.wait, "cooldown_counter": self.cooldown_counter, "best": self.best}

    def load_state(self, state: dict) -> None:
        """Restore from `state()`; the next `fit` continues from it instead of resetting."""
        self.wait = int(state.get("wait", 0))
        self.cooldown_counter = int(state.get("cooldown_counter", 0))
        best = state.get("best")
        self.best = None if best is None else float(best)
        self._mark_restored()

    def __repr__(self) -> str:
        return (f"ReduceLROnPlateau(monitor={self.monitor!r}, factor={self.factor}, patience={self.patience}, "
                f"min_lr={self.min_lr})")
