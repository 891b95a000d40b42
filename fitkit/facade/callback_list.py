"""The callbacks a `Model` keeps for every later call (`Model` inherits `CallbackOwner`).

    model.add_callback(EarlyStopping(patience=3))   # a class or an instance
    model.callbacks                                  # in firing order, DefaultFlowCallback first
    model.pop_callback(EarlyStopping)                # by class (the first) or instance
"""

from __future__ import annotations

from fitkit.events.handler import CallbackHandler, TrainerCallback


class CallbackOwner:
    """The callbacks list of a model, held by its `callback_handler`."""

    callback_handler: CallbackHandler

    @property
    def callbacks(self) -> list[TrainerCallback]:
        """The callbacks in firing order (`DefaultFlowCallback` first)."""
        return list(self.callback_handler.callbacks)

    def add_callback(self, callback: TrainerCallback | type) -> None:
        """Add a callback (a class or an instance) to every later fit / evaluate / predict."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type) -> TrainerCallback | None:
        """Remove and return a callback (by class: the first of that class), or None."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type) -> None:
        """Remove a callback (a class or an instance)."""
        self.callback_handler.remove_callback(callback)
