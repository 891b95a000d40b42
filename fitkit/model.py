"""The `Model` facade: Keras' compile / fit / evaluate / predict over a PyTorch module.

    import torch
    from fitkit import Model

    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    model = Model(net).compile("adam", "cross_entropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=5, validation_split=0.2)
    model.evaluate(x_test, y_test)      # {"loss": ..., "accuracy": ...}
    model.predict(x_test)               # tensor, input order, on CPU

The facade holds configuration and the objects that outlive one call (the Fabric, the
set-up module, the optimizer); the loop lives in `fitkit.engine.loop`.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import logging
import sys
from typing import Any, Callable, Sequence

import torch

from fitkit.adapters.losses import build_loss
from fitkit.adapters.metrics import check_metrics
from fitkit.adapters.optimizers import build_optimizer, build_scheduler, check_optimizer
from fitkit.arguments import TrainingArguments
from fitkit.callbacks.base import CallbackHandler, TrainerCallback, TrainerControl, TrainerState
from fitkit.callbacks.flow import DefaultFlowCallback
from fitkit.callbacks.history import History
from fitkit.engine import checkpoint as ckpt
from fitkit.engine.data import BlockSampler, DataSource, TensorSource, adapt, evaluation_shard, split_validation
from fitkit.engine.loop import Loop, Parts
from fitkit.io import atomic_torch_save
from fitkit.summary import summarize
from fitkit.tensors import to_cpu

logger = logging.getLogger("fitkit")

#: Options of `fit` that are not `TrainingArguments` fields.
_FIT_ONLY = {"validation_data", "validation_split", "callbacks", "class_weight", "sample_weight", "args"}
_DEVICE_KEYS = ("accelerator", "devices", "strategy", "precision", "num_nodes")


def _call_model_init(model_init: Callable, trial: Any = None) -> torch.nn.Module:
    try:
        n_params = len(inspect.signature(model_init).parameters)
    except (TypeError, ValueError):
        n_params = 1
    module = model_init() if n_params == 0 else model_init(trial)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"`model_init` must return a torch.nn.Module, got {type(module).__name__}")
    return module


class Model:
    """Wrap an `nn.Module` (or a `model_init` factory) with Keras' training API."""

    def __init__(self, module: torch.nn.Module | None = None, *, model_init: Callable | None = None):
        if (module is None) == (model_init is None):
            raise ValueError("pass exactly one of `module` (an nn.Module) or `model_init` (a callable returning one)")
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"`module` must be a torch.nn.Module, got {type(module).__name__}")
        if model_init is not None and not callable(model_init):
            raise TypeError("`model_init` must be a callable taking no argument or a trial and returning an nn.Module")
        self._module = module
        self.model_init = model_init
        self._compiled: dict[str, Any] | None = None
        self._compile_args = TrainingArguments()
        self.callback_handler = CallbackHandler([DefaultFlowCallback()])
        self.history: History | None = None
        self.state: TrainerState = TrainerState()
        self.control = TrainerControl()
        self._fabric = None
        self._fabric_key: tuple | None = None
        self._wrapped = None
        self._wrapped_of: torch.nn.Module | None = None
        self._optimizer = None
        self._example: Any = None
        self.last_checkpoint: str | None = None
        self._search_context: dict | None = None
        self._in_spawned_process = False

    # -- properties ---------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        """The underlying `nn.Module` (built from `model_init` on first use)."""
        if self._module is None:
            self._module = _call_model_init(self.model_init)
        return self._module

    @property
    def callbacks(self) -> list[TrainerCallback]:
        """The callbacks in firing order (`DefaultFlowCallback` first)."""
        return list(self.callback_handler.callbacks)

    def add_callback(self, callback: TrainerCallback | type) -> None:
        """Add a callback (a class or an instance) to every later fit / evaluate / predict."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type) -> TrainerCallback | None:
        """Remove and return a callback (by class: the first of that class), or None."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type) -> None:
        """Remove a callback (a class or an instance)."""
        self.callback_handler.remove_callback(callback)

    # -- compile ------------------------------------------------------------------------
    def compile(self, optimizer: Any = "adam", loss: Any = None, metrics: Sequence | None = None,
                **options: Any) -> "Model":
        """Configure training; returns `self` so calls chain.

        `optimizer`: "adam", "adamw", "sgd", "rmsprop", "adagrad", an Optimizer subclass or
        instance, or a callable params -> optimizer. `loss`: a name ("cross_entropy", "mse",
        ...), an nn.Module, a callable (outputs, targets) -> tensor, or None when the module
        returns its loss. `metrics`: names, torchmetrics objects or callables. Options:
        `learning_rate`, `weight_decay`, `lr_scheduler`, `warmup_steps`, `warmup_ratio`,
        `max_grad_norm`, `gradient_accumulation_steps`, `accelerator`, `devices`, `strategy`,
        `precision`, `num_nodes`, and any other `TrainingArguments` field as a default for fit.
        """
        from fitkit.engine.fabric import check_devices

        check_optimizer(optimizer)
        loss_fn = build_loss(loss)
        metric_specs = check_metrics(metrics)
        args = TrainingArguments.from_options(**options)
        check_devices(args)
        self._compiled = {"optimizer": optimizer, "loss": loss, "loss_fn": loss_fn, "metrics": metric_specs,
                          "options": dict(options)}
        self._compile_args = args
        self._optimizer = None  # Keras: compiling again starts a fresh optimizer
        self.control = self.callback_handler.on_init_end(args, self.state, self.control)
        return self

    def _require_compiled(self, what: str) -> dict[str, Any]:
        if self._compiled is None:
            raise RuntimeError(f"call `compile(optimizer, loss, metrics)` before `{what}()`")
        return self._compiled

    # -- runtime (Fabric, set-up module, optimizer) -----------------------------------------
    def _launch(self, args: TrainingArguments):
        """The Fabric for these device options, created (and launched) once."""
        from fitkit.engine.fabric import build_fabric

        key = tuple(repr(getattr(args, k)) for k in _DEVICE_KEYS)
        if self._fabric is None or key != self._fabric_key:
            self._fabric = build_fabric(args)
            self._fabric_key = key
            self._wrapped = None
        return self._fabric

    def _setup(self, args: TrainingArguments):
        fabric = self._launch(args)
        if self._wrapped is None or self._wrapped_of is not self.module:
            self._wrapped = fabric.setup_module(self.module)
            self._wrapped_of = self.module
            self._optimizer = None
        return fabric, self._wrapped

    def _ensure_optimizer(self, fabric, args: TrainingArguments):
        compiled = self._require_compiled("fit")
        if self._optimizer is None:
            opt = build_optimizer(compiled["optimizer"], self._wrapped.parameters(), args.learning_rate,
                                  args.weight_decay, precision=args.precision)
            self._optimizer = fabric.setup_optimizers(opt)
        elif args.learning_rate is not None:
            for group in self._optimizer.param_groups:
                group["lr"] = args.learning_rate
                group.pop("initial_lr", None)
        return self._optimizer

    def _source(self, x, y, sample_weight, *, batch_size, shuffle, seed, fabric, pad, name="x",
                tensors_out: list | None = None) -> DataSource:
        source, tensors = adapt(x, y, sample_weight, batch_size=batch_size, shuffle=shuffle, seed=seed, name=name)
        if tensors_out is not None:
            tensors_out.append(tensors)
        return self._place(source, fabric, pad)

    def _place(self, source: DataSource, fabric, pad: bool) -> DataSource:
        if isinstance(source, TensorSource):
            if fabric.world_size > 1:
                source.shard(fabric.global_rank, fabric.world_size, pad)
            if fabric.device.type != "cpu":
                source.to(fabric.device)
            if self._example is None:
                self._example = source.x
        elif isinstance(getattr(source, "loader", None), torch.utils.data.DataLoader):
            loader, distributed = source.loader, fabric.world_size > 1
            if not distributed and fabric.device.type == "cpu":
                # The batches are already where the model is: Fabric's wrapper would only walk
                # each batch to move it nowhere (about 17 us a step).
                return source
            if distributed and not pad:
                loader = evaluation_shard(loader, fabric.global_rank, fabric.world_size)
            use_sampler = distributed and not isinstance(loader.sampler, BlockSampler)
            source.loader = fabric.setup_dataloaders(loader, use_distributed_sampler=use_sampler)
            source.distributed = distributed
        return source

    def _handler(self, extra: Sequence | None, *more: TrainerCallback) -> CallbackHandler:
        handler = CallbackHandler(self.callback_handler.callbacks)
        for cb in list(extra or ()) + list(more):
            handler.add_callback(cb)
        return handler

    # -- fit --------------------------------------------------------------------------------
    def fit(self, x: Any = None, y: Any = None, *, batch_size: int = 32, epochs: int = 1,
            validation_data: Any = None, validation_split: float = 0.0, callbacks: Sequence | None = None,
            shuffle: bool = True, max_steps: int | None = None, class_weight: dict | None = None,
            sample_weight: Any = None, args: TrainingArguments | None = None, **options: Any) -> History:
        """Train; returns the `History` (one value per epoch for each loss and metric).

        `x`: tensor, array, `(x, y[, sample_weight])` tuple, Dataset, DataLoader or iterable of
        batches. `validation_data` takes the same forms; `validation_split` holds out the last
        fraction of in-memory data (taken before shuffling, as Keras). Other options are
        `TrainingArguments` fields (`eval_strategy`, `logging_steps`, `save_strategy`,
        `output_dir`, `seed`, `verbose`, ...).
        """
        compiled = self._require_compiled("fit")
        call_args = args
        args = self._fit_args(args, batch_size=batch_size, epochs=epochs, shuffle=shuffle,
                              max_steps=max_steps, **options)
        if self._must_spawn(args):
            return self._spawned("fit", args, dict(
                x=x, y=y, batch_size=batch_size, epochs=epochs, validation_data=validation_data,
                validation_split=validation_split, callbacks=callbacks, shuffle=shuffle, max_steps=max_steps,
                class_weight=class_weight, sample_weight=sample_weight, args=call_args, **options))
        seed_everything(args.seed)
        fabric, module = self._setup(args)
        optimizer = self._ensure_optimizer(fabric, args)

        tensors: list = []
        train = self._source(x, y, sample_weight, batch_size=args.batch_size, shuffle=args.shuffle, seed=args.seed,
                             fabric=fabric, pad=True, tensors_out=tensors)
        val = None
        if validation_split:
            if validation_data is not None:
                raise ValueError("pass either `validation_data` or `validation_split`, not both")
            (tx, ty, tsw), (vx, vy, vsw) = _as_triples(split_validation(tensors[0], x, validation_split))
            train = self._source(tx, ty, tsw, batch_size=args.batch_size, shuffle=args.shuffle, seed=args.seed,
                                 fabric=fabric, pad=True)
            val = self._source(vx, vy, vsw, batch_size=args.eval_batch_size, shuffle=False, seed=None,
                               fabric=fabric, pad=False, name="validation_split")
        elif validation_data is not None:
            val = self._source(validation_data, None, None, batch_size=args.eval_batch_size, shuffle=False,
                               seed=None, fabric=fabric, pad=False, name="validation_data")
        if class_weight is not None:
            train.class_weight = _class_weights(class_weight, fabric.device)
        if args.eval_strategy is None:
            args = args.replace(eval_strategy="epoch" if val is not None else "no")
        if args.load_best_model_at_end and (args.save_strategy == "no" or args.eval_strategy == "no"):
            raise ValueError("`load_best_model_at_end=True` needs evaluation (validation data) and a `save_strategy` "
                             "('epoch', 'steps' or 'best') so that the best model is in a checkpoint")
        elif args.eval_strategy != "no" and val is None:
            raise ValueError(f"`eval_strategy`={args.eval_strategy!r} needs `validation_data` or `validation_split`")

        state = self._new_state(args, train, fabric)
        history = History()
        handler = self._handler(callbacks, history, *self._display(args), *self._reporters(args, callbacks))
        scheduler = build_scheduler(args.lr_scheduler, optimizer, state.max_steps or 1,
                                    args.warmup_steps or int(args.warmup_ratio * state.max_steps))
        handler.model, handler.optimizer, handler.lr_scheduler = self.module, optimizer, scheduler
        handler.train_dataloader = getattr(train, "loader", None)
        handler.eval_dataloader = getattr(val, "loader", None) if val is not None else None
        self.control = TrainerControl()
        parts = Parts(fabric=fabric, module=module, optimizer=optimizer, loss=compiled["loss_fn"],
                      metrics=compiled["metrics"], handler=handler, args=args, state=state, control=self.control,
                      lr_scheduler=scheduler)
        loop = Loop(parts)
        loop.save_fn = lambda: self._save_checkpoint(loop)
        handler.save_checkpoint = lambda directory, limit=None: self._save_checkpoint(loop, directory, limit)
        loop.load_best_fn = lambda path: ckpt.load_checkpoint(fabric, path, module=module, optimizer=None)
        resume = self._resume(parts, args, _backup_to_resume(handler.callbacks, args))
        self.state, self.history = state, history
        loop.train(train, val, resume)
        self.control = parts.control
        if loop.preempted:
            # A scheduler sent SIGTERM: the checkpoint is written and on_train_end has fired.
            logger.warning("preempted: checkpoint written to %s; rerun with resume_from_checkpoint=True",
                           self.last_checkpoint)
            raise SystemExit(0)
        return history

    def _resume(self, parts: Parts, args: TrainingArguments, backup: str | None) -> dict | None:
        """Load the checkpoint to resume from into `parts`; return what the loop restores itself
        (data position, running sums, RNG and callback states)."""
        path = ckpt.resolve(args.resume_from_checkpoint, args.output_dir) if args.resume_from_checkpoint else backup
        if path is None:
            return None
        payload = ckpt.load_checkpoint(parts.fabric, path, module=parts.module, optimizer=parts.optimizer)
        if parts.lr_scheduler is not None and "scheduler" in payload:
            parts.lr_scheduler.load_state_dict(payload["scheduler"])
        saved = TrainerState.load_from_json(os.path.join(path, ckpt.STATE_FILE))
        state = parts.state
        for name in ("epoch", "global_step", "log_history", "best_metric", "best_global_step",
                     "best_model_checkpoint", "total_flos", "num_input_tokens_seen", "stateful_callbacks"):
            setattr(state, name, getattr(saved, name))
        logger.info("resuming from %s at step %d", path, state.global_step)
        return {**payload["loop"], "rng": payload["rng"], "callbacks": state.stateful_callbacks}

    def _fit_args(self, args: TrainingArguments | None, **options: Any) -> TrainingArguments:
        if args is not None:
            if not isinstance(args, TrainingArguments):
                raise TypeError(f"`args` must be a fitkit.TrainingArguments, got {type(args).__name__}")
            return args
        merged = {**self._compiled["options"], **{k: v for k, v in options.items() if v is not None}}
        return self._compile_args.replace(**merged) if merged else self._compile_args

    def _new_state(self, args: TrainingArguments, train: DataSource, fabric) -> TrainerState:
        state = self._state_for(args, train, fabric)
        if self._search_context is not None:
            state.is_hyper_param_search = True
            state.trial_name = self._search_context["trial_name"]
            state.trial_params = self._search_context["trial_params"]
        return state

    def _state_for(self, args: TrainingArguments, train: DataSource, fabric) -> TrainerState:
        epochs = args.num_train_epochs
        if train.has_len():
            steps_per_epoch = max(1, -(-len(train) // args.gradient_accumulation_steps))
            if args.max_steps > 0:
                epochs = -(-args.max_steps // steps_per_epoch)
                max_steps = args.max_steps
            else:
                max_steps = epochs * steps_per_epoch
        else:
            max_steps = max(args.max_steps, 0)
            if args.max_steps > 0:
                epochs = sys.maxsize
        return TrainerState(
            epoch=0.0, max_steps=max_steps, num_train_epochs=epochs, train_batch_size=args.batch_size,
            logging_steps=args.logging_steps, eval_steps=args.eval_steps or args.logging_steps,
            save_steps=args.save_steps, is_world_process_zero=fabric.is_global_zero,
            is_local_process_zero=fabric.local_rank == 0,
        )

    def _display(self, args: TrainingArguments) -> list[TrainerCallback]:
        from fitkit.callbacks.progress import ProgressBar

        verbose = args.verbose
        if verbose == "auto":
            verbose = 1 if sys.stdout.isatty() or _in_notebook() else 2
        if verbose == 0 or any(isinstance(cb, ProgressBar) for cb in self.callback_handler.callbacks):
            return []
        return [ProgressBar(bar=verbose == 1)]

    def _reporters(self, args: TrainingArguments, extra: Sequence | None = None) -> list[TrainerCallback]:
        """The tracking callbacks `report_to` names (each integration imported only when named),
        except those already given as callbacks."""
        if args.report_to in (None, "none", [], ["none"]):
            return []
        from fitkit.integrations import callbacks_for

        given = [*self.callback_handler.callbacks, *(extra or ())]
        present = {cb if isinstance(cb, type) else type(cb) for cb in given}
        return [cb for cb in callbacks_for(args.report_to) if type(cb) not in present]

    def _save_checkpoint(self, loop: Loop, directory: str | None = None, limit: int | None = None) -> str:
        """Write a resumable checkpoint into `directory` (default `output_dir`) and rotate."""
        p = loop.p
        own = directory is None
        directory = p.args.output_dir if own else directory
        p.state.stateful_callbacks = p.handler.export_states(p.control)
        if own and p.state.best_global_step == p.state.global_step:  # this checkpoint holds the best model
            p.state.best_model_checkpoint = ckpt.checkpoint_path(directory, p.state.global_step)
        extra = {"rng": ckpt.rng_state(), "loop": loop.snapshot()}
        path = ckpt.save_checkpoint(p.fabric, directory, state=p.state, args=p.args, module=p.module,
                                    optimizer=p.optimizer, scheduler=p.lr_scheduler, extra=extra)
        if p.fabric.is_global_zero:
            if own:
                ckpt.rotate(directory, p.args.save_total_limit, keep=p.state.best_model_checkpoint)
            else:
                ckpt.rotate(directory, limit)
        if own:
            self.last_checkpoint = path
        return path

    # -- evaluate / predict -----------------------------------------------------------------
    def _loop_for(self, callbacks: Sequence | None, args: TrainingArguments) -> Loop:
        compiled = self._compiled or {"loss_fn": None, "metrics": []}
        fabric, module = self._setup(args)
        handler = self._handler(callbacks)
        handler.model = self.module
        state = self.state
        state.is_world_process_zero = fabric.is_global_zero
        state.is_local_process_zero = fabric.local_rank == 0
        parts = Parts(fabric=fabric, module=module, optimizer=self._optimizer, loss=compiled["loss_fn"],
                      metrics=compiled["metrics"], handler=handler, args=args, state=state, control=self.control)
        return Loop(parts)

    def evaluate(self, x: Any = None, y: Any = None, *, batch_size: int = 32, callbacks: Sequence | None = None,
                 sample_weight: Any = None) -> dict[str, float]:
        """Loss and metrics over `x` (exact dataset averages), unprefixed: `{"loss": ..., "accuracy": ...}`."""
        self._require_compiled("evaluate")
        args = self._compile_args
        if self._must_spawn(args):
            return self._spawned("evaluate", args, dict(x=x, y=y, batch_size=batch_size, callbacks=callbacks,
                                                         sample_weight=sample_weight))
        loop = self._loop_for(callbacks, args)
        source = self._source(x, y, sample_weight, batch_size=batch_size, shuffle=False, seed=None,
                              fabric=loop.p.fabric, pad=False)
        metrics = loop.evaluate(source)
        self.control = loop.p.handler.on_evaluate(args, loop.p.state, loop.p.control, metrics)
        return metrics

    def predict(self, x: Any, *, batch_size: int = 32, callbacks: Sequence | None = None) -> Any:
        """The module's outputs for every sample of `x`, concatenated in input order, on CPU."""
        args = self._compile_args
        if self._must_spawn(args):
            return self._spawned("predict", args, dict(x=x, batch_size=batch_size, callbacks=callbacks))
        loop = self._loop_for(callbacks, args)
        if isinstance(x, tuple) and len(x) in (2, 3) and all(isinstance(v, torch.Tensor) for v in x):
            x = x[0]  # an (x, y) pair: predict on x
        source = self._source(x, None, None, batch_size=batch_size, shuffle=False, seed=None,
                              fabric=loop.p.fabric, pad=False)
        out = loop.predict(source)
        self.control = loop.p.handler.on_predict(args, loop.p.state, loop.p.control, {})
        return out

    # -- spawn / fork strategies ------------------------------------------------------------------
    def _must_spawn(self, args: TrainingArguments) -> bool:
        from fitkit.engine.fabric import is_spawning

        return is_spawning(args) and not self._in_spawned_process

    def _spawned(self, method: str, args: TrainingArguments, call: dict) -> Any:
        """Run `method` in the processes a spawn/fork strategy starts, then bring rank 0's
        trained weights, history and state back to this process (the children's copies of the
        model are not this one)."""
        from fitkit.engine.fabric import build_fabric

        fabric = build_fabric(args)
        key = tuple(repr(getattr(args, k)) for k in _DEVICE_KEYS)
        result = fabric.launch(_run_in_child, self, key, method, call)
        tensors = torch.load(io.BytesIO(result["tensors"]), weights_only=True)
        self.module.load_state_dict(tensors["weights"])
        self.state = TrainerState(**result["state"])
        if result["history"] is not None:
            history = History()
            history.history, history.epoch, history.params = result["history"]
            self.history = history
        return history if method == "fit" else tensors["value"]

    # -- hyperparameter search ----------------------------------------------------------------
    def hyperparameter_search(self, x: Any = None, y: Any = None, *, hp_space: Callable | None = None,
                              compute_objective: Callable | None = None, n_trials: int = 20,
                              direction: str | list[str] = "minimize", hp_name: Callable | None = None,
                              backend: str = "optuna", **options: Any):
        """Search hyperparameters with Optuna; returns the best `BestRun` (a list for several directions).

        Each trial builds a fresh module with `model_init(trial)`; `hp_space(trial) -> dict`
        values override compile/fit options of the same name. `options`: what `fit` accepts,
        plus `storage`, `study_name`, `sampler`, `pruner`, `load_if_exists` (create_study),
        `timeout`, `n_jobs`, `gc_after_trial`, `catch`, `optuna_callbacks` (optimize), or a
        ready `study=`. See `fitkit.search`.
        """
        from fitkit.search import run_search

        return run_search(self, x, y, hp_space=hp_space, compute_objective=compute_objective, n_trials=n_trials,
                          direction=direction, hp_name=hp_name, backend=backend, **options)

    def _trial_copy(self, trial: Any) -> "Model":
        """A model for one trial: a fresh module from `model_init(trial)`, this model's compile
        configuration and callbacks, and the same (already launched) Fabric."""
        copy = Model(_call_model_init(self.model_init, trial))
        copy.model_init = self.model_init
        copy._compiled, copy._compile_args = self._compiled, self._compile_args
        copy.callback_handler = CallbackHandler(self.callback_handler.callbacks)
        copy._fabric, copy._fabric_key = self._fabric, self._fabric_key
        return copy

    def _release(self) -> None:
        """Drop the module, optimizer and set-up wrappers (after a trial)."""
        self._wrapped = self._wrapped_of = self._optimizer = self._module = None
        self._fabric = None
        self._example = None

    # -- summary, save, load ----------------------------------------------------------------
    def summary(self, example_input: Any = None) -> str:
        """A table of layers, output shapes (when an example input is known) and parameter counts.

        Returns the text (it also shows when echoed in a REPL or notebook)."""
        example = example_input if example_input is not None else self._example
        return summarize(self.module, example)

    def save(self, path: str) -> None:
        """Save the weights and the compile configuration to one weights-only file at `path`."""
        config = None
        if self._compiled is not None:
            config = {"optimizer": self._compiled["optimizer"], "loss": self._compiled["loss"],
                      "metrics": self._compiled["metrics"], "options": self._compiled["options"]}
            config = json.dumps(_jsonable_config(config))
        payload = {"format": "fitkit-model", "version": 1,
                   "state_dict": {k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                   "config": config}
        atomic_torch_save(payload, path)

    @classmethod
    def load(cls, path: str, module_or_model_init: torch.nn.Module | Callable) -> "Model":
        """Load a model saved with `save` into `module_or_model_init`; compiled again when the
        configuration was made of names (callables must be passed to `compile` again)."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no saved model at `path`={path!r}: pass the file written by Model.save")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure means "not safe / not ours"
            raise ValueError(f"{path!r} is not a fitkit model file that loads safely (weights only): {err}") from None
        if not isinstance(payload, dict) or payload.get("format") != "fitkit-model":
            raise ValueError(f"{path!r} is not a fitkit model file: expected one written by Model.save")
        if isinstance(module_or_model_init, torch.nn.Module):
            model = cls(module_or_model_init)
        else:
            model = cls(model_init=module_or_model_init)
        model.module.load_state_dict(payload["state_dict"])
        config = json.loads(payload["config"]) if payload.get("config") else None
        if config and all(isinstance(config[k], (str, type(None))) for k in ("optimizer", "loss")) and all(
            isinstance(m, str) for m in config["metrics"]
        ):
            model.compile(config["optimizer"], config["loss"], config["metrics"], **config["options"])
        return model

    def __repr__(self) -> str:
        name = type(self._module).__name__ if self._module is not None else "model_init"
        return f"Model({name}, compiled={self._compiled is not None})"


def _run_in_child(fabric, model: Model, key: tuple, method: str, call: dict) -> dict:
    """The function a spawn/fork strategy runs in each process (module level, so it pickles)."""
    model._fabric, model._fabric_key, model._wrapped = fabric, key, None
    model._in_spawned_process = True
    value = getattr(model, method)(**call)
    if method == "fit":
        value = None  # the History is rebuilt from the record below
    weights = {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
    # Tensors go back as bytes: shared-memory handles die with the child process.
    buffer = io.BytesIO()
    torch.save({"weights": weights, "value": to_cpu(value)}, buffer)
    history = model.history
    return {"tensors": buffer.getvalue(), "state": dataclasses.asdict(model.state),
            "history": None if history is None else (history.history, history.epoch, history.params)}


def _in_notebook() -> bool:
    """True inside a Jupyter kernel, where a rich bar renders although stdout is not a tty."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def _backup_to_resume(callbacks: Sequence, args: TrainingArguments) -> str | None:
    """A checkpoint offered by a callback (`checkpoint_to_resume(args)`, e.g. BackupAndRestore)."""
    for cb in callbacks:
        offer = getattr(cb, "checkpoint_to_resume", None)
        if callable(offer):
            path = offer(args)
            if path:
                return path
    return None


def _jsonable_config(config: dict) -> dict:
    from fitkit.arguments import _jsonable

    return {k: _jsonable(v) for k, v in config.items()}


def _as_triples(split):
    train, val = split
    if isinstance(train, tuple):
        return train, val
    return (train, None, None), (val, None, None)


def _class_weights(class_weight: dict, device) -> torch.Tensor:
    if not isinstance(class_weight, dict) or not class_weight:
        raise ValueError("`class_weight` must be a non-empty dict {class index: weight}")
    size = max(int(k) for k in class_weight) + 1
    weights = torch.ones(size, dtype=torch.float32)
    for k, v in class_weight.items():
        weights[int(k)] = float(v)
    return weights.to(device)


def seed_everything(seed: int | None) -> None:
    """Seed Python, NumPy and torch (all devices) when `seed` is not None."""
    if seed is None:
        return
    import random

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass
    # torch.manual_seed would also queue seeds for every device type (~0.1 ms a call on CPU)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
