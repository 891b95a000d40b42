"""The loop: epochs and steps of training, evaluation and prediction, firing the callback events.

The order of events per optimizer step is Hugging Face's. Evaluation and prediction are in
`fitkit.engine.inference`, best-model tracking in `fitkit.engine.best_model`. What one step does to the module
and optimizer is `fitkit.engine.step`; what a checkpoint holds, and saving and resuming one, is
`fitkit.engine.checkpoint.checkpointer` (the loop decides when); SIGTERM is `fitkit.engine.preemption`.
Losses are accumulated on the device and read back only when logged: the loop never calls
`.item()` per step.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fitkit.adapters.metrics import MetricSet
from fitkit.adapters.optimizers import is_plateau
from fitkit.common.wrappers import unwrapped
from fitkit.engine.batch_logs import RunningLogs, epoch_values
from fitkit.engine.best_model import BestModel
from fitkit.engine.checkpoint.checkpointer import Checkpointer, LoopSnapshot
from fitkit.engine.checks import unread
from fitkit.engine.data.batch import Batch, as_data
from fitkit.engine.data.prefetch import stopping
from fitkit.engine.data.sources import DataSource
from fitkit.engine.inference import Inference
from fitkit.engine.overrides import StepMeans, StepOverrides, StepTools
from fitkit.engine.preemption import Preemption
from fitkit.engine.run_context import RunContext
from fitkit.engine.run_metrics import RunMetrics
from fitkit.engine.running_loss import EpochLoss, WindowLoss
from fitkit.engine.step import Stepper
from fitkit.engine.token_loss import TokenLoss
from fitkit.engine.tokens_seen import TokensSeen
from fitkit.events.handler import CallbackHandler
from fitkit.events.hf_view import evaluated_metrics
from fitkit.events.state import StopTraining, TrainerControl, TrainerState

logger = logging.getLogger("fitkit")


class Loop(Inference, BestModel):
    """Train / evaluate / predict over one `Stepper`, firing events on `handler`, for the call
    whose `context` (`RunContext`: settled arguments, the face's policy, the stop request, the step
    tools) it is given. What differs between a Keras run and a Trainer run is `context.policy`'s.

    `directions` maps logged names to "min"/"max" (from the metric objects) for tracking the
    best model; `checkpointer` is None outside `fit` (nothing is saved then). `overrides` are a
    `Model` subclass's own steps; `tools` is then what they use (see `fitkit.engine.overrides`).
    """

    def __init__(self, stepper: Stepper, handler: CallbackHandler, context: RunContext, state: TrainerState,
                 control: TrainerControl, *, metrics: list, scheduler: Any = None,
                 checkpointer: Checkpointer | None = None, directions: dict[str, str] | None = None,
                 overrides: StepOverrides | None = None, epoch_length: int | None = None) -> None:
        self.stepper, self.fabric = stepper, stepper.fabric
        args = context.args
        assert args is not None  # a loop runs a call with arguments
        self.context, self.policy = context, context.policy
        self.handler, self.args, self.state, self.control = handler, args, state, control
        self.metric_specs = metrics
        self.scheduler, self.checkpointer = scheduler, checkpointer
        # A plateau scheduler steps with the metric after each evaluation; any other, per step.
        self.plateau = scheduler if is_plateau(scheduler) else None
        self.step_scheduler = None if self.plateau is not None else scheduler
        self.step_lr: Any = None  # the rate the last step used (HF logs it); read as a number when logged
        self.directions = directions or {}
        self.train_metrics = MetricSet(metrics)
        self.val_metrics = MetricSet(metrics, prefix="val_")
        self.train_metrics.device = self.val_metrics.device = self.fabric.device
        self.loss = EpochLoss(self.fabric, per_step=self.policy.per_step_loss)
        # the last step's gradient norm when the policy measures it: a device tensor read only when logged
        self.grad_norm: torch.Tensor | None = None
        self.tokens: TokensSeen | None = None  # HF's include_num_input_tokens_seen, set by `train`
        self.token_loss: TokenLoss | None = None  # the Trainer's num_items_in_batch, set by `train` (policy's)
        self._train_started = 0.0
        self.flos: tuple[str, int] | None = None  # the policy's FLOPs count: (the main input's key, factor)
        self.local_flos = 0  # this process's count since the last `store_flos`
        sigterm = args.save_on_sigterm if args.save_on_sigterm is not None else args.save_strategy != "no"
        self.preemption = Preemption(self.fabric, enabled=sigterm)  # acts only while `train` runs
        self.val: DataSource | None = None
        self.source: DataSource | None = None  # the training data: checkpoints count positions in it
        self.position: tuple[int, int] = (0, 0)  # (epoch, micro-batches consumed in it)
        self.epoch_length = epoch_length  # micro-batches in a training epoch, at most steps_per_epoch (None: unknown)
        self._warned_best = False
        self.overrides = overrides or StepOverrides()
        self.step_means = StepMeans(self.fabric.device)  # what an overridden train_step returns
        self.tools: StepTools | None = None
        if self.overrides:
            self.tools = StepTools(stepper, self.call_event, self._apply_gradients)
            self.tools.metrics = self.train_metrics  # what `Model.compute_metrics` updates in training
        context.tools = self.tools
        self._carry = self._carried_events()
        # Keras' batch-end logs, read only when a Keras-style callback asks (fitkit.engine.batch_logs)
        self.running_logs = context.running_logs = RunningLogs(self)
        self.epoch_validation: dict[str, float] | None = None  # the epoch's last evaluation (Keras' epoch logs)

    # -- training -----------------------------------------------------------------------------
    def train(self, train: DataSource, val: DataSource | None, resume: LoopSnapshot | None = None) -> None:
        """Run the epochs; `resume` is where a checkpoint left off (None: from the start)."""
        args, state, cb = self.args, self.state, self.handler
        self.source, self.val = train, val
        level = args.get_process_log_level(self.fabric.global_rank, self.fabric.local_rank)
        if level is not None:
            logger.setLevel(level)
        self.stepper.keep_parameters()
        self._carry = self._carried_events()
        self.control = cb.on_train_begin(args, state, self.control)
        if resume:  # after on_train_begin, which resets Keras-style callbacks
            assert self.checkpointer is not None  # a resume comes from the fit's checkpointer
            self.checkpointer.restore_callbacks(resume, self.control)
        first_step = state.global_step
        # HF's include_num_input_tokens_seen (None: not counted)
        self.tokens = TokensSeen.of(args, unwrapped(self.stepper.module), self.fabric, state.num_input_tokens_seen)
        self.token_loss = self.policy.token_loss(self.stepper, args)
        self._train_started = time.perf_counter()
        if args.eval_on_start and val is not None:  # HF's eval_on_start: no best tracked
            self._evaluate_and_log()
            self.epoch_validation = None
        self.flos = self.policy.flos(unwrapped(self.stepper.module))
        figures = RunMetrics(self.fabric.device, memory=not args.skip_memory_metrics)
        try:
            with self.preemption.watching(), stopping(train):  # a prefetch thread ends with the run
                self._epochs(train, resume)
        except StopTraining as stop:
            reason = str(stop) or type(stop).__name__
            logger.warning("training stopped: %s", reason)
            self.control.should_training_stop = True
            state.log_history.append({"stopped": reason, "epoch": state.epoch, "step": state.global_step})
        if self.checkpointer is not None:
            self.control = self.checkpointer.wait_committed(self.control)  # the last background write committed
            self.checkpointer.load_best()
            self.policy.retain(self.checkpointer, args)
        self._closing_log(figures, first_step)
        self.control = cb.on_train_end(args, state, self.control, preempted=self.preemption.preempted)

    def _epochs(self, train: DataSource, resume: LoopSnapshot | None) -> None:
        start = resume.epoch if resume else self.context.first_epoch
        self._stop_requested(reset=True)
        for epoch in range(start, self.state.num_train_epochs):
            self._run_epoch(epoch, train, resume if resume and epoch == start else None)
            if self.control.should_training_stop or self._stop_requested():
                break

    def _stop_requested(self, reset: bool = False) -> bool:
        """Keras' `stop_training`: True when it was asked for through the `Model` (the context's
        request) or set by a callback on the module it receives; both are cleared when training
        starts, as Keras does."""
        module = self.handler.model
        # read from the instance's own attributes: a module without the flag costs no __getattr__ miss
        on_module = module is not None and vars(module).get("stop_training", False)
        if reset:
            self.context.request_stop(False)
            if on_module:
                module.stop_training = False  # the user's own flag, cleared as Keras clears it
            return False
        if on_module or self.context.stop_requested:
            self.context.request_stop(True)
            self.control.should_training_stop = True
            return True
        return False

    def _run_epoch(self, epoch: int, train: DataSource, resume: LoopSnapshot | None) -> None:
        """One epoch, its events in order: `on_epoch_begin`; the steps (`_steps`: per micro-batch
        `on_step_begin`, `on_substep_end`; per optimizer step `on_pre_optimizer_step`,
        `on_optimizer_step`, `on_step_end`, then log / evaluate / save as `control` asks); the
        epoch's end (`_end_epoch`: its loss sums closed, `on_epoch_end`, its log / evaluation /
        save, `on_epoch_summary`, Keras' `on_epoch_end` moment)."""
        self.stepper.train_mode(True)  # each epoch, as a hand-written loop calls `net.train()`
        self.control = self.handler.on_epoch_begin(self.args, self.state, self.control)
        self.train_metrics.reset()
        self.step_means.reset()
        if self.overrides.metrics is not None:  # the trackers a subclass lists: Keras' reset_metrics
            self.step_means.track(self.overrides.reset_trackers(), self.overrides.unnamed_trackers())
        self.loss.new_epoch()
        self.epoch_tokens = 0
        checkpointer, start = self.checkpointer, 0
        if resume:
            assert checkpointer is not None  # a resume comes from the fit's checkpointer
            start = checkpointer.restore_epoch(self, resume, train)
        batches = train.epoch(epoch, start, rng=resume.rng if resume else None,
                              epoch_rng=resume.epoch_rng if resume else None)
        n_batches = self.epoch_length
        if self.args.steps_per_epoch is not None:
            assert n_batches is not None  # `steps_per_epoch` gives the epoch its length (`epoch_batches`)
            batches = itertools.islice(batches, max(n_batches - start, 0))
        stopped = self._steps(epoch, batches, start, n_batches)
        if not start and unread(self.stepper):  # a loader checked as the run reads it, which read nothing
            raise ValueError(f"`{train.name}` is empty: it yields no batch; pass at least one sample")
        self._end_epoch(epoch, n_batches, stopped)
        if train.ran_out:
            logger.warning("the training data ran out before epoch %d's %s steps (`steps_per_epoch` reads a stream on "
                           "across epochs, as Keras does): training stops here; give data for at least "
                           "`steps_per_epoch * epochs` batches (a stream that repeats)", epoch + 1, n_batches)
            self.control.should_training_stop = True

    def _steps(self, epoch: int, batches: Iterator[Batch], start: int, n_batches: int | None) -> bool:
        """Train on the epoch's batches; True when a callback or preemption stopped it early."""
        args, state, cb, stepper = self.args, self.state, self.handler, self.stepper
        accum = args.gradient_accumulation_steps
        add_loss: Callable[[torch.Tensor, float], None] = self.policy.loss_adder(self.loss, state, args)
        window = WindowLoss(self.loss, self.policy.loss_filter(self.loss, state, args))  # per_step accumulation
        per_step = self.loss.per_step  # HF's Trainer log: the mean of the steps' losses, not of the samples'
        flos_key, flos_factor = self.flos or ("", 0)
        metrics = self.train_metrics if self.train_metrics else None
        own_step, carry = self.overrides.train_step, self._carry
        tokens, token_loss = self.tokens, self.token_loss
        # the Trainer's `num_items_in_batch`: each window read whole and its label tokens counted first
        pairs = (token_loss.windows(batches, start, accum, n_batches) if token_loss is not None and own_step is None
                 else zip(batches, itertools.repeat(None)))
        micro, cycle = 0, 1
        loss: torch.Tensor | None
        for i, (batch, items) in enumerate(pairs, start):
            inputs = batch.inputs
            if inputs.__class__ is dict and "input_ids" in inputs:  # tokens/s for the display: a shape, no read
                self.epoch_tokens += inputs["input_ids"].numel()
            if flos_factor and inputs.__class__ is dict and flos_key in inputs:  # a shape, no read
                self.local_flos += flos_factor * inputs[flos_key].numel()
            if tokens is not None:  # HF's include_num_input_tokens_seen: a shape (or a device sum), no host read
                tokens.add(inputs)
            if micro == 0:
                cycle = accum if n_batches is None else min(accum, n_batches - i)
                self.control = cb.on_step_begin(args, state, self.control)
            micro += 1
            if own_step is None:
                loss, out = stepper.forward_backward(batch, cycle, micro == cycle, items)
                if not per_step or cycle == 1:
                    add_loss(loss, 1 if per_step else batch.size)
                else:  # the Trainer's step loss: the window's losses, added once a step
                    window.add(loss, micro, cycle, counted=items is not None)
                if metrics is not None and batch.target is not None:
                    metrics.update(out, batch.target, batch.sample_weight)
            else:
                loss, out = self._own_train_step(batch, cycle, last=micro == cycle)
            if micro < cycle:
                self.control = (cb.on_substep_end(args, state, self.control, batch=as_data(batch), outputs=out,
                                                  loss=loss) if carry["on_substep_end"]
                                else cb.on_substep_end(args, state, self.control))
                continue
            micro = 0
            if own_step is None:
                self._apply_gradients()
                stepper.zero_grad()
            state.global_step += 1
            state.epoch = epoch + (i + 1) / n_batches if n_batches else float(epoch)
            self.position = (epoch, i + 1)  # where a checkpoint written from here resumes
            self.control = (cb.on_step_end(args, state, self.control, batch=as_data(batch), outputs=out, loss=loss)
                            if carry["on_step_end"] else cb.on_step_end(args, state, self.control))
            if self._after_step():
                return True
        return False

    def _apply_gradients(self) -> None:
        """Clip, step the optimizer and the scheduler (HF's event order); an overridden
        `train_step` runs this through `self.optimizer.step()`."""
        args, state, cb, stepper = self.args, self.state, self.handler, self.stepper
        if self.checkpointer is not None and self.checkpointer.writer.copying is not None:
            self.checkpointer.wait_copied()  # an asynchronous save still copying these weights
        measure = self.policy.measures_grad_norm
        norm = stepper.clip(args.max_grad_norm, measure=measure)
        if measure:  # kept on the device; read only at a logging step
            self.grad_norm = norm
        self.control = cb.on_pre_optimizer_step(args, state, self.control)
        stepper.step()
        self.control = cb.on_optimizer_step(args, state, self.control)
        if self.step_scheduler is not None:
            self.step_lr = stepper.optimizer.param_groups[0]["lr"]  # before the update, as HF logs it; no host read
            self.step_scheduler.step()

    def _carried_events(self) -> dict[str, bool]:
        """Events some listener may read `batch`, `outputs` and `loss` in: only those get them
        (fitkit's own flow and display callbacks say `takes_batch = False`)."""
        def takes(listener: Any) -> bool:
            owner = getattr(listener, "__self__", listener)  # a bound method's callback, or a listener object
            return getattr(owner, "takes_batch", True)

        return {e: any(takes(listener) for listener in self.handler.listeners(e))
                for e in ("on_step_end", "on_substep_end", "on_prediction_step")}

    def _own_train_step(self, batch: Batch, cycle: int, last: bool) -> tuple[torch.Tensor | None, None]:
        """One micro-batch through an overridden `train_step`; its values are averaged per epoch
        (a listed tracker's value is kept as the step gave it)."""
        tools, train_step = self.tools, self.overrides.train_step
        assert tools is not None and train_step is not None  # the overridden step's loop has its tools
        with tools.micro_batch(cycle, last):
            values = tools.values(train_step(as_data(batch)), "train_step")
        if self.step_means.unnamed:
            self.step_means.recognise(values)  # before "loss" is held or summed
        loss = values.get("loss")
        if loss is not None:
            loss = loss if isinstance(loss, torch.Tensor) else torch.tensor(float(loss), device=self.fabric.device)
            weight = tools.step_loss_weight
            if weight is None:
                weight = 1 if self.loss.per_step else batch.size
            if "loss" in self.step_means.running:
                self.loss.hold(loss, weight)
            else:
                self.loss.running.add(loss, weight)
        extras = {name: value for name, value in values.items() if name != "loss"}
        if extras:
            self.step_means.add(extras, batch.size)
        return loss, None

    def call_event(self, event: str, **kwargs: Any) -> None:
        """Fire `event` (a documented one or a custom name) on every callback that has it."""
        self.control = self.handler.call_event(event, self.args, self.state, self.control, **kwargs)

    def _after_step(self) -> bool:
        """Log / evaluate / save as `control` asks; True when the epoch should end here."""
        if self.checkpointer is not None and self.checkpointer.writer.in_flight:  # a background write that ended
            self.control = self.checkpointer.poll_committed(self.control)
        control = self.control
        preempted = self.preemption.due(self.state.global_step)
        if preempted:  # SIGTERM: finish this step, checkpoint, stop
            control.should_save = control.should_training_stop = True
        self._stop_requested()
        if control.should_log or control.should_evaluate or control.should_save:
            self._log_evaluate_save(epoch_end=False)
        self.preemption.final = preempted  # that checkpoint is the last word: see `_end_epoch`
        return self.control.should_epoch_stop or self.control.should_training_stop

    def _end_epoch(self, epoch: int, n_batches: int | None, stopped: bool) -> None:
        state = self.state
        if n_batches is None or not stopped or state.epoch is None:
            state.epoch = float(epoch + 1)
        self.loss.close()  # the epoch's one host read
        self.control = self.handler.on_epoch_end(self.args, state, self.control)
        if not self.preemption.final:  # a preempted epoch stays where its last step left it
            self.position = (epoch + 1, 0)
        else:  # ... and the resumed run ends it: its log and evaluation come there, once
            self.control.should_log = self.control.should_evaluate = False
        self._log_evaluate_save(epoch_end=True)
        self._epoch_summary(epoch)

    def _epoch_summary(self, epoch: int) -> None:
        """`on_epoch_summary` (Keras' `on_epoch_end` moment): after the epoch's validation, with
        the epoch's values; built only when some callback listens."""
        if self.handler.has_listeners("on_epoch_summary"):
            self.control = self.handler.on_epoch_summary(self.args, self.state, self.control, epoch=epoch,
                                                         logs=epoch_values(self))
        self.epoch_validation = None

    def _closing_log(self, figures: RunMetrics, first_step: int) -> None:
        """HF's closing record (speed, memory, `train_loss`), before `on_train_end`."""
        args = self.args
        steps = self.state.global_step - first_step
        samples = steps * args.batch_size * args.gradient_accumulation_steps * self.fabric.world_size
        summary = figures.finish(samples, steps)
        self.store_flos()
        if self.flos is not None:  # HF's place for it: after the speeds, before the loss
            summary["total_flos"] = self.state.total_flos
        mean = self.loss.run_mean()
        if mean is not None:
            summary["train_loss"] = mean
        self.log(summary)

    # -- saving ----------------------------------------------------------------------------------
    def checkpoint(self, directory: str | None = None, limit: int | None = None) -> str:
        """Write a resumable checkpoint now (into `output_dir` by default); callbacks receive
        this as the `save_checkpoint` keyword. Call it on every process."""
        assert self.checkpointer is not None  # handed out during `fit`, which has one
        self.store_flos()
        return self.checkpointer.save(self, self.control, directory, limit)

    def store_flos(self) -> None:
        """Add every process's FLOPs since the last call to `state.total_flos`, as the Trainer's
        `store_flos` does before a checkpoint and at the end (one collective, on every process)."""
        if self.flos is None:
            return
        flos: float = self.local_flos
        if self.fabric.world_size > 1:  # the Trainer sums the processes' counts as float32 scalars
            counts = torch.tensor([float(self.local_flos)], device=self.fabric.device)
            flos = self.fabric.all_reduce(counts, reduce_op="sum").sum().item()
        self.state.total_flos += flos
        self.local_flos = 0

    # -- logging, evaluating, saving ---------------------------------------------------------------
    def _log_evaluate_save(self, epoch_end: bool) -> None:
        args = self.args
        if self.control.should_log:
            self._log_training(epoch_end)
        if self.control.should_evaluate and self.val is not None:
            metrics = self._evaluate_and_log(epoch_end)
            if self._track_best(metrics) and args.save_strategy == "best":  # after on_evaluate, as HF
                self.control.should_save = True
        self.control.should_evaluate = False
        if self.control.should_save and self.checkpointer is not None and not self.preemption.final:
            # the write in flight commits and its on_save fires before the next write starts: inside every
            # on_save, its checkpoint is the newest committed
            self.control = self.checkpointer.wait_committed(self.control)
            self.checkpoint()
            self.control = self.checkpointer.announce(self.control)  # on_save once committed (maybe later)
        self.control.should_save = False

    def _evaluate_and_log(self, epoch_end: bool = False) -> dict[str, float]:
        """One evaluation of the validation data in training: the policy's record of it logged,
        then `on_evaluate`; returns its values (`val_` names)."""
        args, state = self.args, self.state
        assert self.val is not None  # called with validation data only
        started = time.perf_counter()
        with self.stepper.ending_epoch() if epoch_end else contextlib.nullcontext():
            metrics = self.evaluate(self.val, prefix="val_", steps=args.validation_steps)
        self.epoch_validation = dict(metrics)
        record = self.policy.evaluation_record(metrics, time.perf_counter() - started, self.evaluated)
        self.log(record)
        self.control = self.handler.on_evaluate(args, state, self.control,
                                                evaluated_metrics(metrics, args, state, record))
        return metrics

    def _log_training(self, epoch_end: bool) -> None:
        record = self.policy.training_record(self, epoch_end)
        if record is not None:
            self.log(record, training=True)

    def step_record(self) -> dict[str, float]:
        """The training values since the last log: the loss mean (one host read), the gradient
        norm, an overridden step's means, the learning rate."""
        logs: dict[str, float] = {}
        mean = self.loss.mean_since_log()  # one host read per logging step
        if mean is not None:
            logs["loss"] = mean
        if self.grad_norm is not None:
            logs["grad_norm"] = float(self.grad_norm)
        if self.step_means:
            logs.update(self.step_means.since_log())
        logs["learning_rate"] = self.logged_learning_rate()
        return logs

    def logged_learning_rate(self) -> float:
        """The learning rate a training log records: the rate the last step used (HF)."""
        rate = self.step_lr if self.step_scheduler is not None else None
        return self.stepper.learning_rate() if rate is None else float(rate)

    def log(self, logs: dict[str, float], training: bool = False) -> None:
        state = self.state
        if state.epoch is not None:
            logs["epoch"] = self.policy.epoch(state.epoch)
        if self.tokens is not None:  # after `epoch`, as the Trainer's log adds it
            self.tokens.record(logs, state, self._train_started if training else None)
        state.log_history.append({**logs, "step": state.global_step})
        self.control = self.handler.on_log(self.args, state, self.control, logs)

