"""Keras' `train_on_batch`, `test_on_batch` and `predict_on_batch`: one batch through the
compiled model, no callbacks, no data pipeline.

    logs = on_batch.train(runtime, module, config, args, overrides, x, y)   # {"loss": ..., "accuracy": ...}

The loss and metrics are those of the batch as it went in (before the update), as Keras reports
them; the optimizer, its state and the Fabric are the model's (kept across calls and fits).
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.adapters.metrics import MetricSet
from fitkit.engine.batch import Batch
from fitkit.engine.checks import keeps_float64
from fitkit.engine.data import adapt, class_weight_table
from fitkit.engine.overrides import StepOverrides, StepTools, as_data, step_values
from fitkit.engine.step import Stepper


def _batch(runtime: Any, module: torch.nn.Module, x: Any, y: Any, sample_weight: Any,
           class_weight: dict | None) -> Batch:
    """The whole of `x` (and `y`, weights) as one batch on the run's device."""
    source, _ = adapt(x, y, sample_weight, batch_size=1 << 62, shuffle=False, name="x",
                      cast_float64=not keeps_float64(module))
    if class_weight is not None:
        source.class_weight = class_weight_table(class_weight, torch.device("cpu"))
    if runtime.fabric.device.type != "cpu":
        source.to(runtime.fabric.device)
    return next(iter(source.batches(0)))


def _stepper(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides,
             optimizer: Any) -> Stepper:
    _, wrapped = runtime.setup(module, args)
    return Stepper(runtime.fabric, wrapped, optimizer, config.loss_fn if config else None, overrides.compute_loss)


def _logs(metric_specs: list, loss: torch.Tensor | None, out: Any, batch: Batch) -> dict[str, float]:
    logs: dict[str, float] = {}
    if loss is not None:
        logs["loss"] = float(loss.detach())
    if metric_specs and out is not None and batch.target is not None:
        metrics = MetricSet(metric_specs)
        metrics.update(out, batch.target)
        logs.update(metrics.compute())
    return logs


def train(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides, x: Any,
          y: Any = None, sample_weight: Any = None, class_weight: dict | None = None) -> dict[str, float]:
    """One optimizer step on `(x, y)`; the batch's loss and metrics (computed before the step)."""
    runtime.launch(args)
    runtime.setup(module, args)
    optimizer = runtime.optimizer_for(config.optimizer, args)
    stepper = _stepper(runtime, module, config, args, overrides, optimizer)
    batch = _batch(runtime, module, x, y, sample_weight, class_weight)
    stepper.train_mode(True)
    if overrides.train_step is not None:
        def apply() -> None:
            stepper.clip(args.max_grad_norm)
            stepper.step()

        tools = runtime.tools = StepTools(stepper, lambda event, **kwargs: None, apply)
        try:
            with tools.micro_batch(1, True):
                values = step_values(overrides.train_step(as_data(batch)), "train_step")
        finally:
            runtime.tools = None
        return {name: float(value) for name, value in values.items()}
    loss, out = stepper.forward_backward(batch, 1, last=True)
    stepper.clip(args.max_grad_norm)
    stepper.step()
    stepper.zero_grad()
    return _logs(config.metrics, loss, out, batch)


def test(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides, x: Any,
         y: Any = None, sample_weight: Any = None) -> dict[str, float]:
    """The loss and metrics of `(x, y)`, in evaluation mode, nothing updated."""
    runtime.launch(args)
    stepper = _stepper(runtime, module, config, args, overrides, runtime.optimizer)
    batch = _batch(runtime, module, x, y, sample_weight, None)
    with stepper.inference():
        if overrides.test_step is not None:
            runtime.tools = StepTools(stepper, lambda event, **kwargs: None, None)
            try:
                values = step_values(overrides.test_step(as_data(batch)), "test_step")
            finally:
                runtime.tools = None
            return {name: float(value) for name, value in values.items()}
        loss, out = stepper.forward(batch)
    return _logs(config.metrics if config else [], loss, out, batch)


def predict(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides,
            x: Any) -> Any:
    """The outputs for `x` (one batch), on CPU."""
    from fitkit.tensors import to_cpu

    runtime.launch(args)
    stepper = _stepper(runtime, module, config, args, overrides, runtime.optimizer)
    batch = _batch(runtime, module, x, None, None, None)
    with stepper.inference():
        if overrides.predict_step is not None:
            runtime.tools = StepTools(stepper, lambda event, **kwargs: None, None)
            try:
                out = overrides.predict_step(as_data(batch))
            finally:
                runtime.tools = None
        else:
            _, out = stepper.forward(batch, with_loss=False)
    return to_cpu(out)
