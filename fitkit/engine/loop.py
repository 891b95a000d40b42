"""The loop: train, evaluate and predict over a Fabric, firing the callback events.

The order of events per optimizer step is Hugging Face's (DESIGN.md section 3). Losses are
accumulated on the device and read back only when logged: the loop itself never calls
`.item()` per step.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fitkit.adapters.losses import Loss
from fitkit.adapters.metrics import MetricSet, primary_output
from fitkit.arguments import TrainingArguments
from fitkit.callbacks.base import CallbackHandler, StopTraining, TrainerControl, TrainerState
from fitkit.engine.checkpoint import rng_state, set_rng_state
from fitkit.engine.data import Batch, DataSource
from fitkit.engine.run_metrics import RunMetrics
from fitkit.engine.running_loss import RunningLoss
from fitkit.tensors import map_tensors, tensors_of, to_cpu

logger = logging.getLogger("fitkit")

#: Under several processes, how often (in optimizer steps) they check together for a SIGTERM.
PREEMPTION_CHECK_STEPS = 10


def _model_loss(out: Any) -> torch.Tensor:
    """The loss a module returned itself: a tensor, `out["loss"]`, `out.loss` or `out[0]`."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ValueError(
        "`loss=None` means the module returns its loss (a tensor, a dict with 'loss', or a tuple whose first "
        f"item is the loss), but it returned {type(out).__name__}; pass `loss=` to compile"
    )


def set_training(module: torch.nn.Module, mode: bool) -> None:
    """`module.train(mode)`, bypassing Fabric's wrapper's attribute hook, which lists
    `dir(module)` on every assignment (it cost 20 us of a call's 27 here)."""
    if "_forward_module" not in module.__dict__.get("_modules", {}):
        module.train(mode)
        return
    module.__dict__["training"] = mode
    for child in module.children():
        child.train(mode)


def _metric_outputs(out: Any) -> Any:
    """What metrics see when the module returned its own loss: logits, not the loss."""
    if isinstance(out, (tuple, list)) and len(out) > 1:
        return out[1]
    return out


@dataclass
class Parts:
    """What the loop runs on; built by the `Model` facade."""

    fabric: Any
    module: torch.nn.Module  # as set up by Fabric
    optimizer: torch.optim.Optimizer | None
    loss: Loss | None
    metrics: list
    handler: CallbackHandler
    args: TrainingArguments
    state: TrainerState
    control: TrainerControl
    lr_scheduler: Any = None


class Loop:
    """One run's train / evaluate / predict over `Parts`."""

    def __init__(self, parts: Parts):
        self.p = parts
        self.train_metrics = MetricSet(parts.metrics)
        self.val_metrics = MetricSet(parts.metrics, prefix="val_")
        self.train_metrics.device = self.val_metrics.device = parts.fabric.device
        # One process in full precision: Fabric's wrappers only add checks and no-op conversions
        # (about 30 us a step), so the step calls the module, backward and optimizer directly.
        self.direct = _plain_single_device(parts.fabric)
        self.forward_module = parts.module._forward_module if self.direct else parts.module
        self.val: DataSource | None = None
        self.position: tuple[int, int] = (0, 0)  # (epoch, micro-batches consumed in it)
        self._epoch_rng: dict | None = None  # RNG at epoch start, for loaders that draw from it
        self.preempted = False  # acted on: checkpoint and stop at the end of this step
        self._sigterm = False  # seen by this process (several processes must agree first)
        self._agree_every = 0
        self._epoch_end_totals: tuple[float, int] | None = None
        self._run_loss, self._run_count = 0.0, 0  # over the whole run, for `train_loss`
        #: Writes a checkpoint when `control.should_save`; loads the best one at the end (set by the facade).
        self.save_fn: Callable[[], None] | None = None
        self.load_best_fn: Callable[[str], None] | None = None
        self._warned_best = False

    # -- one forward ------------------------------------------------------------------
    def forward(self, batch: Batch, with_loss: bool = True) -> tuple[torch.Tensor | None, Any]:
        module, loss_fn = self.forward_module, self.p.loss
        inputs, target = batch.inputs, batch.target
        if loss_fn is None and with_loss and target is not None:
            out = module(**inputs, labels=target) if isinstance(inputs, dict) else module(*inputs, target)
            return self._check(_model_loss(out)), _metric_outputs(out)
        out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
        if not with_loss:
            return None, out
        if loss_fn is None:  # a module that computes its loss from the inputs alone
            return self._check(_model_loss(out)), _metric_outputs(out)
        if target is None:
            return None, out
        return self._check(loss_fn(primary_output(out), target, batch.sample_weight)), out

    def _forward_backward(self, batch: Batch, cycle: int) -> tuple[torch.Tensor, Any]:
        loss, out = self.forward(batch)
        if loss is None:
            raise ValueError("training needs targets: pass `y`, or batches of (x, y), or a module that returns its loss")
        scaled = loss / cycle if cycle > 1 else loss
        scaled.backward() if self.direct else self.p.fabric.backward(scaled)
        return loss, out

    def _check(self, loss: torch.Tensor) -> torch.Tensor:
        if loss.dim() != 0:
            raise ValueError(
                f"the loss must be a scalar tensor but has shape {tuple(loss.shape)}: reduce it "
                "(for example `.mean()`), or use `reduction='mean'` in the loss module"
            )
        return loss

    # -- training -----------------------------------------------------------------------
    def train(self, train: DataSource, val: DataSource | None, resume: dict | None = None) -> None:
        """Run the epochs; `resume` is a `snapshot()` taken when a checkpoint was written."""
        p = self.p
        args, state, cb = p.args, p.state, p.handler
        module, optimizer = p.module, p.optimizer
        if self.direct:
            module, optimizer = self.forward_module, optimizer.optimizer
        accum = args.gradient_accumulation_steps
        n_batches = len(train) if train.has_len() else None
        self.val = val
        start_epoch = resume["epoch"] if resume else 0
        level = args.get_process_log_level(p.fabric.global_rank, p.fabric.local_rank)
        if level is not None:
            logger.setLevel(level)
        set_training(p.module, True)
        p.control = cb.on_train_begin(args, state, p.control)
        if resume:  # after on_train_begin, which resets Keras-style callbacks
            cb.load_states(resume["callbacks"], p.control)
        sigterm = args.save_on_sigterm if args.save_on_sigterm is not None else args.save_strategy != "no"
        # Processes may see SIGTERM at different steps: every few steps (the same ones on every
        # process) they compare notes and stop together once any has seen it.
        self._agree_every = PREEMPTION_CHECK_STEPS if sigterm and p.fabric.world_size > 1 else 0
        first_step = state.global_step
        figures = RunMetrics(p.fabric.device, memory=not args.skip_memory_metrics)
        try:
            with self._catch_sigterm(sigterm):
                for epoch in range(start_epoch, state.num_train_epochs):
                    self._run_epoch(epoch, train, n_batches, accum, module, optimizer,
                                    resume if resume and epoch == start_epoch else None)
                    if p.control.should_training_stop:
                        break
        except StopTraining as stop:
            reason = str(stop) or type(stop).__name__
            logger.warning("training stopped: %s", reason)
            p.control.should_training_stop = True
            state.log_history.append({"stopped": reason, "epoch": state.epoch, "step": state.global_step})
        if args.load_best_model_at_end and state.best_model_checkpoint and self.load_best_fn is not None:
            self.load_best_fn(state.best_model_checkpoint)
        steps = state.global_step - first_step
        samples = steps * args.batch_size * args.gradient_accumulation_steps * p.fabric.world_size
        summary = figures.finish(samples, steps)
        if self._run_count:
            summary["train_loss"] = self._run_loss / self._run_count
        self.log(summary)  # HF's closing record, before on_train_end
        p.control = cb.on_train_end(args, state, p.control, preempted=self.preempted)

    @contextlib.contextmanager
    def _catch_sigterm(self, enabled: bool):
        """While training, SIGTERM (SLURM, Kubernetes) asks for a checkpoint and a clean stop."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            logger.warning("SIGTERM received: finishing this step, then checkpointing and stopping")
            self._sigterm = True
            if self.p.fabric.world_size == 1:
                self.preempted = True

        previous = signal.signal(signal.SIGTERM, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _any_process(self, flag: bool) -> bool:
        """True on every process when `flag` is true on any of them."""
        fabric = self.p.fabric
        seen = torch.tensor(1.0 if flag else 0.0, device=fabric.device)
        return bool(fabric.all_reduce(seen, reduce_op="max") > 0)

    def _run_epoch(self, epoch, train, n_batches, accum, module, optimizer, resume=None) -> None:
        p = self.p
        args, state, fabric, cb = p.args, p.state, p.fabric, p.handler
        p.control = cb.on_epoch_begin(args, state, p.control)
        self.train_metrics.reset()
        self.running = RunningLoss(fabric.device)
        self._logged_loss, self._logged_count = 0.0, 0
        start = self._restore_epoch(resume) if resume else 0
        batches = self._epoch_batches(train, epoch, start, resume)
        metrics = self.train_metrics if self.train_metrics else None
        clip = args.max_grad_norm
        scheduler = p.lr_scheduler
        micro, cycle = 0, 1
        running = self.running
        zero_grad = _grad_clearer(optimizer, self.direct)
        for i, batch in enumerate(batches, start):
            if micro == 0:
                cycle = accum if n_batches is None else min(accum, n_batches - i)
                p.control = cb.on_step_begin(args, state, p.control)
            micro += 1
            last = micro == cycle
            if cycle > 1 and not self.direct:  # one device has no gradient sync to skip
                with fabric.no_backward_sync(module, enabled=not last):
                    loss, out = self._forward_backward(batch, cycle)
            else:
                loss, out = self._forward_backward(batch, cycle)
            running.add(loss, batch.size)
            if metrics is not None and batch.target is not None:
                metrics.update(out, batch.target)
            if not last:
                p.control = cb.on_substep_end(args, state, p.control)
                continue
            micro = 0
            if clip is not None:
                if self.direct:
                    torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
                else:
                    fabric.clip_gradients(module, optimizer, max_norm=clip)
            p.control = cb.on_pre_optimizer_step(args, state, p.control)
            optimizer.step()
            p.control = cb.on_optimizer_step(args, state, p.control)
            if scheduler is not None:
                scheduler.step()
            zero_grad()
            state.global_step += 1
            state.epoch = epoch + (i + 1) / n_batches if n_batches else float(epoch)
            self.position = (epoch, i + 1)  # where a checkpoint written from here resumes
            p.control = cb.on_step_end(args, state, p.control)
            c = p.control
            if self._agree_every and state.global_step % self._agree_every == 0:
                self.preempted = self._any_process(self._sigterm)
            if self.preempted:  # SIGTERM: finish this step, checkpoint, stop
                c.should_save = c.should_training_stop = True
            if c.should_log or c.should_evaluate or c.should_save:
                self._log_evaluate_save(epoch_end=False)
            if c.should_epoch_stop or c.should_training_stop:
                break
        stopped = p.control.should_epoch_stop or p.control.should_training_stop
        if n_batches is None or not stopped or state.epoch is None:
            state.epoch = float(epoch + 1)
        p.control = cb.on_epoch_end(args, state, p.control)
        self.position = (epoch + 1, 0)
        self._epoch_end_totals = self._epoch_totals()  # the epoch's one host read
        self._run_loss += self._epoch_end_totals[0]
        self._run_count += self._epoch_end_totals[1]
        self._log_evaluate_save(epoch_end=True)
        self._epoch_end_totals = None

    def _restore_epoch(self, resume: dict) -> int:
        """Put back the resumed epoch's running sums; return the micro-batches it had consumed."""
        fabric, start = self.p.fabric, resume["batch"]
        if not start:
            return 0
        self._logged_count, self._logged_loss = resume["logged_count"], resume["logged_loss"]
        by_rank = resume.get("by_rank")
        if by_rank and len(by_rank) == fabric.world_size:  # each process continues its own sums
            self.running.set(by_rank[fabric.global_rank][0], int(by_rank[fabric.global_rank][1]))
        elif fabric.global_rank == 0:  # another world size: count the global sums once
            self.running.set(resume["epoch_loss"], resume["epoch_count"])
        if fabric.global_rank == 0:  # metric states were synced over all processes when saved
            self.train_metrics.load_state(resume.get("metrics"))
        return start

    def _epoch_batches(self, train: DataSource, epoch: int, start: int, resume: dict | None):
        """The epoch's batches from `start`, with the RNG where the first run had it."""
        replay = resume.get("epoch_rng") if resume else None
        if resume:
            set_rng_state(replay or resume["rng"])
        if train.replays_rng:
            self._epoch_rng = replay or rng_state()
        batches = train.batches(epoch, start)
        if replay:  # the epoch's order was drawn as in the first run; now continue its RNG
            set_rng_state(resume["rng"])
        return batches

    def snapshot(self) -> dict:
        """Where the loop is, for a checkpoint: data position and the epoch's running sums."""
        epoch, batch = self.position
        snap = {"epoch": epoch, "batch": batch, "epoch_loss": 0.0, "epoch_count": 0,
                "logged_loss": 0.0, "logged_count": 0, "metrics": None}
        if batch:  # mid-epoch: the epoch-end averages must include what was seen before
            total, count = self._epoch_totals()  # over all processes
            fabric = self.p.fabric
            if fabric.world_size > 1:
                local = torch.stack([self.running.total.double(), torch.tensor(float(self.running.count),
                                     dtype=torch.float64, device=fabric.device)])
                snap["by_rank"] = fabric.all_gather(local).reshape(fabric.world_size, 2).tolist()
            snap.update(epoch_loss=total, epoch_count=count,
                        logged_loss=self._logged_loss, logged_count=self._logged_count,
                        metrics=self.train_metrics.export_state(), epoch_rng=self._epoch_rng)
        return snap

    def _epoch_totals(self) -> tuple[float, int]:
        """The epoch's loss sum and sample count so far, over all processes."""
        fabric = self.p.fabric
        if fabric.world_size == 1:
            return float(self.running.total), self.running.count
        local = torch.stack([self.running.total.double(),
                             torch.tensor(float(self.running.count), dtype=torch.float64, device=fabric.device)])
        total = fabric.all_reduce(local, reduce_op="sum").tolist()
        return total[0], int(total[1])

    def _log_evaluate_save(self, epoch_end: bool) -> None:
        p = self.p
        args, state, cb = p.args, p.state, p.handler
        if p.control.should_log:
            logs: dict[str, float] = {}
            total, count = self._epoch_end_totals or self._epoch_totals()  # one host read per logging step
            if epoch_end and count:
                logs["loss"] = total / count
                logs.update(self.train_metrics.compute())
            elif count > self._logged_count:
                logs["loss"] = (total - self._logged_loss) / (count - self._logged_count)
                self._logged_loss, self._logged_count = total, count
            logs["learning_rate"] = float(p.optimizer.param_groups[0]["lr"])
            self.log(logs)
        if p.control.should_evaluate and self.val is not None:
            metrics = self.evaluate(self.val, prefix="val_")
            self.log(dict(metrics))
            p.control = cb.on_evaluate(args, state, p.control, metrics)
            if self._track_best(metrics) and args.save_strategy == "best":  # after on_evaluate, as HF
                p.control.should_save = True
        p.control.should_evaluate = False
        if p.control.should_save and self.save_fn is not None:
            self.save_fn()
            p.control = cb.on_save(args, state, p.control)
        p.control.should_save = False

    def _track_best(self, metrics: dict[str, float]) -> bool:
        """Update `state.best_metric` from an evaluation; True when this one is the new best."""
        args, state = self.p.args, self.p.state
        name = args.metric_for_best_model
        if name not in metrics:
            if not self._warned_best:
                logger.warning("`metric_for_best_model`=%r is not among the evaluation values %s; "
                               "no best model is tracked", name, sorted(metrics))
                self._warned_best = True
            return False
        value = metrics[name]
        greater = args.greater_is_better if args.greater_is_better is not None else "loss" not in name
        best = state.best_metric
        if best is None or (value > best if greater else value < best):
            state.best_metric, state.best_global_step = value, state.global_step
            return True
        return False

    def log(self, logs: dict[str, float]) -> None:
        p = self.p
        state = p.state
        if state.epoch is not None:
            logs["epoch"] = round(state.epoch, 4)
        record = {**logs, "step": state.global_step}
        state.log_history.append(record)
        p.control = p.handler.on_log(p.args, state, p.control, logs)

    # -- evaluation and prediction ------------------------------------------------------------
    def evaluate(self, source: DataSource, prefix: str = "") -> dict[str, float]:
        """Exact averages over `source`: loss weighted by samples, metrics over all of them."""
        p = self.p
        fabric, module, cb = p.fabric, p.module, p.handler
        metrics = self.val_metrics if prefix else MetricSet(p.metrics)
        metrics.reset()
        was_training = module.training
        set_training(module, False)
        total = torch.zeros((), device=fabric.device, dtype=torch.float64)
        count, with_loss = 0, False
        try:
            with torch.no_grad():
                for batch in source.batches(0):
                    loss, out = self.forward(batch)
                    if loss is not None:
                        total += loss.detach().double() * batch.size
                        with_loss = True
                    count += batch.size
                    if metrics and batch.target is not None:
                        metrics.update(out, batch.target)
                    p.control = cb.on_prediction_step(p.args, p.state, p.control)
        finally:
            set_training(module, was_training)
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
        p = self.p
        module, cb = p.module, p.handler
        was_training = module.training
        set_training(module, False)
        outputs: list = []
        try:
            with torch.no_grad():
                for batch in source.batches(0):
                    _, out = self.forward(batch, with_loss=False)
                    outputs.append(map_tensors(torch.Tensor.detach, out))
                    p.control = cb.on_prediction_step(p.args, p.state, p.control)
        finally:
            set_training(module, was_training)
        if not outputs and p.fabric.world_size == 1:
            raise ValueError("`x` is empty: pass at least one sample to predict")
        out = _concat(outputs) if outputs else None
        if p.fabric.world_size > 1:
            out = _gather_blocks(p.fabric, out)
        return to_cpu(out)


def _grad_clearer(optimizer: Any, direct: bool) -> Callable[[], None]:
    """`optimizer.zero_grad(set_to_none=True)`. On the direct path, for a torch optimizer that
    keeps torch's own `zero_grad`, the same loop without its profiler annotation and compiler
    guard (about 10 us a step on a small network)."""
    plain = isinstance(optimizer, torch.optim.Optimizer) and type(optimizer).zero_grad is torch.optim.Optimizer.zero_grad
    if not (direct and plain):
        return lambda: optimizer.zero_grad(set_to_none=True)

    def clear() -> None:
        for group in optimizer.param_groups:  # read each time: a callback may add a group
            for param in group["params"]:
                param.grad = None

    return clear


def _plain_single_device(fabric) -> bool:
    """One device, full precision, no Fabric callbacks: nothing for Fabric's wrappers to do."""
    from lightning_fabric.plugins import Precision
    from lightning_fabric.strategies import SingleDeviceStrategy

    return (type(fabric.strategy) is SingleDeviceStrategy and type(fabric.strategy.precision) is Precision
            and not fabric._callbacks)


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
