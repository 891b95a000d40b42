"""The steps of `fit`, `evaluate` and `predict` a `Model` subclass may override (Keras 3's
"customizing what happens in fit"): `compute_loss`, `train_step`, `test_step`, `predict_step`.

    import torch
    from fitkit import Model, unpack_data

    class WithPenalty(Model):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            loss = super().compute_loss(x, y, y_pred, sample_weight)
            return loss + 1e-3 * sum(p.square().sum() for p in self.module.parameters())

    class Clipped(Model):
        def train_step(self, data):
            x, y, _ = unpack_data(data)
            loss = torch.nn.functional.mse_loss(self.module(x), y)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return {"loss": loss, "scale": loss.detach().sqrt()}

An overridden step uses `self.module` (the module as the run set it up: under DDP its forward
syncs gradients), `self.backward(loss)`, `self.optimizer` and `self.call_event(name, **kwargs)`.
When a subclass overrides nothing, `fit` runs fitkit's own loop and none of this is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fitkit.common.options import LABEL_KEYS
from fitkit.engine.overrides import attribute_trackers
from fitkit.engine.step import model_loss
from fitkit.facade.members import ModelMembers

if TYPE_CHECKING:  # pragma: no cover
    pass


def unpack_data(data: Any) -> tuple[Any, Any, Any]:
    """`(x, y, sample_weight)` of a batch as a step receives it (Keras'
    `unpack_x_y_sample_weight`): `(x,)`, `(x, y)`, `(x, y, sample_weight)`, a dict (targets under
    "labels", weights under "sample_weight") or a lone `x`; what is missing is None."""
    if isinstance(data, dict):
        x = dict(data)
        weight = x.pop("sample_weight", None)
        y = next((x.pop(key) for key in LABEL_KEYS if key in x), None)
        return x, y, weight
    if isinstance(data, (tuple, list)):
        if len(data) == 1:
            return data[0], None, None
        if len(data) == 2:
            return data[0], data[1], None
        if len(data) == 3:
            return data[0], data[1], data[2]
        raise ValueError(f"a batch must be (x,), (x, y) or (x, y, sample_weight); got {len(data)} items")
    return data, None, None


def call_module(module: torch.nn.Module, x: Any, **kwargs: Any) -> Any:
    """`module(x)`: keywords for a dict `x`, positional arguments for a tuple of inputs."""
    if isinstance(x, dict):
        return module(**x, **kwargs)
    if isinstance(x, tuple):
        return module(*x, **kwargs)
    return module(x, **kwargs)


class Steps(ModelMembers):
    """The default steps, written with the public pieces an override uses; `Model` inherits
    them. Overriding one replaces fitkit's own step for that call (see docs/customizing.md)."""

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of `loss` as the run does it (mixed precision, DDP, FSDP, DeepSpeed; scaled
        for gradient accumulation): for an overridden `train_step`."""
        self._step_tools("backward").backward(loss)

    def call_event(self, event: str, **kwargs: Any) -> None:
        """Fire `event` (e.g. a custom "verify_train_batch") on every callback that has a method
        of that name, as `method(args, state, control, **kwargs)`: from an overridden step."""
        self._step_tools("call_event").call_event(event, **kwargs)

    def _step_tools(self, what: str) -> Any:
        tools = self.runtime.tools
        if tools is None:
            raise RuntimeError(f"`{what}` is for an overridden train_step / test_step / predict_step while fit, "
                               "evaluate or predict runs it")
        return tools

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None) -> torch.Tensor:
        """The loss of one batch: the compiled loss of `y_pred` against `y` (weighted by
        `sample_weight`), or the loss the module returned itself when compiled with `loss=None`.
        Keywords as in Keras 3: `self.compute_loss(y=y, y_pred=y_pred)`."""
        loss_fn = self.config.loss_fn if self.config is not None else None
        loss = model_loss(y_pred) if loss_fn is None else loss_fn(y_pred, y, sample_weight)
        tools = self.runtime.tools
        if tools is not None:
            tools.last_loss = loss  # `compute_metrics` reports it, as Keras' loss tracker
        return loss

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> dict[str, Any]:
        """Update the compiled metrics with one batch and return `{"loss": ..., name: value}`:
        the loss `compute_loss` computed in this step and each metric's value so far (device
        tensors). What a custom `train_step` / `test_step` returns (Keras 3)::

            def train_step(self, data):
                x, y = data
                y_pred = self(x)
                loss = self.compute_loss(y=y, y_pred=y_pred)
                self.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()
                return self.compute_metrics(x, y, y_pred)

        The loop logs the compiled metrics exactly over the epoch (or evaluation), not as a mean
        of these per-step values; `sample_weight` weighs the `weighted_metrics` only (Keras)."""
        tools = self._step_tools("compute_metrics")
        metrics = tools.compiled_metrics(self.config.metrics if self.config is not None else [])
        if metrics and y is not None:
            metrics.update(y_pred, y, sample_weight)
            tools.reported = True
        values: dict[str, Any] = {} if tools.last_loss is None else {"loss": tools.last_loss}
        values.update(metrics.results() if metrics else {})
        return values

    @property
    def metrics(self) -> list[StepMetric]:
        """Keras 3's `model.metrics` inside a custom step: the loss tracker (`name == "loss"`),
        then one view per compiled metric, each with `name`, `update_state`, `result()` and
        `reset_state()`, then the Keras metric objects the model holds as attributes (Keras
        tracks them: `self.loss_tracker = keras.metrics.Mean(name="loss")`, reset at each epoch
        and evaluation). Empty outside a call of fit, evaluate or the `*_on_batch` methods."""
        tools = self.runtime.tools
        if tools is None:
            return []
        metrics = tools.compiled_metrics(self.config.metrics if self.config is not None else [])
        return [StepMetric(tools, None), *(StepMetric(tools, i) for i in range(len(metrics.base_names))),
                *attribute_trackers(self)]

    def train_step(self, data: Any) -> dict[str, Any]:
        """One optimization step on one batch; returns the loss and the compiled metrics."""
        x, y, sample_weight = unpack_data(data)
        y_pred = self._forward(x, y)
        loss = self.compute_loss(x, y, y_pred, sample_weight)
        self.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def test_step(self, data: Any) -> dict[str, Any]:
        """The loss and compiled metrics of one evaluation batch (empty without targets)."""
        x, y, sample_weight = unpack_data(data)
        y_pred = self._forward(x, y)
        if y is None and self.config is not None and self.config.loss_fn is not None:
            return {}
        self.compute_loss(x, y, y_pred, sample_weight)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def predict_step(self, data: Any) -> Any:
        """The module's outputs for one batch (what `predict` concatenates)."""
        x, _, _ = unpack_data(data)
        return call_module(self.module, x)

    def _forward(self, x: Any, y: Any) -> Any:
        if self.config is not None and self.config.loss_fn is None and y is not None:
            # a module that computes its loss from the targets, called as fitkit's own step does
            if isinstance(x, dict):
                return self.module(**x, labels=y)
            return self.module(*(x if isinstance(x, tuple) else (x,)), y)
        return call_module(self.module, x)


class StepMetric:
    """One entry of `Model.metrics` in a custom step (Keras' metric interface): the loss
    tracker (`index` None: `update_state(loss)` records the step's loss) or a compiled metric."""

    kept_by_loop = True  # the loop resets and averages it itself: not a user's tracker

    def __init__(self, tools: Any, index: int | None) -> None:
        self.tools, self.index = tools, index
        self.name = "loss" if index is None else tools.metrics.base_names[index]

    def update_state(self, *args: Any, sample_weight: Any = None) -> None:
        """`update_state(loss)` for the loss tracker (Keras' `Mean`: each step's loss counts
        once, whatever its batch size, unless `sample_weight` weighs it), `update_state(y, y_pred)`
        for a metric."""
        if self.index is None:  # Keras' loss tracker is a `Mean`: each call weighs 1 unless weighted
            self.tools.last_loss = args[0]
            self.tools.loss_weight = 1.0 if sample_weight is None else float(torch.as_tensor(sample_weight).sum())
            return
        y, y_pred = args[:2]
        self.tools.metrics.update_one(self.index, y_pred, y, sample_weight)
        self.tools.reported = True

    def result(self) -> Any:
        """The loss of this step (the loop averages it per epoch), or the metric's value so far."""
        if self.index is None:
            return self.tools.last_loss
        return self.tools.metrics.result_of(self.index)

    def reset_state(self) -> None:
        """Nothing to do: the loop resets the compiled metrics at each epoch and evaluation."""

    def __repr__(self) -> str:
        return f"<StepMetric {self.name}>"
