"""Keras' `train_on_batch`, `test_on_batch` and `predict_on_batch`: one batch through the
compiled model, no callbacks, no data pipeline.

    logs = on_batch.train(runtime, module, config, args, overrides, x, y)   # {"loss": ..., "accuracy": ...}

The loss and metrics are those of the batch as it went in (before the update), as Keras reports
them: the trackers a custom step keeps (`model.metrics`) are reset at each call, as Keras 3 resets
them; the optimizer, its state and the Fabric are the model's (kept across calls and fits).
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.adapters.metrics import MetricSet
from fitkit.common.tensors import map_tensors
from fitkit.engine.checks import keeps_float64
from fitkit.engine.data.adapt import adapt
from fitkit.engine.data.batch import Batch, as_data
from fitkit.engine.data.keras_data import class_weight_table
from fitkit.engine.data.loader_source import LoaderSource
from fitkit.engine.data.sources import TensorSource
from fitkit.engine.overrides import StepOverrides, StepTools, step_values
from fitkit.engine.step import Stepper


def _batch(runtime: Any, module: torch.nn.Module, x: Any, y: Any, sample_weight: Any,
           class_weight: dict | None) -> Batch:
    """The whole of `x` (and `y`, weights) as one batch on the run's device."""
    if (type(x) is torch.Tensor and (y is None or type(y) is torch.Tensor) and sample_weight is None
            and class_weight is None and x.dim() and x.shape[0] and (y is None or (y.dim() and len(y) == len(x)))
            and x.dtype is not torch.float64 and (y is None or y.dtype is not torch.float64)
            and x.device == runtime.fabric.device):
        return Batch((x,), y, None, x.shape[0])  # what `adapt` would make of it, without its checks' cost
    source, _ = adapt(x, y, sample_weight, batch_size=1 << 62, shuffle=False, name="x",
                      cast_float64=not keeps_float64(module))
    assert isinstance(source, (TensorSource, LoaderSource))  # the sources `adapt` makes
    if class_weight is not None:
        source.class_weight = class_weight_table(class_weight, torch.device("cpu"))
    device = runtime.fabric.device
    if isinstance(source, TensorSource):
        if device.type != "cpu":
            source.to(device)
        return next(iter(source.batches(0)))
    batch = next(iter(source.batches(0)))  # a loader's (or iterable's) first batch, as it yields it
    return batch if device.type == "cpu" else _on_device(batch, device)


def _on_device(batch: Batch, device: torch.device) -> Batch:
    """`batch` with its tensors moved to `device` (what Fabric's loader wrapper does in `fit`)."""
    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    return Batch(map_tensors(move, batch.inputs), map_tensors(move, batch.target),
                 map_tensors(move, batch.sample_weight), batch.size)


def _stepper(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides,
             train: bool = False) -> Stepper:
    """The `Stepper` of batch calls (with the optimizer built when `train`). It is kept on the
    runtime while the module, the arguments, the loss and the set-up objects stay the same, so a
    loop of `train_on_batch` pays the set-up once."""
    loss_fn = config.loss_fn if config else None
    kept = runtime.batch_stepper
    if (kept is not None and kept.key_module is module and kept.key_args is args and kept.loss is loss_fn
            and kept.compute_loss == overrides.compute_loss and kept.module is runtime.wrapped
            and (kept.optimizer is runtime.optimizer and (kept.optimizer is not None or not train))):
        if train and args.learning_rate is not None:  # as `Runtime.optimizer_for` does on every call
            for group in kept.optimizer.param_groups:
                group["lr"] = args.learning_rate
        return kept
    runtime.launch(args)
    _, wrapped = runtime.setup(module, args)
    optimizer = runtime.optimizer_for(config.optimizer, args) if train else runtime.optimizer
    stepper = Stepper(runtime.fabric, wrapped, optimizer, loss_fn, overrides.compute_loss)
    stepper.key_module, stepper.key_args = module, args
    runtime.keep_batch_stepper(stepper)
    return stepper


def _logs(metric_specs: list, loss: torch.Tensor | None, out: Any, batch: Batch) -> dict[str, float]:
    logs: dict[str, float] = {}
    if loss is not None:
        logs["loss"] = float(loss.detach())
    if metric_specs and out is not None and batch.target is not None:
        metrics = MetricSet(metric_specs)
        metrics.update(out, batch.target, batch.sample_weight)
        logs.update(metrics.compute())
    return logs


def _no_event(event: str, **kwargs: Any) -> None:
    """A call on one batch has no callbacks: the events an overridden step fires go nowhere."""


def train(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides, x: Any,
          y: Any = None, sample_weight: Any = None, class_weight: dict | None = None) -> dict[str, float]:
    """One optimizer step on `(x, y)`; the batch's loss and metrics (computed before the step)."""
    stepper = _stepper(runtime, module, config, args, overrides, train=True)
    batch = _batch(runtime, module, x, y, sample_weight, class_weight)
    if overrides.metrics is not None:  # Keras resets every metric of `model.metrics` on each call
        overrides.reset_trackers()
    stepper.train_mode(True)
    if overrides.train_step is not None:
        def apply() -> None:
            stepper.clip(args.max_grad_norm)
            stepper.step()

        tools = StepTools(stepper, _no_event, apply)
        with runtime.using(tools), tools.micro_batch(1, True):
            values = step_values(overrides.train_step(as_data(batch)), "train_step")
        return {name: float(value) for name, value in values.items()}
    loss, out = stepper.forward_backward(batch, 1, last=True)
    stepper.clip(args.max_grad_norm)
    stepper.step()
    stepper.zero_grad()
    return _logs(config.logged_metrics, loss, out, batch)


def test(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides, x: Any,
         y: Any = None, sample_weight: Any = None) -> dict[str, float]:
    """The loss and metrics of `(x, y)`, in evaluation mode, nothing updated."""
    stepper = _stepper(runtime, module, config, args, overrides)
    batch = _batch(runtime, module, x, y, sample_weight, None)
    if overrides.metrics is not None:  # as `train`
        overrides.reset_trackers()
    with stepper.inference():
        if overrides.test_step is not None:
            with runtime.using(StepTools(stepper, _no_event, None)):
                values = step_values(overrides.test_step(as_data(batch)), "test_step")
            return {name: float(value) for name, value in values.items()}
        loss, out = stepper.forward(batch)
    return _logs(config.logged_metrics if config else [], loss, out, batch)


def predict(runtime: Any, module: torch.nn.Module, config: Any, args: Any, overrides: StepOverrides,
            x: Any) -> Any:
    """The outputs for `x` (one batch), on CPU."""
    from fitkit.common.tensors import to_cpu

    stepper = _stepper(runtime, module, config, args, overrides)
    batch = _batch(runtime, module, x, None, None, None)
    with stepper.inference():
        if overrides.predict_step is not None:
            with runtime.using(StepTools(stepper, _no_event, None)):
                out = overrides.predict_step(as_data(batch))
        else:
            _, out = stepper.forward(batch, with_loss=False)
    return to_cpu(out)
