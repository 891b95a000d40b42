"""Evaluation and prediction: exact averages over every sample (the loss weighted by samples,
metrics over all of them, HF's `compute_metrics` over the gathered predictions), and outputs in
input order, also under several processes. `Loop` inherits it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from fitkit.adapters.metrics import MetricSet
from fitkit.common.tensors import map_tensors, tensors_of, to_cpu
from fitkit.engine.data.batch import Batch, as_data
from fitkit.engine.data.prefetch import stopping
from fitkit.engine.data.sources import DataSource
from fitkit.engine.eval_prediction import PredictionCollector
from fitkit.engine.overrides import StepMeans

if TYPE_CHECKING:  # pragma: no cover - the members of `Loop` these methods use
    from fitkit.config.arguments import TrainingArguments
    from fitkit.engine.batch_logs import RunningLogs
    from fitkit.engine.overrides import StepOverrides, StepTools
    from fitkit.engine.step import Stepper
    from fitkit.events.handler import CallbackHandler
    from fitkit.events.state import TrainerControl, TrainerState


class Inference:
    """`evaluate` and `predict` over a `DataSource`, firing the prediction events."""

    if TYPE_CHECKING:  # pragma: no cover
        args: TrainingArguments
        state: TrainerState
        control: TrainerControl
        handler: CallbackHandler
        fabric: Any
        stepper: Stepper
        metric_specs: list
        val_metrics: MetricSet
        overrides: StepOverrides
        tools: StepTools | None
        running_logs: RunningLogs
        _carry: dict[str, bool]

        def call_event(self, event: str, **kwargs: Any) -> None: ...

    def evaluate(self, source: DataSource, prefix: str = "", steps: int | None = None) -> dict[str, float]:
        """Exact averages over `source`: loss weighted by samples, metrics over all of them."""
        if self.overrides.test_step is not None:
            return self._own_evaluate(source, prefix, steps)
        fabric, stepper, carry = self.fabric, self.stepper, self._carry["on_prediction_step"]
        metrics = self.val_metrics if prefix else MetricSet(self.metric_specs)
        metrics.reset()
        collector = PredictionCollector.of(self.args)  # HF's compute_metrics, when set
        total = torch.zeros((), device=fabric.device, dtype=torch.float64)
        count, with_loss, measured = 0, False, bool(metrics)
        self.call_event("on_evaluate_begin")
        begins, steps_end = self._listened("on_prediction_step_begin"), self._listened("on_prediction_step")
        with stepper.inference(), stopping(source):
            for batch in first(source.batches(0), steps):
                if begins:
                    self.call_event("on_prediction_step_begin")
                loss, out = stepper.forward(batch)
                if loss is not None:
                    total.add_(loss.detach(), alpha=batch.size)  # one op: the sum in float64, on the device
                    with_loss = True
                count += batch.size
                if measured and batch.target is not None:
                    metrics.update(out, batch.target)
                if collector is not None:
                    collector.add(out, batch.target)
                if steps_end:  # what a Keras-style batch-end method reads, and the event
                    self.running_logs.eval_sums = (total if with_loss else None, count, metrics, None)
                    self._prediction_step(batch, out, loss, carry)
        if fabric.world_size > 1:
            total = fabric.all_reduce(total, reduce_op="sum")
            count = int(fabric.all_reduce(torch.tensor(count, device=fabric.device), reduce_op="sum"))
        if count == 0:
            raise ValueError("the evaluation data is empty: pass at least one sample")
        results: dict[str, float] = {}
        if with_loss:
            results[prefix + "loss"] = float(total) / count
        results.update(metrics.compute())
        if collector is not None:
            gather = (lambda t: _gather_blocks(fabric, t)) if fabric.world_size > 1 else (lambda t: t)
            results.update(collector.compute(gather, prefix))
        return results

    def _own_evaluate(self, source: DataSource, prefix: str, steps: int | None) -> dict[str, float]:
        """`evaluate` through an overridden `test_step`: its values, sample-weighted means."""
        tools, test_step = self.tools, self.overrides.test_step
        assert tools is not None and test_step is not None  # the overridden step's loop has its tools
        means, carry = StepMeans(self.fabric.device), self._carry["on_prediction_step"]
        metrics, trained = self.val_metrics if prefix else MetricSet(self.metric_specs), tools.metrics
        metrics.reset()
        tools.metrics, tools.updated, count = metrics, False, 0  # what `compute_metrics` updates
        self.call_event("on_evaluate_begin")
        with self.stepper.inference(), stopping(source):
            for batch in first(source.batches(0), steps):
                self.call_event("on_prediction_step_begin")
                values = tools.values(test_step(as_data(batch)), "test_step")
                means.add(values, batch.size)
                count += batch.size
                self.running_logs.eval_sums = (None, count, None, means)
                self._prediction_step(batch, None, values.get("loss"), carry)
        if self.fabric.world_size > 1:
            count = int(self.fabric.all_reduce(torch.tensor(count, device=self.fabric.device), reduce_op="sum"))
        tools.metrics = trained
        if count == 0:
            raise ValueError("the evaluation data is empty: pass at least one sample")
        return {**means.compute(self.fabric, prefix), **(metrics.compute() if tools.updated else {})}

    def _listened(self, event: str) -> bool:
        """Whether any callback listens to `event`: the batch loops skip firing an event nobody
        hears (the handler would find no listener each batch and return the same control)."""
        return bool(self.handler.listeners(event))

    def _prediction_step(self, batch: Batch, outputs: Any, loss: Any, carry: bool) -> None:
        cb = self.handler
        if carry:
            self.control = cb.on_prediction_step(self.args, self.state, self.control, batch=as_data(batch),
                                                 outputs=outputs, loss=loss)
        else:
            self.control = cb.on_prediction_step(self.args, self.state, self.control)

    def predict(self, source: DataSource, steps: int | None = None) -> Any:
        """The outputs for every sample of `source`, in input order, on CPU."""
        stepper, own_step = self.stepper, self.overrides.predict_step
        carry = self._carry["on_prediction_step"]
        outputs: list = []
        self.call_event("on_predict_begin")
        begins, steps_end = self._listened("on_prediction_step_begin"), self._listened("on_prediction_step")
        with stepper.inference(), stopping(source):
            for batch in first(source.batches(0), steps):
                if begins:
                    self.call_event("on_prediction_step_begin")
                if own_step is None:
                    _, out = stepper.forward(batch, with_loss=False)
                else:
                    out = own_step(as_data(batch))
                outputs.append(out if isinstance(out, torch.Tensor) and not out.requires_grad
                               else map_tensors(torch.Tensor.detach, out))
                if steps_end:
                    self._prediction_step(batch, out, None, carry)
        if not outputs and self.fabric.world_size == 1:
            raise ValueError("`x` is empty: pass at least one sample to predict")
        out = _concat(outputs) if outputs else None
        if self.fabric.world_size > 1:
            out = _gather_blocks(self.fabric, out)
        return to_cpu(out)


def first(batches: Iterable[Batch], steps: int | None) -> Iterable[Batch]:
    """The first `steps` batches (Keras' `steps` / `validation_steps`), or all for None."""
    return batches if steps is None else itertools.islice(batches, steps)


def _gather_blocks(fabric: Any, out: Any) -> Any:
    """Every rank's contiguous block of outputs, concatenated in rank order (= input order)."""
    leaves = tensors_of(out)
    rows = leaves[0].shape[0] if leaves else 0
    sizes = fabric.all_gather(torch.tensor([rows], device=fabric.device)).reshape(-1).tolist()
    most = max(sizes)

    def gather(t: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros((most, *t.shape[1:]), dtype=t.dtype, device=t.device)
        padded[: t.shape[0]] = t
        everyone = fabric.all_gather(padded)
        return torch.cat([everyone[r, : sizes[r]] for r in range(len(sizes))])

    return map_tensors(gather, out)


def _concat(outs: list) -> Any:
    """Per-batch outputs joined along the batch dimension, structure kept."""
    first = outs[0]
    if isinstance(first, torch.Tensor):
        return torch.cat([o if o.dim() else o.reshape(1) for o in outs]) if len(outs) > 1 else first
    if isinstance(first, dict):
        return {k: _concat([o[k] for o in outs]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(_concat([o[i] for o in outs]) for i in range(len(first)))
    return outs
