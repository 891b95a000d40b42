"""`Trainer`: one call of a model (fit, evaluate or predict), from user input to the loop.

`fit` reads top-down: seed, set up the module and optimizer, adapt the data, plan the run,
wire the callbacks, resume when asked, train::

    trainer = Trainer(runtime, module, config, args, handler)
    trainer.fit(x, y, validation_split=0.2)
    trainer.state.global_step, trainer.checkpointer.last

The `Model` facade builds one per call; nothing here knows the facade.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch

from fitkit.adapters.label_smoothing import label_smoothing_for
from fitkit.adapters.metric_specs import metric_directions
from fitkit.adapters.optimizers import build_scheduler
from fitkit.common.schedule import epoch_batches, interval_steps, plan, steps_per_epoch
from fitkit.common.wrappers import torch_optimizer, unwrapped
from fitkit.config.arguments import TrainingArguments
from fitkit.config.compile_config import CompileConfig
from fitkit.config.hf_arguments import neftune_noise, prepare_module, run_optimizer
from fitkit.engine.batch_size_search import with_smaller_batches
from fitkit.engine.checkpoint.checkpointer import Checkpointer
from fitkit.engine.checkpoint.verify import resumed_batch_size
from fitkit.engine.checks import check_data, keeps_float64
from fitkit.engine.data.adapt import adapt
from fitkit.engine.data.batch import Batch
from fitkit.engine.data.hf_columns import drop_unused_columns
from fitkit.engine.data.keras_data import class_weight_table, split_validation
from fitkit.engine.data.loader_source import LoaderSource
from fitkit.engine.data.loader_view import eval_loader
from fitkit.engine.data.rng import seed_everything, set_rng_state
from fitkit.engine.data.sources import DataSource, TensorSource
from fitkit.engine.devices.fabric import release_at_exit
from fitkit.engine.devices.host_allocator import keep_freed_memory
from fitkit.engine.inference import cast_for_full_eval
from fitkit.engine.loop import Loop
from fitkit.engine.overrides import StepOverrides
from fitkit.engine.policy import policy_for
from fitkit.engine.run_context import RunContext
from fitkit.engine.runtime import Runtime
from fitkit.engine.step import Stepper
from fitkit.events.handler import CallbackHandler
from fitkit.events.hf_view import evaluated_metrics
from fitkit.events.state import TrainerControl, TrainerState

logger = logging.getLogger("fitkit")


class Trainer:
    """Runs one call over a `Runtime`: `fit`, `evaluate` or `predict`.

    `config` is the compile configuration (None before `compile`: then only `predict` runs);
    `handler` holds this call's callbacks; `overrides` the steps a `Model` subclass overrides.
    After the call, `state` and `control` are the run's, and `checkpointer.last` the newest
    checkpoint `fit` wrote.
    """

    def __init__(self, runtime: Runtime, module: torch.nn.Module, config: CompileConfig | None,
                 args: TrainingArguments, handler: CallbackHandler, overrides: StepOverrides | None = None) -> None:
        self.runtime, self.module, self.config = runtime, module, config
        release_at_exit(runtime.release)  # the set-up module holds the process group: see fabric._teardown
        self.args, self.handler = args, handler
        self.overrides = overrides or StepOverrides()
        self.state: TrainerState | None = None
        self.control = TrainerControl()
        self.checkpointer: Checkpointer | None = None
        self.collected: tuple[Any, Any] | None = None  # evaluate(keep=True): (predictions, label_ids)
        self.context = RunContext(args, policy_for(args))  # the call's: made anew once its arguments are settled

    # -- fit ------------------------------------------------------------------------------------
    def fit(self, x: Any, y: Any = None, *, sample_weight: Any = None, validation_data: Any = None,
            validation_split: float = 0.0, class_weight: dict | None = None, trial: dict | None = None,
            initial_epoch: int = 0, start_rng: dict | None = None) -> None:
        """Train. `trial` (`{"trial_name", "trial_params"}`) marks a search trial's run;
        `initial_epoch` (Keras) the epoch to start at; `start_rng`: the global generators' state
        to start from instead of seeding them with `seed` (the module was just built under the
        seed, as HF's Trainer builds it from `model_init`). After a SIGTERM the checkpoint is
        written, `on_train_end` fires and `SystemExit(0)` is raised."""
        config = self.config
        assert config is not None  # `Model.fit` requires compile first
        if start_rng is None:
            seed_everything(self.args.seed)
        else:
            set_rng_state(start_rng)
        prepare_module(self.module, self.args)
        # Keras' `trainable` flags; frozen or unfrozen since compile: Keras' warning (not the HF Trainer's habit)
        self.runtime.check_trainable(self.module, warn=self.context.policy.warns_on_trainable_change)
        fabric, wrapped = self.runtime.setup(self.module, self.args)
        if self.args.tune_cpu_allocator and fabric.device.type == "cpu" and self.args.strategy != "fsdp":
            keep_freed_memory()  # steps stop faulting in their gradients afresh (FSDP: map_large_blocks)
        optimizer = self.runtime.optimizer_for(run_optimizer(config.optimizer, self.args), self.args)

        def attempt(size: int) -> None:  # HF's auto_find_batch_size: a run again with smaller batches
            if size != self.args.batch_size:
                self.args = self.args.settled(per_device_train_batch_size=size)
            self._train(config, fabric, wrapped, optimizer, x, y, sample_weight, validation_data, validation_split,
                        class_weight, trial, initial_epoch)

        # a resume starts at the size the checkpoint trained at (one the search shrank to), as the Trainer's
        start = resumed_batch_size(fabric, self.args) or self.args.batch_size
        with_smaller_batches(attempt, start, self.args.auto_find_batch_size)

    def _train(self, config: CompileConfig, fabric: Any, wrapped: torch.nn.Module, optimizer: Any, x: Any, y: Any,
               sample_weight: Any, validation_data: Any, validation_split: float, class_weight: dict | None,
               trial: dict | None, initial_epoch: int) -> None:
        """One training run over the set-up module and optimizer: the data, the plan, the loop."""
        train, val = self._sources(x, y, sample_weight, validation_data, validation_split)
        if class_weight is not None:
            assert isinstance(train, (TensorSource, LoaderSource))  # the sources `adapt` makes
            train.class_weight = class_weight_table(class_weight, fabric.device)
        args = _with_evaluation(self.args, val)
        self.context = RunContext(args, policy_for(args), first_epoch=initial_epoch)
        batches = epoch_batches(len(train) if train.has_len() else None, args.steps_per_epoch)  # per epoch
        state = self.state = self._new_state(batches, fabric, trial, initial_epoch)
        # Built over the torch optimizer that is stepped (not Fabric's wrapper), so torch sees
        # each step and does not warn that the scheduler stepped first.
        scheduler = build_scheduler(args.lr_scheduler, torch_optimizer(optimizer), state.max_steps or 1,
                                    args.warmup_steps or math.ceil(args.warmup_ratio * state.max_steps))
        self.runtime.keep(scheduler=scheduler)  # the last fit's, for `Model.save`
        loop = self._fit_loop(config, state, wrapped, optimizer, scheduler, train, val, batches)
        # The first batches against the module, loss and metrics: before any step or file.
        memo, own = self.runtime.checked, self.overrides
        if own.train_step is None:  # an overridden step decides what a batch is
            check_data(loop.stepper, self.module, train, metrics=config.logged_metrics, training=True, memo=memo,
                       seen=self._keep_example)
        if own.test_step is None:
            check_data(loop.stepper, self.module, val, metrics=config.logged_metrics, memo=memo)
        checkpointer = loop.checkpointer
        assert checkpointer is not None  # a fit's loop has one (`_fit_loop`)
        with checkpointer.writing():  # one run writes into output_dir at a time
            resume = checkpointer.resume(checkpointer.resume_path(self.handler.callbacks), epoch_length=batches)
            try:
                with self._running(loop), neftune_noise(self.module, args):
                    loop.train(train, val, resume)
            finally:
                self.control = loop.control
                self.handler.close_run()  # also after an exception or KeyboardInterrupt: e.g. a live display
        for metrics in (loop.train_metrics, loop.val_metrics):  # read and saved: their objects serve the next run
            metrics.release()
        if loop.preemption.preempted:
            # A scheduler sent SIGTERM: the checkpoint is written and on_train_end has fired.
            logger.warning("preempted: checkpoint written to %s; rerun with resume_from_checkpoint=True",
                           checkpointer.last)
            raise SystemExit(0)

    def _keep_example(self, batch: Batch) -> None:
        """The first training inputs read from a loader, for `summary()`'s shapes."""
        self.runtime.keep_example(batch.inputs)

    def _fit_loop(self, config: CompileConfig, state: TrainerState, wrapped: torch.nn.Module, optimizer: Any,
                  scheduler: Any, train: DataSource, val: DataSource | None, batches: int | None) -> Loop:
        """The loop of a fit, with its checkpointer, and the callbacks' event keywords wired."""
        fabric, handler = self.runtime.fabric, self.handler
        directions = metric_directions(config.metrics)
        self.control = TrainerControl()
        args = self.context.args
        assert args is not None  # a fit's context has its settled arguments
        self.checkpointer = Checkpointer(fabric, args, state, handler, module=wrapped, optimizer=optimizer,
                                         scheduler=scheduler, defer_copy=self.overrides.train_step is None)
        stepper = Stepper(fabric, wrapped, optimizer, config.loss_fn, self.overrides.compute_loss,
                          label_smoothing_for(args, wrapped))
        stepper.freeze_norms = self.context.policy.freezes_frozen_norms
        stepper.sync_each_batch = args.sync_each_batch
        loop = Loop(stepper, handler, self.context, state, self.control, metrics=config.logged_metrics,
                    scheduler=scheduler, checkpointer=self.checkpointer, directions=directions,
                    overrides=self.overrides, epoch_length=batches)
        handler.set_run(model=self.module, optimizer=optimizer, lr_scheduler=scheduler,
                        train_dataloader=getattr(train, "loader", None),
                        eval_dataloader=eval_loader(val),  # sized for in-memory data too
                        metric_directions=directions, save_checkpoint=loop.checkpoint,
                        steps_per_epoch=None if batches is None else steps_per_epoch(
                            batches, args.gradient_accumulation_steps),
                        running_logs=loop.running_logs,
                        # an asynchronous save's copy of the weights is waited for before any callback runs
                        before_listeners=self.checkpointer.wait_copied if args.save_async else None)
        return loop

    def _sources(self, x: Any, y: Any, sample_weight: Any, validation_data: Any,
                 validation_split: float) -> tuple[DataSource, DataSource | None]:
        """The training source and the validation one (None without validation data)."""
        args = self.args
        order_seed = args.seed if args.data_seed is None else args.data_seed  # HF's `data_seed`: the order's own
        shuffle = args.shuffle and args.train_sampling_strategy != "sequential"
        batch_size = per_process_batch(args, self.runtime.fabric.world_size)
        train, tensors = self._source(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
                                      seed=order_seed, pad=True)
        if validation_split:
            if validation_data is not None:
                raise ValueError("pass either `validation_data` or `validation_split`, not both")
            (tx, ty, tsw), (vx, vy, vsw) = split_validation(tensors, x, validation_split)
            train, _ = self._source(tx, ty, tsw, batch_size=batch_size, shuffle=shuffle, seed=order_seed,
                                    pad=True)
            val, _ = self._source(vx, vy, vsw, batch_size=args.eval_batch_size, shuffle=False, seed=None, pad=False,
                                  name="validation_split")
            return train, val
        if validation_data is not None:
            val, _ = self._source(validation_data, None, None, batch_size=args.eval_batch_size, shuffle=False,
                                  seed=None, pad=False, name="validation_data")
            return train, val
        return train, None

    def _source(self, x: Any, y: Any, sample_weight: Any, *, batch_size: int, shuffle: bool, seed: int | None,
                pad: bool, name: str = "x") -> tuple[DataSource, tuple | None]:
        if not (self.overrides.train_step or self.overrides.test_step or self.overrides.predict_step):
            x = drop_unused_columns(x, self.module, self.args, name)  # HF's remove_unused_columns
        source, tensors = adapt(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed, name=name,
                                cast_float64=not keeps_float64(self.module), args=self.args, training=pad)
        assert source is not None  # `adapt` makes one or raises
        return self.runtime.place(source, pad), tensors

    def _new_state(self, batches: int | None, fabric: Any, trial: dict | None, initial_epoch: int = 0) -> TrainerState:
        """The plan of a run over epochs of `batches` micro-batches (None: unknown)."""
        args = self.context.args
        assert args is not None  # a fit's context has its settled arguments
        epochs, max_steps = plan(batches, epochs=args.num_train_epochs, max_steps=args.max_steps,
                                 accumulation=args.gradient_accumulation_steps)
        state = TrainerState(
            epoch=0.0, max_steps=max_steps, num_train_epochs=epochs, train_batch_size=args.batch_size,
            logging_steps=interval_steps(args.logging_steps, max_steps),
            # HF's state keeps its default unless evaluations come by steps (a Trainer checkpoint compares it)
            eval_steps=interval_steps(args.eval_steps or args.logging_steps, max_steps)
            if args.eval_steps or args.eval_strategy == "steps" else TrainerState.eval_steps,
            save_steps=interval_steps(args.save_steps, max_steps), is_world_process_zero=fabric.is_global_zero,
            is_local_process_zero=fabric.local_rank == 0,
        )
        if trial is not None:
            state.is_hyper_param_search = True
            state.trial_name, state.trial_params = trial["trial_name"], trial["trial_params"]
        if initial_epoch:
            _start_at_epoch(state, initial_epoch, batches, args)
        return state

    # -- evaluate and predict --------------------------------------------------------------------
    def evaluate(self, x: Any, y: Any = None, *, sample_weight: Any = None, batch_size: int = 32,
                 state: TrainerState, control: TrainerControl, steps: int | None = None,
                 keep: bool = False, announce: bool = True) -> dict[str, float]:
        """Loss and metrics over `x`, unprefixed; fires `on_prediction_step` and `on_evaluate`
        (`announce=False`: the caller fires it, after logging the record, as HF's `evaluate()`).
        `keep`: the gathered predictions and labels are kept in `collected` (HF's `predict`)."""
        loop = self._eval_loop(state, control)
        source, _ = self._source(x, y, sample_weight, batch_size=batch_size, shuffle=False, seed=None, pad=False)
        if self.overrides.test_step is None:
            check_data(loop.stepper, self.module, source, metrics=loop.metric_specs, memo=self.runtime.checked)
        with self._running(loop):
            metrics = loop.evaluate(source, steps=steps, keep=keep)
        self.collected = loop.collected
        self.control = loop.control
        if announce:
            self.control = self.handler.on_evaluate(self.args, state, self.control,
                                                    evaluated_metrics(metrics, self.args, state))
        return metrics

    def predict(self, x: Any, *, batch_size: int = 32, state: TrainerState, control: TrainerControl,
                steps: int | None = None) -> Any:
        """The outputs for every sample of `x`; fires `on_prediction_step` and `on_predict`."""
        loop = self._eval_loop(state, control)
        if isinstance(x, tuple) and len(x) in (2, 3) and all(isinstance(v, torch.Tensor) for v in x):
            x = x[0]  # an (x, y) pair: predict on x
        source, _ = self._source(x, None, None, batch_size=batch_size, shuffle=False, seed=None, pad=False)
        if self.overrides.predict_step is None:
            check_data(loop.stepper, self.module, source, with_loss=False, memo=self.runtime.checked)
        with self._running(loop):
            out = loop.predict(source, steps=steps)
        self.control = self.handler.on_predict(self.args, state, loop.control, {})
        return out

    @contextlib.contextmanager
    def _running(self, loop: Loop) -> Iterator[None]:
        """The block in which `loop` runs, its step tools on the runtime. At its end nothing
        that outlives the call (the handler, its callbacks) calls back into the loop, and the loop
        holds no method of its own: dropped, the loop frees its module and optimizer at once, as
        a search's next trial needs, with no garbage collection."""
        try:
            with self.runtime.running(loop.context):
                yield
        finally:
            loop.tools = loop.context.tools = None
            self.handler.set_run(save_checkpoint=None, before_listeners=None)

    def _eval_loop(self, state: TrainerState, control: TrainerControl) -> Loop:
        fabric, wrapped = self.runtime.setup(self.module, self.args)
        cast_for_full_eval(unwrapped(wrapped), self.args)  # HF's bf16 / fp16_full_eval: outside training only
        self.state, self.control = state, control
        state.is_world_process_zero = fabric.is_global_zero
        state.is_local_process_zero = fabric.local_rank == 0
        loss_fn, metrics = (self.config.loss_fn, self.config.logged_metrics) if self.config else (None, [])
        stepper = Stepper(fabric, wrapped, self.runtime.optimizer, loss_fn, self.overrides.compute_loss,
                          label_smoothing_for(self.args, wrapped))
        self.context = RunContext(self.args, policy_for(self.args))
        loop = Loop(stepper, self.handler, self.context, state, control, metrics=metrics, overrides=self.overrides)
        self.handler.set_run(model=self.module, running_logs=loop.running_logs)
        return loop


def _with_evaluation(args: TrainingArguments, val: DataSource | None) -> TrainingArguments:
    """`eval_strategy` settled (default: "epoch" with validation data, else "no") and checked
    against the data and `load_best_model_at_end`."""
    if args.eval_strategy is None:
        args = args.settled(eval_strategy="epoch" if val is not None else "no")
    if args.load_best_model_at_end and (args.save_strategy == "no" or args.eval_strategy == "no"):
        raise ValueError("`load_best_model_at_end=True` needs evaluation (validation data) and a `save_strategy` "
                         "('epoch', 'steps' or 'best') so that the best model is in a checkpoint")
    if args.eval_strategy != "no" and val is None:
        raise ValueError(f"`eval_strategy`={args.eval_strategy!r} needs `validation_data` or `validation_split`")
    return args


def _start_at_epoch(state: TrainerState, initial_epoch: int, batches: int | None, args: TrainingArguments) -> None:
    """Keras' `initial_epoch`: the run starts at that epoch, as if the earlier ones were done
    (so step counts, schedules of saves and evaluations, and the display line up)."""
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or initial_epoch < 0:
        raise ValueError(f"`initial_epoch`={initial_epoch!r} is invalid: pass the 0-based epoch to start at")
    if initial_epoch >= state.num_train_epochs:
        raise ValueError(f"`initial_epoch`={initial_epoch} leaves nothing to train: `epochs`={state.num_train_epochs} "
                         "is the epoch to stop at (as in Keras), not a count; pass epochs > initial_epoch")
    state.epoch = float(initial_epoch)
    if batches is not None:
        state.global_step = initial_epoch * (-(-batches // args.gradient_accumulation_steps))


def per_process_batch(args: TrainingArguments, world_size: int) -> int:
    """The training batch each process reads: with `split_batches`, Accelerate's rule (each batch of
    `per_device_train_batch_size` split among the processes, which must divide it), else the whole."""
    if world_size > 1 and not args.use_seedable_sampler:
        logger.warning("`use_seedable_sampler=False` on %d processes: each process draws the epoch's order from its "
                       "own global generator (the same draw while their seeds agree), not from the generator "
                       "Accelerate seeds once and shares", world_size)
    if not args.split_batches or world_size == 1:
        return args.batch_size
    if args.batch_size % world_size:
        raise ValueError(f"`split_batches=True`: the batch size ({args.batch_size}) needs to be a round multiple of "
                         f"the number of processes ({world_size}); pass a per_device_train_batch_size it divides")
    return args.batch_size // world_size

