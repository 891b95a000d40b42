"""What `metrics=` and `weighted_metrics=` may hold, checked at `compile`: the names fitkit and
Keras know, the name each metric is logged under, and which way each improves. Nothing is built
and no data is looked at; torchmetrics is not imported::

    specs = check_metrics(["accuracy", torchmetrics.MeanAbsoluteError()])
    [metric_name(s) for s in specs]   # ["accuracy", "mean_absolute_error"]
    metric_directions(specs)          # {"accuracy": "max", "val_accuracy": "max", ..., "loss": "min", ...}
"""

from __future__ import annotations

import re
from typing import Any

from fitkit.adapters.keras_metrics import (
    KERAS_MEANS,
    KERAS_REFUSED,
    Weighted,
    check_keras_object,
    is_keras_metric,
)
from fitkit.adapters.losses import keras_order
from fitkit.adapters.outputs import LossParts, OutputMetric
from fitkit.common.options import did_you_mean

NAMES = ("accuracy", "mae", "mse", "f1", "precision", "recall", "auroc")
#: Keras 3's metric names: the metric each computes. Keras settles the task by the name, not by
#: the data (`fitkit.adapters.metric_tasks.keras_task`); they are logged under the name given, as Keras logs them.
KERAS_NAMES = {"sparse_categorical_accuracy": "accuracy", "categorical_accuracy": "accuracy",
               "binary_accuracy": "accuracy", "top_k_categorical_accuracy": "top_k", "auc": "auroc",
               "mean_absolute_error": "mae", "mean_squared_error": "mse"}
ALIASES = {"acc": "accuracy", **KERAS_NAMES}
#: Names fitkit computes with torchmetrics (Keras' values where Keras has the name); every other
#: Keras name is `fitkit.adapters.keras_metrics`'.
_TORCHMETRICS_NAMES = {*NAMES, *ALIASES}
#: fitkit's names that are Keras' classes where Keras' meaning applies: weighted, and on targets of
#: the outputs' shape (`metric_tasks.keras_elementwise`), the Keras metric (`KERAS_MEANS`) computes them.
KERAS_CLASS_OF = {"precision": "Precision", "recall": "Recall"}


def keras_computed(name: str) -> bool:
    """Whether a metric name is one of Keras' that `fitkit.adapters.keras_metrics` computes
    (rather than fitkit's torchmetrics names, which give the same values unweighted). Class names
    (`"Precision"`, `"MAE"`) are Keras' metrics, computed there, even where the lower-case name is
    fitkit's."""
    return name in KERAS_MEANS and name not in _TORCHMETRICS_NAMES


def weighted_entry(name: str) -> str:
    """The `KERAS_MEANS` name a weighted metric name is computed by, or a clear error."""
    key = name if name in KERAS_MEANS else KERAS_CLASS_OF.get(name.lower(), name.lower())
    if key not in KERAS_MEANS:
        raise ValueError(f"`weighted_metrics` cannot weight {name!r} (fitkit computes it over all samples, unweighted): "
                         f"pass it in `metrics=`, or a `keras.metrics` object (e.g. keras.metrics.AUC()) in "
                         "`weighted_metrics`, which runs weighted as in Keras")
    return key


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _per_output(specs: Any) -> list | None:
    """Keras' per-output `metrics` (a dict by output name, or a list holding lists or None) as
    `OutputMetric`s; None for a flat list."""
    if isinstance(specs, dict):
        pairs = list(specs.items())
    elif isinstance(specs, (list, tuple)) and any(s is None or isinstance(s, (list, tuple)) for s in specs):
        pairs = list(enumerate(specs))
    else:
        return None
    out = []
    for key, entry in pairs:
        for spec in check_metrics(entry):
            out.append(spec if isinstance(spec, OutputMetric) else OutputMetric(spec, key))
    return out


def check_metrics(specs: Any) -> list:
    """Validate at `compile`: names are known, objects are metrics or callables; a dict by
    output name or a list of lists (one per output, Keras 3) gives `OutputMetric`s."""
    if specs is None:
        return []
    nested = _per_output(specs)
    if nested is not None:
        return nested
    if isinstance(specs, str) or callable(specs):
        specs = [specs]
    out: list[Any] = []  # names, metric objects, callables, OutputMetric and LossParts specs
    for spec in specs:
        if isinstance(spec, (OutputMetric, LossParts, Weighted)):
            out.append(spec)
            continue
        if isinstance(spec, str):
            _check_name(spec)
            out.append(spec)
        elif is_keras_metric(spec):
            check_keras_object(spec)
            out.append(spec)
        elif callable(spec) or is_metric(spec):
            out.append(spec)
        else:
            raise TypeError(f"`metrics` items must be names, torchmetrics.Metric objects or callables; got {spec!r}")
    return out


def _check_name(spec: str) -> None:
    if spec in KERAS_REFUSED:
        raise ValueError(f"metric {spec!r}: {KERAS_REFUSED[spec]}")
    if keras_computed(spec) or ALIASES.get(spec.lower(), spec.lower()) in (*NAMES, "top_k"):
        return
    known = (*NAMES, *sorted(n for n in KERAS_MEANS if n[0].islower()))
    raise ValueError(
        f"{did_you_mean(spec, known)}unknown metric {spec!r} in `metrics`; valid names are fitkit's {', '.join(NAMES)} "
        f"and every name of Keras' `keras.metrics` ({', '.join(known[len(NAMES):])}, ...); or pass torchmetrics.Metric "
        "or keras.metrics objects, or callables (preds, target) -> tensor"
    )


def weighted_metrics(specs: Any, unweighted: list) -> list:
    """Keras' `weighted_metrics`, checked as `metrics` are and marked `Weighted`; one whose logged
    name an unweighted metric of the same output already has becomes `weighted_<name>` (Keras)."""
    taken = {_name_key(spec) for spec in unweighted if not isinstance(spec, LossParts)}
    out = []
    for spec in check_metrics(specs):
        inner = spec.spec if isinstance(spec, OutputMetric) else spec
        if isinstance(inner, str):
            weighted_entry(inner)  # refused now, not at the first batch
        elif not (is_keras_metric(inner) or (callable(inner) and keras_order(inner))):
            raise ValueError(f"`weighted_metrics` takes metric names, keras.metrics objects or functions (y_true, y_pred) "
                             f"-> one value per sample, which are weighted as in Keras; {inner!r} cannot be weighted: "
                             "pass it in `metrics=`")
        key = _name_key(spec)
        rename = f"weighted_{metric_name(inner)}" if key in taken else None
        taken.add(key if rename is None else (key[0], rename))
        marked = Weighted(inner, rename)
        out.append(OutputMetric(marked, spec.key) if isinstance(spec, OutputMetric) else marked)
    return out


def _name_key(spec: Any) -> tuple[Any, str]:
    """(output key or None, name without the output): what two metrics must not share."""
    if isinstance(spec, OutputMetric):
        return spec.key, metric_name(spec.spec)
    return None, metric_name(spec)


def is_metric(obj: Any) -> bool:
    return type(obj).__module__.startswith("torchmetrics") or hasattr(obj, "compute") and hasattr(obj, "update")


def metric_name(spec: Any) -> str:
    """The name a metric spec is logged under (without `val_`): a name as given, a metric
    object's class in snake case (`MeanAbsoluteError` -> `mean_absolute_error`), a callable's
    `__name__`; `<output>_<name>` for a metric of one output."""
    if isinstance(spec, OutputMetric):
        return f"{spec.output}_{metric_name(spec.spec)}"
    if isinstance(spec, Weighted):
        return spec.name or metric_name(spec.spec)
    if isinstance(spec, str):
        return spec
    if is_keras_metric(spec):
        return str(spec.name)
    if is_metric(spec):
        name = _snake(type(spec).__name__)
        return f"torchmetrics_{name}" if _not_keras_value(spec, name) else name
    return getattr(spec, "__name__", type(spec).__name__)


def _not_keras_value(spec: Any, name: str) -> bool:
    """A torchmetrics object whose snake-case name is a Keras metric's but whose value is not
    Keras' (a fraction where Keras gives a percentage, a sum where Keras averages): it is logged
    as `torchmetrics_<name>`, so a Keras name never carries another value."""
    if not type(spec).__module__.startswith("torchmetrics"):
        return False
    if name == "mean_absolute_percentage_error":
        return True
    return name == "cosine_similarity" and getattr(spec, "reduction", "sum") != "mean"


#: `higher_is_better` of the torchmetrics class each metric name becomes (every task's class of a
#: name improves the same way), known here so that a run whose metrics need no torchmetrics object
#: (the multiclass "accuracy": `CountedAccuracy`) does not import torchmetrics (about a second) for
#: it; `tests/test_inference_cost.py` checks it against the classes.
HIGHER_IS_BETTER = {"accuracy": True, "f1": True, "precision": True, "recall": True, "auroc": True, "top_k": True,
                    "mae": False, "mse": False}


def _higher_is_better(spec: Any) -> bool | None:
    """`higher_is_better` of a metric spec without building it: a named metric's torchmetrics
    class, a metric object's own; None for a callable (nothing says)."""
    if isinstance(spec, Weighted):
        spec = spec.spec
    if isinstance(spec, str) and keras_computed(spec):
        return KERAS_MEANS[spec].higher_is_better
    if is_keras_metric(spec):
        return getattr(KERAS_MEANS.get(type(spec).__name__), "higher_is_better", None)
    if isinstance(spec, str):
        return HIGHER_IS_BETTER[ALIASES.get(spec.lower(), spec.lower())]
    if is_metric(spec):
        better = getattr(spec, "higher_is_better", None)
        return better if isinstance(better, bool) else None
    return None


def metric_directions(specs: Any) -> dict[str, str]:
    """Which way each logged value of a run improves, from the metric specs `check_metrics`
    returned: `{name: "min" | "max"}` under each metric's name and its `val_` name, plus
    `loss` / `val_loss` ("min"). A metric whose direction nothing tells (a plain callable, a
    torchmetrics metric with `higher_is_better=None`) is left out. Nothing is built and no data
    is looked at; torchmetrics is not imported::

        metric_directions(["accuracy", torchmetrics.MeanAbsoluteError(), my_fn])
        # {"accuracy": "max", "val_accuracy": "max", "mean_absolute_error": "min",
        #  "val_mean_absolute_error": "min", "loss": "min", "val_loss": "min"}
    """
    directions: dict[str, str] = {}
    for spec in check_metrics(specs):
        if isinstance(spec, LossParts):
            continue
        better = _higher_is_better(spec.spec if isinstance(spec, OutputMetric) else spec)
        if better is not None:
            name = metric_name(spec)
            directions[name] = directions["val_" + name] = "max" if better else "min"
    directions["loss"] = directions["val_loss"] = "min"
    return directions

