"""The search's study: its options split from `fit`'s, opened (storage first, before any
device or process starts), and the trials it may still take.

    study_kwargs, optimize_kwargs, storage_options, fit_options = split_options(options)
    study = open_study(study_kwargs, storage_options, "maximize")
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fitkit.common.options import did_you_mean
from fitkit.events.callback_checks import callback_list
from fitkit.search.claims import on_stale
from fitkit.search.objective import fit_option_names
from fitkit.search.storage import StorageOptions, _retrying_open, open_storage

STUDY_OPTIONS = ("storage", "study_name", "sampler", "pruner", "load_if_exists")
OPTIMIZE_OPTIONS = ("timeout", "n_jobs", "gc_after_trial", "catch", "optuna_callbacks")
STORAGE_OPTIONS = StorageOptions.NAMES
SEARCH_PARAMETERS = ("hp_space", "compute_objective", "n_trials", "direction", "hp_name", "backend", "study")


def split_options(options: dict[str, Any]) -> tuple[dict, dict, StorageOptions, dict]:
    """`hyperparameter_search`'s options as (create_study, optimize, storage, fit) options."""
    study = {k: options.pop(k) for k in STUDY_OPTIONS if k in options}
    optimize = {k: options.pop(k) for k in OPTIMIZE_OPTIONS if k in options}
    storage = StorageOptions(**{k: options.pop(k) for k in STORAGE_OPTIONS if k in options})
    valid = fit_option_names()
    unknown = sorted(set(options) - valid)
    if unknown:
        everything = [*valid, *STUDY_OPTIONS, *OPTIMIZE_OPTIONS, *STORAGE_OPTIONS, *SEARCH_PARAMETERS]
        raise TypeError(
            f"unknown option(s) {unknown} for hyperparameter_search: {did_you_mean(unknown, everything)}valid: the "
            f"search's own parameters ({', '.join(SEARCH_PARAMETERS)}), fit options and TrainingArguments "
            f"fields ({', '.join(sorted(valid))}), create_study options ({', '.join(STUDY_OPTIONS)}), "
            f"optimize options ({', '.join(OPTIMIZE_OPTIONS)}), storage options ({', '.join(STORAGE_OPTIONS)})"
        )
    if "callbacks" in options:
        options["callbacks"] = callback_list(options["callbacks"], build=False)  # classes: built per trial
    return study, optimize, storage, options


def open_study(study_kwargs: dict[str, Any], storage_options: StorageOptions, direction: str | list[str]) -> Any:
    """`optuna.create_study(**study_kwargs)` with the storage opened by `open_storage` (checked,
    retried, heartbeats on) and, when several workers may share it (a storage is given), the
    default TPE sampler with `constant_liar=True` so that they do not sample the same point."""
    import optuna

    kwargs = dict(study_kwargs)
    multi = isinstance(direction, list)
    kwargs["directions" if multi else "direction"] = direction
    storage = kwargs.get("storage")
    if storage is not None:
        kwargs["storage"] = open_storage(storage, storage_options, on_stale=on_stale)
        if kwargs.get("sampler") is None and not multi:
            kwargs["sampler"] = optuna.samplers.TPESampler(constant_liar=True)
    return _retrying_open(lambda: optuna.create_study(**kwargs), storage_options, kwargs.get("storage"))


def leads(env: Mapping[str, str] | None = None) -> bool:
    """False in a process that a launcher started as a non-zero rank (torchrun, SLURM, Fabric's
    own launcher): such a process follows rank 0 and never opens the storage. Read from the
    environment, so it is known before Fabric starts."""
    env = os.environ if env is None else env
    return all(env.get(name, "0") == "0" for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK"))
