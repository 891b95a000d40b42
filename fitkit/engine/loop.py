"""The loop: epochs and steps of training, evaluation and prediction, firing the callback events.

The order of events per optimizer step is Hugging Face's (DESIGN.md section 3). What one step
does to the module and optimizer is `fitkit.engine.step`; checkpoints are
`fitkit.engine.checkpoint`; SIGTERM is `fitkit.engine.preemption`. Losses are accumulated on the
device and read back only when logged: the loop never calls `.item()` per step.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

import torch

from fitkit.adapters.metrics import MetricSet
from fitkit.arguments import TrainingArguments
from fitkit.callbacks.base import CallbackHandler, StopTraining, TrainerControl, TrainerState
from fitkit.engine.checkpoint import Checkpointer
from fitkit.engine.data import Batch, DataSource
from fitkit.engine.preemption import Preemption
from fitkit.engine.rng import rng_state, set_rng_state
from fitkit.engine.run_metrics import RunMetrics
from fitkit.engine.running_loss import EpochLoss
from fitkit.engine.snapshot import LoopSnapshot
from fitkit.engine.step import Stepper
from fitkit.tensors import map_tensors, tensors_of, to_cpu

logger = logging.getLogger("fitkit")


class Loop:
    """Train / evaluate / predict over one `Stepper`, firing events on `handler`.

    `directions` maps logged names to "min"/"max" (from the metric objects) for tracking the
    best model; `checkpointer` is None outside `fit` (nothing is saved then).
    """

    def __init__(self, stepper: Stepper, handler: CallbackHandler, args: TrainingArguments, state: TrainerState,
                 control: TrainerControl, *, metrics: list, scheduler: Any = None,
                 checkpointer: Checkpointer | None = None, directions: dict[str, str] | None = None):
        self.stepper, self.fabric = stepper, stepper.fabric
        self.handler, self.args, self.state, self.control = handler, args, state, control
        self.metric_specs = metrics
        self.scheduler, self.checkpointer = scheduler, checkpointer
        self.directions = directions or {}
        self.train_metrics = MetricSet(metrics)
        self.val_metrics = MetricSet(metrics, prefix="val_")
        self.train_metrics.device = self.val_metrics.device = self.fabric.device
        self.loss = EpochLoss(self.fabric)
        sigterm = args.save_on_sigterm if args.save_on_sigterm is not None else args.save_strategy != "no"
        self.preemption = Preemption(self.fabric, enabled=sigterm)  # acts only while `train` runs
        self.val: DataSource | None = None
        self.position: tuple[int, int] = (0, 0)  # (epoch, micro-batches consumed in it)
        self.epoch_rng: dict | None = None  # RNG at epoch start, for loaders that draw from it
        self._warned_best = False

    # -- training -----------------------------------------------------------------------------
    def train(self, train: DataSource, val: DataSource | None, resume: LoopSnapshot | None = None) -> None:
        """Run the epochs; `resume` is where a checkpoint left off (None: from the start)."""
        args, state, cb = self.args, self.state, self.handler
        self.val = val
        level = args.get_process_log_level(self.fabric.global_rank, self.fabric.local_rank)
        if level is not None:
            logger.setLevel(level)
        self.stepper.train_mode(True)
        self.control = cb.on_train_begin(args, state, self.control)
        if resume:  # after on_train_begin, which resets Keras-style callbacks
            cb.load_states(resume.callbacks, self.control)
        first_step = state.global_step
        figures = RunMetrics(self.fabric.device, memory=not args.skip_memory_metrics)
        try:
            with self.preemption.watching():
                self._epochs(train, resume)
        except StopTraining as stop:
            reason = str(stop) or type(stop).__name__
            logger.warning("training stopped: %s", reason)
            self.control.should_training_stop = True
            state.log_history.append({"stopped": reason, "epoch": state.epoch, "step": state.global_step})
        if self.checkpointer is not None:
            self.checkpointer.load_best()
        self._closing_log(figures, first_step)
        self.control = cb.on_train_end(args, state, self.control, preempted=self.preemption.preempted)

    def _epochs(self, train: DataSource, resume: LoopSnapshot | None) -> None:
        start = resume.epoch if resume else 0
        for epoch in range(start, self.state.num_train_epochs):
            self._run_epoch(epoch, train, resume if resume and epoch == start else None)
            if self.control.should_training_stop:
                break

    def _run_epoch(self, epoch: int, train: DataSource, resume: LoopSnapshot | None) -> None:
        self.control = self.handler.on_epoch_begin(self.args, self.state, self.control)
        self.train_metrics.reset()
        self.loss.new_epoch()
        start = self._restore_epoch(resume) if resume else 0
        batches = self._epoch_batches(train, epoch, start, resume)
        n_batches = len(train) if train.has_len() else None
        stopped = self._steps(epoch, batches, start, n_batches)
        self._end_epoch(epoch, n_batches, stopped)

    def _steps(self, epoch: int, batches: Iterator[Batch], start: int, n_batches: int | None) -> bool:
        """Train on the epoch's batches; True when a callback or preemption stopped it early."""
        args, state, cb, stepper = self.args, self.state, self.handler, self.stepper
        accum = args.gradient_accumulation_steps
        add_loss = self.loss.running.add
        metrics = self.train_metrics if self.train_metrics else None
        micro, cycle = 0, 1
        for i, batch in enumerate(batches, start):
            if micro == 0:
                cycle = accum if n_batches is None else min(accum, n_batches - i)
                self.control = cb.on_step_begin(args, state, self.control)
            micro += 1
            loss, out = stepper.forward_backward(batch, cycle, last=micro == cycle)
            add_loss(loss, batch.size)
            if metrics is not None and batch.target is not None:
                metrics.update(out, batch.target)
            if micro < cycle:
                self.control = cb.on_substep_end(args, state, self.control)
                continue
            micro = 0
            self._optimizer_step()
            state.global_step += 1
            state.epoch = epoch + (i + 1) / n_batches if n_batches else float(epoch)
            self.position = (epoch, i + 1)  # where a checkpoint written from here resumes
            self.control = cb.on_step_end(args, state, self.control)
            if self._after_step():
                return True
        return False

    def _optimizer_step(self) -> None:
        """Clip, step the optimizer and the scheduler, clear the gradients (HF's event order)."""
        args, state, cb, stepper = self.args, self.state, self.handler, self.stepper
        stepper.clip(args.max_grad_norm)
        self.control = cb.on_pre_optimizer_step(args, state, self.control)
        stepper.step()
        self.control = cb.on_optimizer_step(args, state, self.control)
        if self.scheduler is not None:
            self.scheduler.step()
        stepper.zero_grad()

    def _after_step(self) -> bool:
        """Log / evaluate / save as `control` asks; True when the epoch should end here."""
        control = self.control
        if self.preemption.due(self.state.global_step):  # SIGTERM: finish this step, checkpoint, stop
            control.should_save = control.should_training_stop = True
        if control.should_log or control.should_evaluate or control.should_save:
            self._log_evaluate_save(epoch_end=False)
        return self.control.should_epoch_stop or self.control.should_training_stop

    def _end_epoch(self, epoch: int, n_batches: int | None, stopped: bool) -> None:
        state = self.state
        if n_batches is None or not stopped or state.epoch is None:
            state.epoch = float(epoch + 1)
        self.control = self.handler.on_epoch_end(self.args, state, self.control)
        self.position = (epoch + 1, 0)
        self.loss.close()  # the epoch's one host read
        self._log_evaluate_save(epoch_end=True)

    def _closing_log(self, figures: RunMetrics, first_step: int) -> None:
        """HF's closing record (speed, memory, `train_loss`), before `on_train_end`."""
        args = self.args
        steps = self.state.global_step - first_step
        samples = steps * args.batch_size * args.gradient_accumulation_steps * self.fabric.world_size
        summary = figures.finish(samples, steps)
        mean = self.loss.run_mean()
        if mean is not None:
            summary["train_loss"] = mean
        self.log(summary)

    # -- resuming -------------------------------------------------------------------------------
    def _restore_epoch(self, resume: LoopSnapshot) -> int:
        """Put back the resumed epoch's running sums; return the micro-batches it had consumed."""
        if not resume.mid_epoch:
            return 0
        self.loss.restore(resume)
        if self.fabric.global_rank == 0:  # metric states were synced over all processes when saved
            self.train_metrics.load_state(resume.metrics)
        return resume.batch

    def _epoch_batches(self, train: DataSource, epoch: int, start: int, resume: LoopSnapshot | None):
        """The epoch's batches from `start`, with the RNG where the first run had it."""
        replay = resume.epoch_rng if resume else None
        if resume:
            set_rng_state(replay or resume.rng)
        if train.replays_rng:
            self.epoch_rng = replay or rng_state()
        batches = train.batches(epoch, start)
        if replay:  # the epoch's order was drawn as in the first run; now continue its RNG
            set_rng_state(resume.rng)
        return batches

    def snapshot(self) -> LoopSnapshot:
        """Where the loop is, for a checkpoint: data position and the epoch's running sums."""
        epoch, batch = self.position
        if not batch:
            return LoopSnapshot(epoch=epoch, batch=0)
        sums = self.loss.export()  # over all processes: before the metric states, as every process does
        return LoopSnapshot(epoch=epoch, batch=batch, **sums, metrics=self.train_metrics.export_state(),
                            epoch_rng=self.epoch_rng)

    def checkpoint(self, directory: str | None = None, limit: int | None = None) -> str:
        """Write a resumable checkpoint now (into `output_dir` by default); callbacks receive
        this as the `save_checkpoint` keyword. Call it on every process."""
        return self.checkpointer.save(self.snapshot(), self.control, directory, limit)

    # -- logging, evaluating, saving ---------------------------------------------------------------
    def _log_evaluate_save(self, epoch_end: bool) -> None:
        args, state, cb = self.args, self.state, self.handler
        if self.control.should_log:
            self._log_training(epoch_end)
        if self.control.should_evaluate and self.val is not None:
            metrics = self.evaluate(self.val, prefix="val_")
            self.log(dict(metrics))
            self.control = cb.on_evaluate(args, state, self.control, metrics)
            if self._track_best(metrics) and args.save_strategy == "best":  # after on_evaluate, as HF
                self.control.should_save = True
        self.control.should_evaluate = False
        if self.control.should_save and self.checkpointer is not None:
            self.checkpoint()
            self.control = cb.on_save(args, state, self.control)
        self.control.should_save = False

    def _log_training(self, epoch_end: bool) -> None:
        logs: dict[str, float] = {}
        if epoch_end:
            total, count = self.loss.totals()
            if count:
                logs["loss"] = total / count
                logs.update(self.train_metrics.compute())
        else:
            mean = self.loss.mean_since_log()  # one host read per logging step
            if mean is not None:
                logs["loss"] = mean
        logs["learning_rate"] = self.stepper.learning_rate()
        self.log(logs)

    def _track_best(self, metrics: dict[str, float]) -> bool:
        """Update `state.best_metric` from an evaluation; True when this one is the new best."""
        args, state = self.args, self.state
        name = args.metric_for_best_model
        if name not in metrics:
            if not self._warned_best:
                logger.warning("`metric_for_best_model`=%r is not among the evaluation values %s; "
                               "no best model is tracked", name, sorted(metrics))
                self._warned_best = True
            return False
        value = metrics[name]
        greater = args.greater_is_better
        if greater is None:  # the metric object's own direction, else HF's rule
            known = self.directions.get(name)
            greater = known == "max" if known else "loss" not in name
        best = state.best_metric
        if best is None or (value > best if greater else value < best):
            state.best_metric, state.best_global_step = value, state.global_step
            return True
        return False

    def log(self, logs: dict[str, float]) -> None:
        state = self.state
        if state.epoch is not None:
            logs["epoch"] = round(state.epoch, 4)
        state.log_history.append({**logs, "step": state.global_step})
        self.control = self.handler.on_log(self.args, state, self.control, logs)

    # -- evaluation and prediction ------------------------------------------------------------
    def evaluate(self, source: DataSource, prefix: str = "") -> dict[str, float]:
        """Exact averages over `source`: loss weighted by samples, metrics over all of them."""
        fabric, cb, stepper = self.fabric, self.handler, self.stepper
        metrics = self.val_metrics if prefix else MetricSet(self.metric_specs)
        metrics.reset()
        total = torch.zeros((), device=fabric.device, dtype=torch.float64)
        count, with_loss = 0, False
        with stepper.inference():
            for batch in source.batches(0):
                loss, out = stepper.forward(batch)
                if loss is not None:
                    total += loss.detach().double() * batch.size
                    with_loss = True
                count += batch.size
                if metrics and batch.target is not None:
                    metrics.update(out, batch.target)
                self.control = cb.on_prediction_step(self.args, self.state, self.control)
        if fabric.world_size > 1:
            total = fabric.all_reduce(total, reduce_op="sum")
            count = int(fabric.all_reduce(torch.tensor(count, device=fabric.device), reduce_op="sum"))
        if count == 0:
            raise ValueError("the evaluation data is empty: pass at least one sample")
        results: dict[str, float] = {}
        if with_loss:
            results[prefix + "loss"] = float(total) / count
        results.update(metrics.compute())
        return results

    def predict(self, source: DataSource) -> Any:
        """The outputs for every sample of `source`, in input order, on CPU."""
        cb, stepper = self.handler, self.stepper
        outputs: list = []
        with stepper.inference():
            for batch in source.batches(0):
                _, out = stepper.forward(batch, with_loss=False)
                outputs.append(map_tensors(torch.Tensor.detach, out))
                self.control = cb.on_prediction_step(self.args, self.state, self.control)
        if not outputs and self.fabric.world_size == 1:
            raise ValueError("`x` is empty: pass at least one sample to predict")
        out = _concat(outputs) if outputs else None
        if self.fabric.world_size > 1:
            out = _gather_blocks(self.fabric, out)
        return to_cpu(out)


def _gather_blocks(fabric, out: Any) -> Any:
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
