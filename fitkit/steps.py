"""The steps of `fit`, `evaluate` and `predict` a `Model` subclass may override (Keras 3's
"customizing what happens in fit"): `compute_loss`, `train_step`, `test_step`, `predict_step`.

    import torch
    from fitkit import Model, unpack_data

    class WithPenalty(Model):
        def compute_loss(self, x, y, y_pred, sample_weight=None):
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

from typing import Any

import torch

from fitkit.adapters.metrics import primary_output
from fitkit.engine.batch import LABEL_KEYS
from fitkit.engine.step import model_loss


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


class Steps:
    """The default steps, written with the public pieces an override uses; `Model` inherits
    them. Overriding one replaces fitkit's own step for that call (see DESIGN.md section 3)."""

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

    def compute_loss(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> torch.Tensor:
        """The loss of one batch: the compiled loss of `y_pred` against `y` (weighted by
        `sample_weight`), or the loss the module returned itself when compiled with `loss=None`."""
        loss_fn = self.config.loss_fn if self.config is not None else None
        if loss_fn is None:
            return model_loss(y_pred)
        return loss_fn(primary_output(y_pred), y, sample_weight)

    def train_step(self, data: Any) -> dict[str, Any]:
        """One optimization step on one batch; returns the values to log (`{"loss": loss}`)."""
        x, y, sample_weight = unpack_data(data)
        y_pred = self._forward(x, y)
        loss = self.compute_loss(x, y, y_pred, sample_weight)
        self.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": loss}

    def test_step(self, data: Any) -> dict[str, Any]:
        """The values of one evaluation batch (`{"loss": loss}`; empty without targets)."""
        x, y, sample_weight = unpack_data(data)
        y_pred = self._forward(x, y)
        if y is None and self.config is not None and self.config.loss_fn is not None:
            return {}
        return {"loss": self.compute_loss(x, y, y_pred, sample_weight)}

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
