"""Evaluation and prediction: exact averages over every sample (the loss weighted by samples,
metrics over all of them, HF's `compute_metrics` over the gathered predictions), and outputs in
input order, also under several processes. `Loop` inherits it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from fitkit.adapters.metrics import MetricSet
from fitkit.common.tensors import map_tensors, to_cpu
from fitkit.common.wrappers import unwrapped
from fitkit.engine.batch_logs import EvalSums
from fitkit.engine.data.batch import Batch, as_data
from fitkit.engine.data.prefetch import stopping
from fitkit.engine.data.sources import DataSource
from fitkit.engine.eval_prediction import PredictionCollector, generated_ids
from fitkit.engine.gather import BatchJoiner, gather_blocks
from fitkit.engine.overrides import StepMeans

if TYPE_CHECKING:  # pragma: no cover - the members of `Loop` these methods use
    from fitkit.config.arguments import TrainingArguments
    from fitkit.engine.batch_logs import RunningLogs
    from fitkit.engine.overrides import StepOverrides, StepTools
    from fitkit.engine.step import GradMode, Stepper
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

    collected: tuple[Any, Any] | None = None  # (predictions, label_ids) of the last `evaluate(keep=True)`
    evaluated: tuple[int, int] = (0, 0)  # (samples over all processes, batches of this process) of the last `evaluate`

    def evaluate(self, source: DataSource, prefix: str = "", steps: int | None = None,
                 keep: bool = False) -> dict[str, float]:
        """Exact averages over `source`: loss weighted by samples, metrics over all of them;
        `keep`: the gathered predictions and labels kept in `collected` (HF's `predict`)."""
        if self.overrides.test_step is not None:
            return self._own_evaluate(source, prefix, steps)
        fabric, stepper, carry = self.fabric, self.stepper, self._carry["on_prediction_step"]
        metrics = self.val_metrics if prefix else MetricSet(self.metric_specs)
        metrics.reset()
        collector = PredictionCollector.of(self.args, keep, fabric.world_size)  # HF's compute_metrics, when set
        main_key = getattr(unwrapped(stepper.module), "main_input_name", "input_ids")  # HF's include_for_metrics
        total = torch.zeros((), device=fabric.device, dtype=torch.float64)
        count, batches, with_loss, measured = 0, 0, False, bool(metrics)
        self.control = self.handler.on_evaluate_begin(self.args, self.state, self.control, running_logs=self.running_logs)
        listens = self.handler.has_listeners  # an event nobody hears is not fired per batch
        begins, steps_end = listens("on_prediction_step_begin"), listens("on_prediction_step")
        with stepper.inference(fast=True) as mode, stopping(source):
            # HF's batch_eval_metrics: the last batch known as it comes (read one ahead, as Accelerate reads)
            marked = with_last(first(source.batches(0), steps), collector is not None and collector.online)
            for batch, last in marked:
                if begins:
                    self.control = self.handler.on_prediction_step_begin(self.args, self.state, self.control)
                try:
                    loss, out = stepper.forward(batch)
                except Exception as err:  # noqa: BLE001 - a forward that needs autograd: again under no_grad
                    loss, out = again_under_no_grad(stepper, mode, batch, err)
                size = batch.size
                if loss is not None:
                    # One op: the sum in float64, on the device (no detach: nothing records under no_grad).
                    total.add_(loss, alpha=size)
                    with_loss = True
                count += size
                batches += 1
                if measured and batch.target is not None:
                    metrics.update(out, batch.target, batch.sample_weight)
                if collector is not None:
                    main = batch.inputs.get(main_key) if isinstance(batch.inputs, dict) else None
                    collector.add(out, batch.target, self._generated(batch), main, loss, size, last, batch.inputs)
                if steps_end:  # what a Keras-style batch-end method reads, and the event
                    self.running_logs.evaluated_batch(EvalSums(total if with_loss else None, count, metrics, None))
                    self._prediction_step(batch, out, loss, carry)
                if collector is not None and collector.online:  # HF's batch_eval_metrics, after the event
                    collector.settle()
        if fabric.world_size > 1:
            total = fabric.all_reduce(total, reduce_op="sum")
            count = int(fabric.all_reduce(torch.tensor(count, device=fabric.device), reduce_op="sum"))
        if count == 0:
            raise ValueError("the evaluation data is empty: pass at least one sample")
        self.evaluated = (count, batches)
        results: dict[str, float] = {}
        if with_loss:
            results[prefix + "loss"] = float(total) / count
        results.update(metrics.compute())
        if not prefix:
            metrics.release()  # this call's own set: its metrics serve the next call
        if collector is not None:
            results.update(collector.compute(fabric, prefix))
            self.collected = collector.kept
        return results

    def _generated(self, batch: Batch) -> tuple[torch.Tensor, Any] | None:
        """With `predict_with_generate`: the module's `generate` ids for `batch` and its target,
        padded as HF's `Seq2SeqTrainer` pads them."""
        if not self.args.predict_with_generate:
            return None
        return generated_ids(unwrapped(self.stepper.module), batch.inputs, batch.target, self.args)

    def _own_evaluate(self, source: DataSource, prefix: str, steps: int | None) -> dict[str, float]:
        """`evaluate` through an overridden `test_step`: its values, sample-weighted means."""
        tools, test_step = self.tools, self.overrides.test_step
        assert tools is not None and test_step is not None  # the overridden step's loop has its tools
        running = self.overrides.reset_trackers()  # Keras resets the trackers before evaluating
        means = StepMeans(self.fabric.device, running, self.overrides.unnamed_trackers())
        carry = self._carry["on_prediction_step"]
        metrics, trained = self.val_metrics if prefix else MetricSet(self.metric_specs), tools.metrics
        metrics.reset()
        tools.metrics, tools.updated, count = metrics, False, 0  # what `compute_metrics` updates
        self.control = self.handler.on_evaluate_begin(self.args, self.state, self.control, running_logs=self.running_logs)
        with self.stepper.inference(), stopping(source):
            for batch in first(source.batches(0), steps):
                self.control = self.handler.on_prediction_step_begin(self.args, self.state, self.control)
                values = tools.values(test_step(as_data(batch)), "test_step")
                means.add(values, batch.size, tools.step_loss_weight)
                count += batch.size
                self.running_logs.evaluated_batch(EvalSums(None, count, None, means))
                self._prediction_step(batch, None, values.get("loss"), carry)
        if self.fabric.world_size > 1:
            count = int(self.fabric.all_reduce(torch.tensor(count, device=self.fabric.device), reduce_op="sum"))
        tools.metrics = trained
        if count == 0:
            raise ValueError("the evaluation data is empty: pass at least one sample")
        results = {**means.compute(self.fabric, prefix), **(metrics.compute() if tools.updated else {})}
        if not prefix:
            metrics.release()  # this call's own set: its metrics serve the next call
        return results

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
        outputs = BatchJoiner("outputs", self.args.eval_accumulation_steps)
        self.control = self.handler.on_predict_begin(self.args, self.state, self.control)
        listens = self.handler.has_listeners  # an event nobody hears is not fired per batch
        begins, steps_end = listens("on_prediction_step_begin"), listens("on_prediction_step")
        with stepper.inference(fast=own_step is None) as mode, stopping(source):  # the user's step: no_grad
            for batch in first(source.batches(0), steps):
                if begins:
                    self.control = self.handler.on_prediction_step_begin(self.args, self.state, self.control)
                if own_step is None:
                    try:
                        _, out = stepper.forward(batch, with_loss=False)
                    except Exception as err:  # noqa: BLE001 - a forward that needs autograd: again under no_grad
                        _, out = again_under_no_grad(stepper, mode, batch, err, with_loss=False)
                else:
                    out = own_step(as_data(batch))
                outputs.add(out)
                if steps_end:
                    self._prediction_step(batch, out, None, carry)
        if not outputs and self.fabric.world_size == 1:
            raise ValueError("`x` is empty: pass at least one sample to predict")
        out = outputs.joined()  # padded across batches with -100 (HF's Trainer)
        if self.fabric.world_size > 1:
            out = gather_blocks(self.fabric, out, chunk_rows=outputs.every and self.args.eval_batch_size * outputs.every)
        return map_tensors(_normal, to_cpu(out))


def again_under_no_grad(stepper: Stepper, mode: GradMode, batch: Batch, err: Exception,
                        with_loss: bool = True) -> tuple[torch.Tensor | None, Any]:
    """`stepper.forward(batch)` again after it raised `err` under inference mode, now under
    `no_grad` (as for the rest of the call): a module that computes gradients inside its forward
    (`torch.enable_grad`, `torch.autograd.grad`) runs as before. When it fails there too, `err`
    is raised (with the first-batch checks' hint, which the second call no longer adds)."""
    if not mode.fall_back():
        raise err
    try:
        return stepper.forward(batch, with_loss)
    except Exception:  # noqa: BLE001 - the first error is the one to show
        pass
    raise err


def _normal(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy when it was made under inference mode (one batch's output, not joined by a
    copy): the user's tensors take part in autograd and in-place updates later."""
    return t.clone() if t.is_inference() else t


def cast_for_full_eval(module: torch.nn.Module, args: TrainingArguments) -> None:
    """HF's `bf16_full_eval` / `fp16_full_eval`: `module` cast in place to that dtype, as the
    Trainer's `evaluate` and `predict` cast it when not training (it stays so afterwards; the
    evaluations inside a fit run at the training precision)."""
    if args.bf16_full_eval and args.fp16_full_eval:
        raise ValueError("`bf16_full_eval`=True and `fp16_full_eval`=True: pass only one of them")
    if args.bf16_full_eval or args.fp16_full_eval:
        module.to(dtype=torch.bfloat16 if args.bf16_full_eval else torch.float16)


def with_last(batches: Iterable[Batch], lookahead: bool) -> Iterator[tuple[Batch, bool]]:
    """Each batch and whether it is the last; with `lookahead` the next batch is read before a
    batch is handed out (without, every batch is marked False)."""
    if not lookahead:
        yield from ((batch, False) for batch in batches)
        return
    it = iter(batches)
    current = next(it, None)
    while current is not None:
        following = next(it, None)
        yield current, following is None
        current = following


def first(batches: Iterable[Batch], steps: int | None) -> Iterable[Batch]:
    """The first `steps` batches (Keras' `steps` / `validation_steps`), or all for None."""
    return batches if steps is None else itertools.islice(batches, steps)

