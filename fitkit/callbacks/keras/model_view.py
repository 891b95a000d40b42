"""What a Keras-style callback sees as `self.model`: the fitkit `Model`, with Keras'
`optimizer.learning_rate`.

    lr = float(self.model.optimizer.learning_rate)      # the first parameter group's rate
    self.model.optimizer.learning_rate = lr * 0.5       # every group's rate
    self.model.stop_training = True                     # ends fit after this epoch / step
    weights = self.model.get_weights(); self.model.set_weights(weights)
    self.model.history                                  # the run's History, during fit too

Everything else is the `Model`'s own attribute (`save`, `save_weights`, `evaluate`, `predict`,
`module`, ...); `isinstance(self.model, fitkit.Model)` holds.
"""

from __future__ import annotations

import math
from typing import Any

from fitkit.callbacks._monitor import set_learning_rates


class OptimizerView:
    """The run's optimizer with Keras' `learning_rate` (and `lr`) attribute; anything else is
    the optimizer's own."""

    def __init__(self, optimizer: Any, handler: Any) -> None:
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_handler", handler)

    @property
    def learning_rate(self) -> float:
        groups = self._optimizer.param_groups
        return float(groups[0]["lr"]) if groups else math.nan

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        try:
            rate = float(value)
        except (TypeError, ValueError):
            rate = math.nan
        if isinstance(value, bool) or not math.isfinite(rate) or rate < 0:
            raise ValueError(f"`optimizer.learning_rate`={value!r} is invalid: assign a finite number >= 0")
        scheduler = getattr(self._handler, "lr_scheduler", None)
        set_learning_rates(self._optimizer, scheduler, lambda _i, _old: rate)

    lr = learning_rate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("learning_rate", "lr"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def __repr__(self) -> str:
        return f"OptimizerView({self._optimizer!r})"


class ModelView:
    """A fitkit `Model` as a Keras callback's `self.model` (see the module's docstring)."""

    def __init__(self, model: Any, handler: Any) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_handler", handler)

    @property  # type: ignore[misc]  # read-only on purpose: the view poses as its model's class
    def __class__(self) -> type:  # isinstance(view, Model) holds
        return type(self._model)

    @property
    def optimizer(self) -> Any:
        optimizer = getattr(self._handler, "optimizer", None) or self._model.optimizer
        return None if optimizer is None else OptimizerView(optimizer, self._handler)

    @property
    def history(self) -> Any:
        """The run's `History` while `fit` runs (as Keras sets `model.history`), else the last one."""
        for cb in getattr(self._handler, "callbacks", ()):
            if type(cb).__name__ == "History" and type(cb).__module__.startswith("fitkit"):
                return cb
        return self._model.history

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._model, name, value)

    def __eq__(self, other: Any) -> bool:
        return other is self or other is self._model

    def __hash__(self) -> int:
        return hash(self._model)

    def __repr__(self) -> str:
        return repr(self._model)
