"""`Callback`: Keras 3's callback API, run on fitkit's event set.

A callback written for Keras moves over with its import changed (a subclass of
`keras.callbacks.Callback` runs unchanged too)::

    from fitkit.callbacks import Callback

    class LossPrinter(Callback):
        def on_train_batch_end(self, batch, logs=None):
            print(f"batch {batch}: running loss {logs['loss']:.4f}")

        def on_epoch_end(self, epoch, logs=None):
            print(f"epoch {epoch}: {logs}")
            if logs["loss"] < 0.01:
                self.model.stop_training = True

    model.fit(x, y, epochs=10, callbacks=[LossPrinter()])

`self.model` is the fitkit `Model` (its `optimizer.learning_rate` reads and assigns the rate of
every parameter group), `self.params` holds `epochs`, `steps` (optimizer steps per epoch) and
`verbose`. Each method has its Keras 3 meaning and is called positionally as Keras calls it;
`fitkit.callbacks.keras.adapter.KerasAdapter` runs them at the `TrainerCallback` events (the table is
in docs/callbacks.md, "Keras-style callbacks"). A `Callback` is its own type, not a `TrainerCallback`.
"""

from __future__ import annotations

from typing import Any

from fitkit.events.base_defaults import no_op
from fitkit.events.state import Order


class Callback:
    """Keras 3's `keras.callbacks.Callback`: override any of its methods.

    `on_train_begin/end(logs=None)`, `on_epoch_begin/end(epoch, logs=None)` (0-based `epoch`;
    the end's logs hold the epoch's training values and, after validation, the `val_` ones),
    `on_train_batch_begin/end(batch, logs=None)` (aliases `on_batch_begin/end`; `batch` is the
    optimizer step's index within the epoch, the end's logs the running averages of the loss and
    metrics so far in the epoch, as floats), `on_test_begin/end(logs=None)`,
    `on_test_batch_begin/end(batch, logs=None)`, `on_predict_begin/end(logs=None)`,
    `on_predict_batch_begin/end(batch, logs=None)` (the end's logs: `{"outputs": ...}`, or a
    dict output's own items, as Keras).

    Running averages are read from the device once per batch, and only when some callback of the
    run overrides a batch-end method; a fit whose callbacks override none pays nothing for them.
    A subclass may also define `TrainerCallback` events that Keras has no name for (`on_log`,
    `on_step_end`, ...): they are called HF-style, `(args, state, control, **kwargs)`. Define
    `state()` / `load_state(state)` to have the callback's state saved in checkpoints; `order`
    places it among the other callbacks as a `TrainerCallback`'s does.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import Callback

        class Stopper(Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 1:
                    self.model.stop_training = True

        x, y = torch.randn(64, 4), torch.randn(64, 1)
        history = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse").fit(
            x, y, epochs=5, callbacks=[Stopper()], verbose=0)
        assert history.epoch == [0, 1]
    """

    order: int = Order.USER

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}
        self._model: Any = None

    def set_params(self, params: dict[str, Any]) -> None:
        self.params = params

    def set_model(self, model: Any) -> None:
        self._model = model

    @property
    def model(self) -> Any:
        """The fitkit `Model` being trained (None before the first event)."""
        return self.__dict__.get("_model")

    @no_op
    def on_train_begin(self, logs=None):
        """Called at the beginning of training."""

    @no_op
    def on_train_end(self, logs=None):
        """Called at the end of training; `logs` are the last epoch's."""

    @no_op
    def on_epoch_begin(self, epoch, logs=None):
        """Called at the beginning of epoch `epoch` (0-based)."""

    @no_op
    def on_epoch_end(self, epoch, logs=None):
        """Called after the epoch and its validation; `logs` hold `loss`, metrics and `val_` values."""

    @no_op  # a default as in Keras: a subclass that overrides neither this nor the alias costs nothing
    def on_train_batch_begin(self, batch, logs=None):
        """Called before each training batch (calls `on_batch_begin`)."""
        self.on_batch_begin(batch, logs)

    @no_op
    def on_train_batch_end(self, batch, logs=None):
        """Called after each training batch; `logs` hold the running averages (calls `on_batch_end`)."""
        self.on_batch_end(batch, logs)

    @no_op
    def on_batch_begin(self, batch, logs=None):
        """Alias of `on_train_batch_begin`."""

    @no_op
    def on_batch_end(self, batch, logs=None):
        """Alias of `on_train_batch_end`."""

    @no_op
    def on_test_begin(self, logs=None):
        """Called at the beginning of an evaluation (`evaluate`, or validation during `fit`)."""

    @no_op
    def on_test_end(self, logs=None):
        """Called at the end of an evaluation; `logs` hold its values, unprefixed."""

    @no_op
    def on_test_batch_begin(self, batch, logs=None):
        """Called before each evaluation batch."""

    @no_op
    def on_test_batch_end(self, batch, logs=None):
        """Called after each evaluation batch; `logs` hold the running averages."""

    @no_op
    def on_predict_begin(self, logs=None):
        """Called at the beginning of `predict`."""

    @no_op
    def on_predict_end(self, logs=None):
        """Called at the end of `predict`."""

    @no_op
    def on_predict_batch_begin(self, batch, logs=None):
        """Called before each prediction batch."""

    @no_op
    def on_predict_batch_end(self, batch, logs=None):
        """Called after each prediction batch; `logs["outputs"]` holds the batch's outputs (a dict
        output: `logs` holds its items, as Keras flattens it)."""
