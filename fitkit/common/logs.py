"""What a log record holds: which of its keys are bookkeeping rather than values, how a
logged value reads as a number, and which way a named value improves.

A record (`on_log`'s `logs`, an evaluation's `metrics`, an entry of `state.log_history`) maps
names to values::

    {"loss": 0.41, "accuracy": 0.88, "learning_rate": 0.001, "epoch": 2.0, "step": 64}

Pure and light: nothing here imports torch or torchmetrics at module level (`import fitkit`
stays lean); `direction_from_name` imports torchmetrics only for a name its word rules do not
settle.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from typing import Any

# -- keys that are not values ------------------------------------------------------------------

EPOCH = "epoch"
STEP = "step"
TOTAL_FLOS = "total_flos"
LEARNING_RATE = "learning_rate"

#: Where a record was made (the engine adds them to every record).
POSITION = frozenset({EPOCH, STEP})
#: Keys that say something about the run, not about the model: the position and HF's
#: `total_flos`. Per-epoch records (`EpochRecords`) drop them.
BOOKKEEPING = POSITION | {TOTAL_FLOS}
#: What Keras' per-epoch views leave out of the values they show: the bookkeeping keys and the
#: optimizer's rate (`History`, the progress display).
NOT_VALUES = BOOKKEEPING | {LEARNING_RATE}


# -- values as numbers -----------------------------------------------------------------------------


def _single_item(value: Any) -> Any:
    """The element of a one-element tensor or array (`.item()`), else None."""
    count = getattr(value, "numel", None)
    if count is None:
        count = getattr(value, "size", None)
    try:
        if callable(count):
            count = count()
        if count == 1 and hasattr(value, "item"):
            return value.item()
    except Exception:  # noqa: BLE001 - anything odd is "not a number"
        return None
    return None


def as_number(value: Any, *, bools: bool = False, keep_ints: bool = False) -> float | int | None:
    """One logged value as a Python number, or None when it is not a number.

    The rule: a number is a real number (`int`, `float`, any `numbers.Real`, which includes
    NumPy's scalar types) or a one-element tensor or array holding one (read with `.item()`).
    Anything else (None, strings, tensors of several elements, complex numbers) is None.

    - The result is a `float`; with `keep_ints=True` an integer stays an `int`.
    - A boolean (Python's, NumPy's, or a one-element bool tensor) is a flag, not a
      measurement: None, unless `bools=True`, which counts it as 1 / 0 (as HF's trackers do,
      since `bool` is an `int`).

    The callbacks read values with the defaults; the trackers (`fitkit.integrations`) with
    `bools=True, keep_ints=True`, so they record what was logged as it was logged::

        as_number(0.5)                      # 0.5
        as_number(3)                        # 3.0
        as_number(3, keep_ints=True)        # 3
        as_number(True)                     # None
        as_number(True, bools=True)         # 1.0
        as_number(torch.tensor([2.5]))      # 2.5
        as_number(numpy.float32(0.25))      # 0.25
        as_number(torch.ones(2))            # None
        as_number("1.0")                    # None
    """
    if not isinstance(value, numbers.Number):  # a tensor, an array, NumPy's bool, or not a number
        value = _single_item(value)
    if isinstance(value, bool):
        if not bools:
            return None
        value = int(bool(value))
    if not isinstance(value, numbers.Real):
        return None
    if keep_ints and isinstance(value, numbers.Integral):
        return int(value)
    return float(value)


# -- which way a value improves ------------------------------------------------------------------

MIN = "min"
MAX = "max"

# Name parts telling the direction of a monitored value. Long words match anywhere in the name;
# short ones must be a whole `_`-separated part ("val_mae", not "maestro").
_MIN_WORDS = ("loss", "error", "crossentropy", "perplexity", "hinge", "distance")
_MIN_PARTS = ("mae", "mse", "rmse", "mape", "msle", "nll", "wer", "cer", "ppl", "err")
_MAX_WORDS = ("accuracy", "precision", "recall", "auroc", "jaccard", "dice", "bleu", "rouge")
_MAX_PARTS = ("acc", "f1", "auc", "iou", "r2", "map", "chrf", "meteor", "exact", "em")


def torchmetrics_direction(name: str) -> str | None:
    """`higher_is_better` of the torchmetrics class a metric name was made from, as "max" /
    "min", or None when no such class says.

    fitkit names a `torchmetrics.Metric` instance by its class in snake case
    (`PearsonCorrCoef` -> `pearson_corr_coef`, logged as `val_pearson_corr_coef`)."""
    base = name[4:] if name.startswith("val_") else name
    camel = "".join(part[:1].upper() + part[1:] for part in base.split("_") if part)
    if not camel.isidentifier():
        return None
    try:
        from fitkit.common.quiet_import import quiet_import

        torchmetrics = quiet_import("torchmetrics")
    except ImportError:  # pragma: no cover - a core dependency
        return None
    cls = getattr(torchmetrics, camel, None)
    better = getattr(cls, "higher_is_better", None) if isinstance(cls, type) else None
    if better is None:
        return None
    return MAX if better else MIN


def direction_from_name(name: str) -> str | None:
    """"min" or "max" as the name tells (`loss`, `error`, `mae`, ... go down; `accuracy`,
    `f1`, `auroc`, ... go up; else the torchmetrics class of that name), or None."""
    low = name.lower()
    parts = set(re.split(r"[^a-z0-9]+", low))
    if any(w in low for w in _MIN_WORDS) or parts & set(_MIN_PARTS):
        return MIN
    if any(w in low for w in _MAX_WORDS) or parts & set(_MAX_PARTS):
        return MAX
    return torchmetrics_direction(low)


def direction(name: str, directions: Mapping[str, str] | None = None, greater_is_better: bool | None = None) -> str | None:
    """Which way the logged value `name` improves: "min", "max", or None when unknown. The one
    rule best-model tracking, `EarlyStopping`, `ModelCheckpoint`, `ReduceLROnPlateau` and HF's
    callbacks all follow, in this order:

    1. `greater_is_better` when set (`TrainingArguments.greater_is_better`; a callback's
       `mode="min"`/`"max"` is the same choice);
    2. the compiled metric's own `higher_is_better` (`directions`: the run's
       `metric_directions`), under `name` or its other spellings (`val_acc`, `eval_acc`, `acc`);
    3. the name's words (`direction_from_name`: `loss`, `error`, `wer`, `mae`, ... go down;
       `accuracy`, `f1`, `bleu`, ... go up; else the torchmetrics class of that name).

        direction("val_error")                  # 'min'
        direction("eval_bleu")                  # 'max'
        direction("val_score", {"val_score": "min"})  # 'min'
    """
    if greater_is_better is not None:
        return MAX if greater_is_better else MIN
    for key in metric_candidates(name) + ([_bare(name)] if _bare(name) != name else []):
        found = (directions or {}).get(key)
        if found in (MIN, MAX):
            return found
    return direction_from_name(name)


def greater_is_better(name: str, directions: Mapping[str, str] | None = None,
                      explicit: bool | None = None) -> bool:
    """`direction` as a bool, with Hugging Face's default for a name nothing decides (higher is
    better unless the name ends in "loss", which `direction_from_name` already caught)."""
    return direction(name, directions, explicit) != MIN


def _bare(name: str) -> str:
    for prefix in ("val_", "eval_", "test_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


#: The speed figures of an evaluation record under HF's names (`eval_runtime`, ...).
SPEED_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second")


def keras_names(logs: Mapping[str, Any]) -> dict[str, Any]:
    """A record under Keras' names: an evaluation logged as HF's Trainer logs it (under HF's
    arguments: `eval_loss`, `eval_accuracy`, `eval_runtime`, ...) becomes `val_loss`,
    `val_accuracy`, its speed figures left out; other records are unchanged::

        keras_names({"eval_loss": 0.5, "eval_runtime": 0.1, "epoch": 1.0})   # {"val_loss": 0.5, "epoch": 1.0}
    """
    return {("val_" + k[5:] if k.startswith("eval_") else k): v for k, v in logs.items()
            if not (k.startswith("eval_") and k.endswith(SPEED_SUFFIXES))}


# -- the value `metric_for_best_model` names --------------------------------------------------

def metric_candidates(name: str) -> list[str]:
    """The names `metric_for_best_model` may be logged under: HF's `eval_accuracy` and a bare
    `accuracy` are fitkit's `val_accuracy` (and the other way round)::

        metric_candidates("accuracy")       # ['accuracy', 'val_accuracy', 'eval_accuracy']
        metric_candidates("eval_accuracy")  # ['eval_accuracy', 'val_accuracy']
    """
    for prefix, other in (("eval_", "val_"), ("val_", "eval_")):
        if name.startswith(prefix):
            return [name, other + name[len(prefix):]]
    return [name, "val_" + name, "eval_" + name]


def best_metric_key(name: str, values: Mapping[str, Any], required: bool = True) -> str | None:
    """The key of `values` (an evaluation's metrics) that `metric_for_best_model`=`name` means.
    None when none matches and not `required`; with `required`, a `ValueError` listing the
    evaluation's names."""
    for key in metric_candidates(name):
        if key in values:
            return key
    if not required:
        return None
    raise ValueError(
        f"`metric_for_best_model`={name!r} matches none of the evaluation's values "
        f"({', '.join(sorted(values)) or 'none'}): pass one of them (HF's 'eval_' spelling and a bare name work "
        "too, e.g. 'accuracy' or 'eval_accuracy' for 'val_accuracy')"
    )
