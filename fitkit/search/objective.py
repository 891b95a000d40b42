"""The search's defaults and checks: HF's default space and objective, directions, parameters.

    default_hp_space(trial)            # {"learning_rate": ..., "epochs": ..., "seed": ..., "batch_size": ...}
    default_compute_objective(metrics) # val_loss alone, else the sum of the validation metrics
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fitkit.common.options import did_you_mean
from fitkit.config.arguments import TrainingArguments
from fitkit.config.names import ALIASES

FIT_OPTIONS = ("validation_data", "validation_split", "callbacks", "class_weight", "sample_weight", "batch_size",
               "epochs", "shuffle", "max_steps", "args")
#: Optuna's directions, and the short spellings accepted for them.
DIRECTIONS = {"minimize": "minimize", "maximize": "maximize", "min": "minimize", "max": "maximize"}
_SPEED = ("runtime", "per_second", "samples_per_second", "steps_per_second", "flos", "epoch", "step")


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


def fit_option_names() -> set[str]:
    return set(FIT_OPTIONS) | set(TrainingArguments.names()) | set(ALIASES)


def directions(direction: Any) -> str | list[str]:
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


def parameters(hp_space: Callable, trial: Any) -> dict[str, Any]:
    """What `hp_space(trial)` returned, which must be a dict of option values."""
    params = hp_space(trial)
    if not isinstance(params, dict):
        raise ValueError(f"`hp_space` returned {type(params).__name__ if params is not None else 'None'}: it must "
                         "return a dict of option values, e.g. {'learning_rate': trial.suggest_float("
                         "'learning_rate', 1e-4, 1e-1, log=True)} (did it forget `return`?)")
    return dict(params)


def check_params(params: dict[str, Any]) -> None:
    valid = fit_option_names()
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"hp_space returned {unknown}, which are not compile/fit options. Valid names: {', '.join(sorted(valid))}. "
            "Model hyperparameters are suggested inside model_init(trial) instead."
        )


def objective_value(value: Any, direction: str | list[str]) -> float | tuple:
    """`compute_objective`'s result checked against the number of directions."""
    if isinstance(direction, list):
        value = tuple(float(v) for v in value)
        if len(value) != len(direction):
            raise ValueError(f"compute_objective returned {len(value)} values for {len(direction)} directions")
        return value
    if isinstance(value, (tuple, list)):
        raise ValueError("compute_objective returned several values: pass `direction` as a list for a "
                         "multi-objective search")
    return float(value)
