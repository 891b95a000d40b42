"""Hyperparameter search through Optuna (optuna is imported only when a search runs).

    def model_init(trial):
        hidden = trial.suggest_int("hidden", 16, 128) if trial else 64
        return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    def hp_space(trial):
        return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)}

    model = Model(model_init=model_init).compile("adam", "cross_entropy", ["accuracy"])
    best = model.hyperparameter_search(x, y, validation_split=0.2, hp_space=hp_space, n_trials=20,
                                       direction="maximize", storage="postgresql://db/optuna",
                                       study_name="digits", load_if_exists=True)
    best.hyperparameters      # {"hidden": 97, "learning_rate": 0.004}
    best.run_summary          # {"metrics": {...}, "output_dir": ".../run-7", "best_checkpoint": ...}

Every trial seeds, builds a fresh module from `model_init(trial)`, a fresh optimizer and
scheduler, runs `fit` with the trial's values overriding the options of the same name, writes
under `output_dir/run-{trial.number}`, reports each evaluation to the trial at a step in epochs
(so pruners prune), stores its results as user attributes, and is released from memory before
the next one. Any number of workers may run the same search on one storage: the study ends
with exactly `n_trials` finished trials, and a trial killed or preempted (SIGTERM) is re-run
from its own last checkpoint. Modules: `study` (options, opening), `storage` (retries,
heartbeats), `claims` (counting, re-queueing), `reporter`, `runner`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitkit.search.claims import BEST_CHECKPOINT, METRICS, OUTPUT_DIR, RESUMED_FROM
from fitkit.search.objective import DIRECTIONS, FIT_OPTIONS, default_compute_objective, default_hp_space, directions
from fitkit.search.reporter import STEPS_PER_EPOCH, report_step
from fitkit.search.runner import PREEMPTED_EXIT_CODE, BestRun, Search
from fitkit.search.storage import (
    CONNECT_TIMEOUT,
    GRACE_INTERVALS,
    HEARTBEAT_INTERVAL,
    RETRY_TIMEOUT,
    StorageError,
    StorageOptions,
    open_storage,
)
from fitkit.search.study import (
    OPTIMIZE_OPTIONS,
    SEARCH_PARAMETERS,
    STORAGE_OPTIONS,
    STUDY_OPTIONS,
    leads,
    open_study,
    split_options,
)

__all__ = ["BestRun", "StorageError", "StorageOptions", "PREEMPTED_EXIT_CODE", "HEARTBEAT_INTERVAL",
           "GRACE_INTERVALS", "RETRY_TIMEOUT", "CONNECT_TIMEOUT", "STEPS_PER_EPOCH", "OUTPUT_DIR", "METRICS",
           "BEST_CHECKPOINT", "RESUMED_FROM", "DIRECTIONS", "FIT_OPTIONS", "STUDY_OPTIONS", "OPTIMIZE_OPTIONS",
           "STORAGE_OPTIONS", "SEARCH_PARAMETERS", "default_hp_space", "default_compute_objective", "open_storage",
           "report_step", "run_search"]


def run_search(model: Any, x: Any, y: Any, *, hp_space: Callable | None, compute_objective: Callable | None,
               n_trials: int, direction: str | list[str], hp_name: Callable | None, backend: str,
               study: Any = None, **options: Any) -> BestRun | list[BestRun]:
    """`Model.hyperparameter_search` (`model`: a compiled `fitkit.Model` built with `model_init`):
    see the module docstring. The storage is opened and checked before any device or process
    starts (a bad URL or an unreachable server fails at once, naming `storage`)."""
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
    direction = directions(direction)
    study_kwargs, optimize_kwargs, storage_options, fit_options = split_options(dict(options))
    if study is None and leads():
        study = open_study(study_kwargs, storage_options, direction)
    search = Search(model, x, y, hp_space=hp_space or default_hp_space,
                    compute_objective=compute_objective or default_compute_objective, direction=direction,
                    hp_name=hp_name, optimize_kwargs=optimize_kwargs, fit_options=fit_options)
    if search.fabric.is_global_zero:
        if study is None:  # a launcher's environment said otherwise, yet this process is rank 0
            study = open_study(study_kwargs, storage_options, direction)
        return search.lead(study, n_trials)
    return search.follow()
