"""Hyperparameter search through Optuna (optuna is imported only when a search runs).

    def model_init(trial):
        hidden = trial.suggest_int("hidden", 16, 128) if trial else 64
        return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def hp_space(trial):
        return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)}

    model = Model(model_init=model_init).compile("adam", "cross_entropy", ["accuracy"])
    best = model.hyperparameter_search(x, y, validation_split=0.2, hp_space=hp_space, n_trials=20,
                                       direction="maximize", storage="sqlite:///search.db",
                                       study_name="digits", load_if_exists=True)
    best.hyperparameters      # {"hidden": 97, "learning_rate": 0.004}

Every trial seeds, builds a fresh module from `model_init(trial)`, a fresh optimizer and
scheduler, runs `fit` with the trial's values overriding the options of the same name, writes
under `output_dir/run-{trial.number}`, reports each evaluation to the trial (so pruners
prune), and is released from memory before the next one.
"""

from __future__ import annotations

import gc
import os
from typing import Any, Callable, NamedTuple

from fitkit.argument_names import ALIASES
from fitkit.arguments import TrainingArguments
from fitkit.callbacks.base import Order, TrainerCallback, callback_list
from fitkit.engine.rng import seed_everything
from fitkit.options import did_you_mean

STUDY_OPTIONS = ("storage", "study_name", "sampler", "pruner", "load_if_exists")
OPTIMIZE_OPTIONS = ("timeout", "n_jobs", "gc_after_trial", "catch", "optuna_callbacks")
FIT_OPTIONS = ("validation_data", "validation_split", "callbacks", "class_weight", "sample_weight", "batch_size",
               "epochs", "shuffle", "max_steps")
SEARCH_PARAMETERS = ("hp_space", "compute_objective", "n_trials", "direction", "hp_name", "backend", "study")
#: Optuna's directions, and the short spellings accepted for them.
DIRECTIONS = {"minimize": "minimize", "maximize": "maximize", "min": "minimize", "max": "maximize"}
_SPEED = ("runtime", "per_second", "samples_per_second", "steps_per_second", "flos", "epoch", "step")


class BestRun(NamedTuple):
    """The best trial of a search (HF's fields): `run_id` is the trial number as a string."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any = None


def default_hp_space(trial) -> dict[str, Any]:
    """HF's default space for Optuna, with fitkit's option names."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "epochs": trial.suggest_int("epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "batch_size": trial.suggest_categorical("batch_size", [4, 8, 16, 32, 64]),
    }


def default_compute_objective(metrics: dict[str, float]) -> float:
    """HF's rule: the validation loss when there is no other metric, else the sum of the
    metrics (speed and time values dropped). Without validation, the training values."""
    values = {k: v for k, v in metrics.items() if not any(s in k for s in _SPEED) and k != "learning_rate"}
    prefix = "val_" if any(k.startswith("val_") for k in values) else ""
    values = {k: v for k, v in values.items() if k.startswith(prefix)}
    loss = values.pop(prefix + "loss", None)
    if values:
        return float(sum(values.values()))
    if loss is None:
        raise ValueError(f"no loss or metric to build the objective from (got {sorted(metrics)}); pass compute_objective")
    return float(loss)


class _TrialReporter(TrainerCallback):
    """Reports each evaluation's objective to the trial; stops training when it should be pruned."""

    order = Order.LOGGER

    def __init__(self, trial, compute_objective: Callable, multi: bool, fabric):
        self.trial, self.compute_objective, self.multi, self.fabric = trial, compute_objective, multi, fabric
        self.metrics: dict[str, float] = {}
        self.pruned = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.metrics.update({k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.update(metrics or {})
        if self.multi:
            return  # Optuna does not prune multi-objective studies
        value = self.compute_objective(dict(self.metrics))
        prune = False
        if self.fabric is None or self.fabric.is_global_zero:
            self.trial.report(value, step=state.global_step)
            prune = self.trial.should_prune()
        if self.fabric is not None and self.fabric.world_size > 1:
            prune = self.fabric.broadcast(prune, src=0)  # every rank stops at the same step
        if prune:
            self.pruned = True
            control.should_training_stop = True
        return control


def _split_options(options: dict[str, Any]) -> tuple[dict, dict, dict]:
    study = {k: options.pop(k) for k in STUDY_OPTIONS if k in options}
    optimize = {k: options.pop(k) for k in OPTIMIZE_OPTIONS if k in options}
    valid = set(FIT_OPTIONS) | set(TrainingArguments.names()) | set(ALIASES)
    unknown = sorted(set(options) - valid)
    if unknown:
        suggestion = did_you_mean(unknown, [*valid, *STUDY_OPTIONS, *OPTIMIZE_OPTIONS, *SEARCH_PARAMETERS])
        raise TypeError(
            f"unknown option(s) {unknown} for hyperparameter_search: {suggestion}valid: the search's own parameters "
            f"({', '.join(SEARCH_PARAMETERS)}), fit options and TrainingArguments "
            f"fields ({', '.join(sorted(valid))}), create_study options ({', '.join(STUDY_OPTIONS)}), "
            f"optimize options ({', '.join(OPTIMIZE_OPTIONS)})"
        )
    if "callbacks" in options:
        options["callbacks"] = callback_list(options["callbacks"], build=False)  # classes: built per trial
    return study, optimize, options


def _directions(direction: Any) -> str | list[str]:
    """Optuna's spelling of `direction` (a name or a list of names); "max" and "min" are
    accepted for "maximize" and "minimize"."""
    names = direction if isinstance(direction, (list, tuple)) else [direction]
    for name in names:
        if not isinstance(name, str) or name.lower() not in DIRECTIONS:
            raise ValueError(f"`direction`={direction!r} is invalid: {did_you_mean(name, DIRECTIONS)}use "
                             f"'minimize' or 'maximize' ('min' / 'max' too), or a list of them for several objectives")
    if not names:
        raise ValueError("`direction`=[] is invalid: pass 'minimize' or 'maximize', or a non-empty list of them")
    mapped = [DIRECTIONS[name.lower()] for name in names]
    return mapped if isinstance(direction, (list, tuple)) else mapped[0]


def _parameters(hp_space: Callable, trial: Any) -> dict[str, Any]:
    """What `hp_space(trial)` returned, which must be a dict of option values."""
    params = hp_space(trial)
    if not isinstance(params, dict):
        raise ValueError(f"`hp_space` returned {type(params).__name__ if params is not None else 'None'}: it must "
                         "return a dict of option values, e.g. {'learning_rate': trial.suggest_float("
                         "'learning_rate', 1e-4, 1e-1, log=True)} (did it forget `return`?)")
    return dict(params)


def _check_params(params: dict[str, Any]) -> None:
    valid = set(FIT_OPTIONS) | set(TrainingArguments.names()) | set(ALIASES)
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"hp_space returned {unknown}, which are not compile/fit options. Valid names: {', '.join(sorted(valid))}. "
            "Model hyperparameters are suggested inside model_init(trial) instead."
        )


def run_search(model: Any, x: Any, y: Any, *, hp_space: Callable | None, compute_objective: Callable | None,
               n_trials: int, direction: str | list[str], hp_name: Callable | None, backend: str,
               study: Any = None, **options: Any) -> BestRun | list[BestRun]:
    """`Model.hyperparameter_search` (`model`: a compiled `fitkit.Model` built with `model_init`):
    see the module docstring."""
    if backend != "optuna":
        raise ValueError(f"unknown backend {backend!r} for `backend`; valid names are: optuna")
    if model.model_init is None:
        raise ValueError("hyperparameter_search needs `model_init`: build the model with Model(model_init=fn), "
                         "fn(trial) returning a fresh nn.Module, so that every trial starts from new weights")
    if model.config is None:
        raise RuntimeError("call `compile(optimizer, loss, metrics)` before `hyperparameter_search()`")
    import torch

    if isinstance(model.config.optimizer, torch.optim.Optimizer):
        raise ValueError("`optimizer` is an Optimizer instance, bound to one module's parameters; for a search "
                         "pass a name, an Optimizer class or a callable params -> optimizer")
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials <= 0:
        raise ValueError(f"`n_trials`={n_trials!r} is invalid: pass an integer > 0")
    if hp_space is not None and not callable(hp_space):
        raise ValueError(f"`hp_space`={hp_space!r} is invalid: pass a function trial -> dict of option values")
    direction = _directions(direction)
    search = _Search(model, x, y, hp_space=hp_space or default_hp_space,
                     compute_objective=compute_objective or default_compute_objective, direction=direction,
                     hp_name=hp_name, options=options)
    if search.fabric.is_global_zero:
        return search.lead(n_trials, study)
    return search.follow()


class _Search:
    """One search over Optuna. Rank 0 leads: it runs the study, samples every trial
    (`hp_space` and `model_init`) and broadcasts the trial's parameters; under several processes
    the others follow with the same parameters fixed, so every process trains the same trial."""

    def __init__(self, model: Any, x: Any, y: Any, *, hp_space: Callable, compute_objective: Callable,
                 direction: str | list[str], hp_name: Callable | None, options: dict[str, Any]):
        self.model, self.x, self.y = model, x, y
        self.hp_space, self.compute_objective, self.hp_name = hp_space, compute_objective, hp_name
        self.direction = direction
        self.multi = isinstance(direction, (list, tuple))
        self.study_kwargs, self.optimize_kwargs, self.fit_options = _split_options(dict(options))
        names = set(TrainingArguments.names()) | set(ALIASES)
        self.args = model.training_arguments(**{k: v for k, v in self.fit_options.items() if k in names})
        self.fabric = model.launch(self.args)
        self.distributed = self.fabric.world_size > 1

    # -- the two roles ------------------------------------------------------------------------
    def lead(self, n_trials: int, study: Any) -> BestRun | list[BestRun]:
        import optuna

        if study is None:
            kwargs = dict(self.study_kwargs)
            kwargs["directions" if self.multi else "direction"] = list(self.direction) if self.multi else self.direction
            study = optuna.create_study(**kwargs)
        optimize = dict(self.optimize_kwargs)
        callbacks = list(optimize.pop("optuna_callbacks", None) or ())
        finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        # n_trials counts the study's finished trials: a rerun continues an interrupted search and
        # several processes sharing one storage split the trials between them.
        callbacks.append(optuna.study.MaxTrialsCallback(n_trials, states=finished))
        if len(study.get_trials(deepcopy=False, states=finished)) < n_trials:
            study.optimize(self.objective, n_trials=n_trials, callbacks=callbacks, **optimize)
        if self.distributed:
            self.fabric.broadcast(None, src=0)  # no more trials
        best = _best(study, self.multi)
        return self.fabric.broadcast(best, src=0) if self.distributed else best

    def follow(self) -> BestRun | list[BestRun]:
        import optuna

        number = 0
        while True:
            sampled = self.fabric.broadcast(None, src=0)
            if sampled is None:
                break
            trial = optuna.trial.FixedTrial(sampled, number=number)
            params = _parameters(self.hp_space, trial)
            try:
                self.train_trial(self.fresh_model(trial, params), trial, params)
            except optuna.TrialPruned:
                pass
            number += 1
        return self.fabric.broadcast(None, src=0)

    # -- one trial ----------------------------------------------------------------------------
    def objective(self, trial: Any) -> float | tuple:
        params = _parameters(self.hp_space, trial)
        _check_params(params)
        trial_model = self.fresh_model(trial, params)
        if self.distributed:  # rank 0 sampled everything (hp_space and model_init); the others follow
            self.fabric.broadcast(dict(trial.params), src=0)
        return self.train_trial(trial_model, trial, params)

    def fresh_model(self, trial: Any, params: dict[str, Any]) -> Any:
        seed_everything(params.get("seed", self.args.seed))  # before model_init, as HF
        return self.model.for_trial(trial, hp_name=self.hp_name)

    def train_trial(self, trial_model: Any, trial: Any, params: dict[str, Any]) -> float | tuple:
        import optuna
        import torch

        reporter = _TrialReporter(trial, self.compute_objective, self.multi, self.fabric)
        trial_options = {**self.fit_options, **params}
        extra_callbacks = list(trial_options.pop("callbacks", None) or ())
        trial_options["output_dir"] = os.path.join(self.args.output_dir, f"run-{trial.number}")
        try:
            history = trial_model.fit(self.x, self.y, callbacks=extra_callbacks + [reporter], **trial_options)
            metrics = dict(reporter.metrics) or {k: v[-1] for k, v in history.history.items()}
        finally:
            trial_model.release()
            del trial_model
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        if reporter.pruned:
            raise optuna.TrialPruned(f"pruned at {trial.number}")
        return self._objective_value(metrics)

    def _objective_value(self, metrics: dict[str, float]) -> float | tuple:
        value = self.compute_objective(metrics)
        if self.multi:
            value = tuple(float(v) for v in value)
            if len(value) != len(self.direction):
                raise ValueError(f"compute_objective returned {len(value)} values for {len(self.direction)} directions")
            return value
        if isinstance(value, (tuple, list)):
            raise ValueError("compute_objective returned several values: pass `direction` as a list for a "
                             "multi-objective search")
        return float(value)


def _best(study, multi: bool) -> BestRun | list[BestRun]:
    if multi:
        return [BestRun(str(t.number), list(t.values), dict(t.params)) for t in study.best_trials]
    t = study.best_trial
    return BestRun(str(t.number), t.value, dict(t.params))
