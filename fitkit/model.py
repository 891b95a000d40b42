"""The `Model` facade: Keras' compile / fit / evaluate / predict over a PyTorch module.

    import torch
    from fitkit import Model

    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    model = Model(net).compile("adam", "cross_entropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=5, validation_split=0.2)
    loss, accuracy = model.evaluate(x_test, y_test)   # Keras' list; return_dict=True: a dict
    model.predict(x_test)               # tensor, input order, on CPU

The facade holds the configuration, the callbacks and a `Runtime` (what outlives one call); each
call is run by an engine `Trainer` (`fitkit.engine.trainer`), which never calls the facade.
`evaluate` and `predict` are `fitkit.facade.evaluation`'s; the other mixins are in `fitkit.facade`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from fitkit.adapters.optimizers import optimizer_note
from fitkit.callbacks.flow import DefaultFlowCallback
from fitkit.callbacks.history import History, returned_history
from fitkit.config.arguments import TrainingArguments
from fitkit.config.compile_config import CompileConfig
from fitkit.config.jit_compile import jit_note
from fitkit.config.option_merge import in_force
from fitkit.engine.overrides import StepOverrides
from fitkit.engine.runtime import Runtime, unpack_result
from fitkit.engine.trainer import Trainer
from fitkit.events.handler import CallbackHandler, TrainerCallback, TrainerControl, TrainerState
from fitkit.facade.callback_list import CallbackOwner, checked_callbacks, run_handler
from fitkit.facade.defaults import defaults_for
from fitkit.facade.evaluation import Evaluation
from fitkit.facade.hf_methods import HFMethods
from fitkit.facade.hf_results import HFResults
from fitkit.facade.keras_api import KerasMethods
from fitkit.facade.model_init import call_model_init, deferred_module, module_for_fit, module_for_trial, run_in_child
from fitkit.facade.saving import Saving
from fitkit.facade.steps import Steps
from fitkit.facade.summary import summarize

if TYPE_CHECKING:  # pragma: no cover
    from fitkit.search import BestRun


class Model(CallbackOwner, Steps, KerasMethods, Evaluation, Saving, HFMethods, HFResults):
    """Wrap an `nn.Module` (or a `model_init` factory) with Keras' training API. Subclass it to
    override `train_step`, `test_step`, `predict_step` or `compute_loss` (`fitkit.facade.steps`)."""

    def __init__(self, module: torch.nn.Module | None = None, *, model_init: Callable[..., Any] | None = None) -> None:
        if (module is None) == (model_init is None):
            raise ValueError("pass exactly one of `module` (an nn.Module) or `model_init` (a callable returning one)")
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"`module` must be a torch.nn.Module, got {type(module).__name__}")
        if model_init is not None and not callable(model_init):
            raise TypeError("`model_init` must be a callable taking no argument or a trial and returning an nn.Module")
        self._module = module
        self.model_init = model_init
        self.config: CompileConfig | None = None  # set by compile
        self.callback_handler = CallbackHandler([DefaultFlowCallback()])
        self.history: History | None = None
        self.state: TrainerState = TrainerState()
        self.control = TrainerControl()
        self.last_checkpoint: str | None = None
        self._runtime = Runtime()
        self._trial: dict[str, Any] | None = None  # {"trial_name", "trial_params"} for a search trial
        self._stop_training = False  # Keras' flag between calls (`stop_training`)

    # -- what the model holds -------------------------------------------------------------------
    @property
    def module(self) -> torch.nn.Module:
        """The `nn.Module` (built from `model_init` on first use); in a custom step, as set up."""
        if self._runtime.tools is not None:
            return self._runtime.tools.module
        if self._module is None:
            self._module = call_model_init(self.model_init)
        return self._module

    def _module_for(self, args: TrainingArguments) -> torch.nn.Module:
        """`module`; strategy="fsdp" builds it on the meta device after the launch (`deferred_module`)."""
        if self._module is None and self._runtime.tools is None:
            self._module = deferred_module(self.model_init, self._runtime, args)
        return self.module

    @property
    def fabric(self) -> Any:
        """The Lightning Fabric the model runs on (None before the first call)."""
        return self._runtime.fabric

    @property
    def runtime(self) -> Runtime:
        """What outlives one call: the Fabric, the set-up module, the optimizer (engine's `Runtime`)."""
        return self._runtime

    @property
    def stop_training(self) -> bool:
        """Keras' flag: set it to True (from a callback) to end `fit` after the current step; it
        stays set after the run and is cleared when the next `fit` starts, as in Keras."""
        call = self._runtime.call
        return self._stop_training if call is None else call.stop_requested

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._stop_training = bool(value)
        call = self._runtime.call
        if call is not None:  # the call under way reads the request after each step
            call.request_stop(value)

    # -- compile ------------------------------------------------------------------------------
    def compile(self, optimizer: Any = "adam", loss: Any = None, metrics: Sequence[Any] | None = None,
                **options: Any) -> Model:
        """Configure training; returns `self` so calls chain.

        `optimizer`: a name ("adam", "adamw", "sgd", "rmsprop", "lion", ...: Keras 3's algorithms and
        defaults), an Optimizer class or instance, or a callable params -> optimizer. `loss`: a name,
        an nn.Module, a callable (outputs, targets) -> tensor, or None when the module returns its
        loss. `metrics`: names, torchmetrics objects or callables. Options are `TrainingArguments`
        fields kept as fit's defaults (`learning_rate`, `strategy`, `precision`, `jit_compile`, ...).
        """
        self.config = CompileConfig.build(optimizer, loss, metrics, **options)
        self._runtime.forget_optimizer(self._module)  # Keras: compiling again starts a fresh optimizer
        self.control = self.callback_handler.on_init_end(self.config.args, self.state, self.control)
        return self

    def training_arguments(self, args: TrainingArguments | None = None, **options: Any) -> TrainingArguments:
        """The `TrainingArguments` a fit with these options uses: `args` (default: the compile
        options) with `options` over it; see `CompileConfig.arguments`."""
        return self._compiled("fit").arguments(args, **options)

    def launch(self, args: TrainingArguments | None = None) -> Any:
        """Start the devices and processes for `args` (default: compile's) once; returns the Fabric."""
        return self._runtime.launch(args if args is not None else self._compiled("fit").args)

    def _compiled(self, what: str) -> CompileConfig:
        if self.config is None:
            raise RuntimeError(f"call `compile(optimizer, loss, metrics)` before `{what}()`")
        return self.config

    def _handler(self, extra: Sequence[Any] | None, *more: TrainerCallback) -> CallbackHandler:
        # Keras-style callbacks get this model as `self.model`, as Keras gives its own
        return run_handler(self, [*self.callback_handler.callbacks, *checked_callbacks(extra), *more])

    # -- fit (evaluate and predict: `fitkit.facade.evaluation`) --------------------------------------
    def fit(self, x: Any = None, y: Any = None, *, batch_size: int | None = None, epochs: int | None = None,
            validation_data: Any = None, validation_split: float = 0.0, callbacks: Sequence[Any] | None = None,
            shuffle: bool | None = None, max_steps: int | None = None, class_weight: dict | None = None,
            sample_weight: Any = None, initial_epoch: int = 0, args: TrainingArguments | None = None,
            **options: Any) -> History:
        """Train; returns the `History` (one value per epoch for each loss and metric).

        `x`: tensor, array, `(x, y[, sample_weight])` tuple, Dataset, DataLoader or iterable of
        batches. `validation_data` takes the same forms; `validation_split` holds out the last
        fraction of in-memory data (taken before shuffling, as Keras). `batch_size` (default 32),
        `epochs` (1), `shuffle` (True) and `max_steps` (-1) default to what `compile` was given.
        Other options are `TrainingArguments` fields (`eval_strategy`, `logging_steps`,
        `save_strategy`, `output_dir`, `seed`, `verbose`, ...). `args`, a ready `TrainingArguments`,
        replaces compile's options; options given beside it win over it. `callbacks`: a list;
        a `History` among them (fitkit's or `keras.callbacks.History()`) is filled and returned,
        as Keras returns the one it was given.
        """
        run_args = self.training_arguments(args, batch_size=batch_size, epochs=epochs, shuffle=shuffle,
                                           max_steps=max_steps, **options)
        callbacks = checked_callbacks(callbacks)
        self._in_force, self._last_output_dir = in_force(run_args), run_args.output_dir
        if self._runtime.must_spawn(run_args):
            return self._spawned("fit", run_args, dict(
                x=x, y=y, batch_size=batch_size, epochs=epochs, validation_data=validation_data,
                validation_split=validation_split, callbacks=callbacks, shuffle=shuffle, max_steps=max_steps,
                class_weight=class_weight, sample_weight=sample_weight, initial_epoch=initial_epoch, args=args,
                **options))
        start_rng = None
        if self._module is None and self._runtime.tools is None:
            self._module, start_rng = module_for_fit(self.model_init, self._runtime, run_args)
        self._fit_validation_data = validation_data  # HF's trainer.evaluate() without data evaluates it
        history, given = History(), [*self.callback_handler.callbacks, *callbacks]
        self.history = history  # as Keras: the run's History, also while it runs
        handler = self._handler(callbacks, history, *defaults_for(run_args, given))
        trainer = Trainer(self._runtime, self._module_for(run_args), self.config, run_args, handler, StepOverrides.of(self, Model))
        try:
            trainer.fit(x, y, sample_weight=sample_weight, validation_data=validation_data,
                        validation_split=validation_split, class_weight=class_weight, trial=self._trial,
                        initial_epoch=initial_epoch, start_rng=start_rng)
        finally:
            self._stop_training = trainer.context.stop_requested
            if trainer.state is not None:  # the run got as far as planning: it is the last run now
                self.state, self.history, self.control = trainer.state, history, trainer.control
                if trainer.checkpointer is not None and trainer.checkpointer.last:
                    self.last_checkpoint = trainer.checkpointer.last
        return returned_history(callbacks, history)

    def _spawned(self, method: str, args: TrainingArguments, call: dict[str, Any]) -> Any:
        """Run `method` in the processes a spawn/fork strategy starts, then take rank 0's trained
        weights, history and state back into this process."""
        result = self._runtime.spawn(args, run_in_child, self, method, call, modules=(self._module,))
        value, state = unpack_result(result, self.module)
        self.state = TrainerState(**state)
        if result["history"] is not None:
            self.history = History()
            (self.history.history, self.history.epoch, self.history.params, self.history.metrics,
             self.history.global_step) = result["history"]
        return self.history if method == "fit" else value

    # -- hyperparameter search ------------------------------------------------------------------
    def hyperparameter_search(self, x: Any = None, y: Any = None, *, hp_space: Callable[..., Any] | None = None,
                              compute_objective: Callable[..., Any] | None = None, n_trials: int = 20,
                              direction: str | list[str] = "minimize", hp_name: Callable[..., Any] | None = None,
                              backend: str = "optuna", **options: Any) -> BestRun | list[BestRun]:
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

    def for_trial(self, trial: Any, hp_name: Callable[..., Any] | None = None, **build: Any) -> Model:
        """A model for one search trial: a fresh module from `model_init(trial)` (`build`: the
        search's `args`, FSDP's deferred build: `module_for_trial`), this model's compile configuration and callbacks,
        the same (already launched) Fabric, and its state marked as a search's (`trial_name`, `trial.params`)."""
        # the trial's model is of this model's class (a subclass's own steps run in every trial) and
        # keeps the attributes its subclass set (trackers, say); Model's own state is the trial's
        copy = type(self).__new__(type(self))
        Model.__init__(copy, module_for_trial(self.model_init, trial, self._runtime, **build))
        copy.__dict__.update({k: v for k, v in self.__dict__.items() if k not in copy.__dict__})
        copy.model_init, copy.config = self.model_init, self.config
        copy.callback_handler = CallbackHandler(self.callback_handler.callbacks)
        copy._runtime = self._runtime.shared()
        copy._trial = {"trial_name": hp_name(trial) if hp_name else None, "trial_params": dict(trial.params)}
        return copy

    def release(self) -> None:
        """Drop the module, optimizer, Fabric and set-up wrappers (a trial's, once it is done)."""
        self._runtime.release()
        self._module = None

    # -- summary (save and load: `fitkit.facade.saving.Saving`) ---------------------------------------------
    def summary(self, example_input: Any = None) -> str:
        """A table of layers, output shapes (given an example input) and parameter counts, as text."""
        notes = (optimizer_note(self.config.optimizer, self._runtime.optimizer),
                 *jit_note(self.config.args.jit_compile)) if self.config else ()
        return summarize(self.module, example_input if example_input is not None else self._runtime.example, notes)

    def __repr__(self) -> str:
        name = type(self._module).__name__ if self._module is not None else "model_init"
        return f"Model({name}, compiled={self.config is not None})"
