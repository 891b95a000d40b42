"""Metrics by name, `torchmetrics.Metric` or callable, computed as exact dataset values.

Named metrics become torchmetrics objects when the first batch is seen, which tells the
task (binary, multiclass, multilabel, regression) and the class count. Metrics accumulate on
the device; nothing is read back to the host until `compute()` (once per epoch or evaluation).
Named classification metrics count (or keep) what they see, so one update over many batches
equals one per batch: their batches are held on the device and given to torchmetrics in blocks
(`HELD_BYTES`), which leaves a batch with the work a hand-written loop does for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from fitkit.adapters.counted_accuracy import CountedAccuracy
from fitkit.adapters.keras_metrics import (
    KERAS_MEANS,
    KERAS_REFUSED,
    KerasMean,
    KerasObjectMetric,
    Weighted,
    check_keras_object,
    distributed,
    function_mean,
    is_keras_metric,
    keras_mean,
)
from fitkit.adapters.losses import keras_order
from fitkit.adapters.outputs import (
    PREDICTION_KEYS,
    LossParts,
    OutputMetric,
    is_structure,
    output_names,
    pick,
    single_output,
)
from fitkit.common.options import did_you_mean

NAMES = ("accuracy", "mae", "mse", "f1", "precision", "recall", "auroc")
#: Keras 3's metric names: the metric each computes. Keras settles the task by the name, not by
#: the data (`_keras_task`); they are logged under the name given, as Keras logs them.
KERAS_NAMES = {"sparse_categorical_accuracy": "accuracy", "categorical_accuracy": "accuracy",
               "binary_accuracy": "accuracy", "top_k_categorical_accuracy": "top_k", "auc": "auroc",
               "mean_absolute_error": "mae", "mean_squared_error": "mse"}
_ALIASES = {"acc": "accuracy", **KERAS_NAMES}
#: Names fitkit computes with torchmetrics (Keras' values where Keras has the name); every other
#: Keras name is `fitkit.adapters.keras_metrics`'.
_TORCHMETRICS_NAMES = {*NAMES, *_ALIASES}
#: fitkit's names that are Keras' classes where Keras' meaning applies: weighted, and on targets of
#: the outputs' shape (`_keras_elementwise`), the Keras metric (`KERAS_MEANS`) computes them.
_KERAS_CLASS_OF = {"precision": "Precision", "recall": "Recall"}


def keras_computed(name: str) -> bool:
    """Whether a metric name is one of Keras' that `fitkit.adapters.keras_metrics` computes
    (rather than fitkit's torchmetrics names, which give the same values unweighted). Class names
    (`"Precision"`, `"MAE"`) are Keras' metrics, computed there, even where the lower-case name is
    fitkit's."""
    return name in KERAS_MEANS and name not in _TORCHMETRICS_NAMES


def _weighted_entry(name: str) -> str:
    """The `KERAS_MEANS` name a weighted metric name is computed by, or a clear error."""
    key = name if name in KERAS_MEANS else _KERAS_CLASS_OF.get(name.lower(), name.lower())
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
        elif callable(spec) or _is_metric(spec):
            out.append(spec)
        else:
            raise TypeError(f"`metrics` items must be names, torchmetrics.Metric objects or callables; got {spec!r}")
    return out


def _check_name(spec: str) -> None:
    if spec in KERAS_REFUSED:
        raise ValueError(f"metric {spec!r}: {KERAS_REFUSED[spec]}")
    if keras_computed(spec) or _ALIASES.get(spec.lower(), spec.lower()) in (*NAMES, "top_k"):
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
            _weighted_entry(inner)  # refused now, not at the first batch
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


def _is_metric(obj: Any) -> bool:
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
    if _is_metric(spec):
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
        return HIGHER_IS_BETTER[_ALIASES.get(spec.lower(), spec.lower())]
    if _is_metric(spec):
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


_distributed = distributed


class _Mean:
    """A batch-size-weighted mean of a callable metric, accumulated on the device."""

    higher_is_better = None

    def __init__(self, fn: Callable[..., Any] | None):  # None: `_Part`, whose `update` calls none
        self.fn = fn
        self.total: torch.Tensor | float = 0.0
        self.count = 0

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        n = preds.shape[0] if preds.dim() else 1
        assert self.fn is not None  # only `_Part` has none, and it updates otherwise
        value = self.fn(preds, target)
        if not isinstance(value, torch.Tensor):  # a number (fit's first-batch check refused anything else)
            value = torch.tensor(float(value), device=preds.device)
        elif value.dim():  # one value of shape (1,) and the like
            value = value.reshape(())
        self.total = self.total + value.detach().float() * n
        self.count += n

    def compute(self) -> torch.Tensor:
        total = torch.as_tensor(self.total, dtype=torch.float64)
        count = torch.tensor(float(self.count), dtype=torch.float64, device=total.device)
        if _distributed():
            both = torch.stack([total.to(count.device), count])
            torch.distributed.all_reduce(both)
            total, count = both[0], both[1]
        return total / count.clamp(min=1)

    def reset(self) -> None:
        self.total, self.count = 0.0, 0


def _infer(key: str, preds: torch.Tensor, target: torch.Tensor) -> tuple[str, int]:
    """The task (regression, binary, multiclass, onehot, multilabel) and class count of a batch."""
    if key in ("mae", "mse"):
        return "regression", 1
    classes = preds.shape[-1] if preds.dim() >= 2 else 1
    if classes > 1 and target.shape == preds.shape:
        # one-hot rows (Keras' categorical targets) are multiclass; anything else is multilabel
        onehot = bool(((target == 0) | (target == 1)).all() and (target.sum(-1) == 1).all())
        return ("onehot" if onehot else "multilabel"), classes
    return ("multiclass" if classes > 1 else "binary"), classes


def _keras_elementwise(name: str, preds: Any, target: Any, saved: dict | None) -> bool:
    """Whether fitkit's `"precision"` / `"recall"` take Keras' meaning: targets of the outputs'
    shape (one-hot or several labels) are thresholded element by element, as Keras' `Precision`
    does; class indices, which Keras' metric does not take, keep fitkit's macro average. A saved
    state tells by having no task."""
    if name.lower() not in _KERAS_CLASS_OF:
        return False
    if saved is not None:
        return "_task" not in saved
    return isinstance(preds, torch.Tensor) and isinstance(target, torch.Tensor) and preds.shape == target.shape


def _keras_task(name: str, preds: torch.Tensor, target: torch.Tensor) -> tuple[str, int] | None:
    """The task a Keras metric name fixes (None: inferred from the batch as for fitkit's names).
    Predictions are fitkit's logits: a Keras model's sigmoid / softmax outputs thresholded at
    0.5 / compared by argmax give the same values."""
    classes = preds.shape[-1] if preds.dim() >= 2 else 1
    if name in ("accuracy", "acc") and classes > 1 and target.shape == preds.shape:
        return "onehot", classes  # Keras' "accuracy" on targets of the outputs' shape: categorical (argmax) accuracy
    if name == "sparse_categorical_accuracy" and classes > 1:
        return "multiclass", classes
    if name == "categorical_accuracy" and classes > 1:
        return "onehot", classes  # argmax of the targets: one-hot or probability rows
    if name == "binary_accuracy":
        return ("binary", 1) if classes == 1 else ("multilabel", classes)
    if name == "top_k_categorical_accuracy" and classes > 1:
        return "top_k", classes
    if name == "auc" and (classes == 1 or target.shape == preds.shape):
        # Keras' AUC: 200 thresholds on the scores, not the exact area; several label columns are
        # one curve over every (sample, label) score, as Keras' AUC(multi_label=False) computes it
        return "auc", 1
    return None


def _construct(key: str, kind: str, classes: int):
    from fitkit.common.quiet_import import quiet_import

    C = quiet_import("torchmetrics.classification")
    R = quiet_import("torchmetrics.regression")

    if kind == "top_k":  # Keras' k=5 (every class counts when there are fewer)
        return C.MulticlassAccuracy(num_classes=classes, top_k=min(5, classes), average="micro", validate_args=False)
    if kind == "auc":
        return C.BinaryAUROC(thresholds=200, validate_args=False)
    if kind == "regression":
        return R.MeanAbsoluteError() if key == "mae" else R.MeanSquaredError()
    common = {"validate_args": False}
    if kind in ("multiclass", "onehot"):
        kinds = {
            "accuracy": lambda: C.MulticlassAccuracy(num_classes=classes, average="micro", **common),
            "f1": lambda: C.MulticlassF1Score(num_classes=classes, average="macro", **common),
            "precision": lambda: C.MulticlassPrecision(num_classes=classes, average="macro", **common),
            "recall": lambda: C.MulticlassRecall(num_classes=classes, average="macro", **common),
            "auroc": lambda: C.MulticlassAUROC(num_classes=classes, **common),
        }
    elif kind == "multilabel":
        kinds = {
            "accuracy": lambda: C.MultilabelAccuracy(num_labels=classes, **common),
            "f1": lambda: C.MultilabelF1Score(num_labels=classes, **common),
            "precision": lambda: C.MultilabelPrecision(num_labels=classes, **common),
            "recall": lambda: C.MultilabelRecall(num_labels=classes, **common),
            "auroc": lambda: C.MultilabelAUROC(num_labels=classes, **common),
        }
    else:
        kinds = {
            "accuracy": lambda: C.BinaryAccuracy(**common), "f1": lambda: C.BinaryF1Score(**common),
            "precision": lambda: C.BinaryPrecision(**common), "recall": lambda: C.BinaryRecall(**common),
            "auroc": lambda: C.BinaryAUROC(**common),
        }
    return kinds[key]()


def _prepare(kind: str, name: str, preds: torch.Tensor, target: torch.Tensor):
    """Shape and scale predictions so torchmetrics never has to inspect values (no host sync)."""
    if kind == "regression":
        if preds.dim() == target.dim() + 1 and preds.shape[-1] == 1:
            preds = preds.squeeze(-1)
        return preds.float(), target.float()
    if kind in ("multiclass", "onehot", "top_k"):
        if kind == "onehot" or (kind == "top_k" and target.shape == preds.shape):
            target = target.argmax(-1)
        elif kind == "multiclass" and target.dim() == preds.dim() and target.shape[-1] == 1:
            target = target.squeeze(-1)  # (N, 1) class indices: Keras' sparse metrics squeeze them
        if name == "auroc":
            preds = preds.float().softmax(-1)
        return preds, target
    if preds.dim() == target.dim() + 1 and preds.shape[-1] == 1:
        preds = preds.squeeze(-1)
    if name == "auroc" or kind == "auc":  # scores in [0, 1]; logits are assumed
        return preds.float().sigmoid(), target.long()
    return (preds > 0).long(), target.long()  # logits -> hard labels (binary and multilabel)


#: The kinds of named metrics whose torchmetrics states are integer counts or kept predictions:
#: an update over the concatenation of batches gives what one update per batch gives, bit for
#: bit. Regression metrics (float sums, rounded per update) and callables are updated per batch.
BLOCK_KINDS = frozenset({"binary", "multiclass", "onehot", "multilabel", "top_k", "auc"})
#: The most bytes of predictions and targets a metric holds before it updates (one update per
#: block of batches instead of one per batch: torchmetrics' update costs far more per call than
#: the arithmetic of a small batch).
HELD_BYTES = 16 * 2**20


class Spares:
    """Named torchmetrics objects that finished metric sets gave back (`MetricSet.release`),
    reset, by (name, task, classes, device). Constructing one costs 0.1 - 0.5 ms (its
    `__init__` adds and deep-copies each state; a reset is 10 - 60 us): a search builds the
    training and validation metrics of every trial, `evaluate` its metrics at every call, and
    either can cost more than a small trial's validation pass."""

    #: The most spares kept per key (a set holds one metric per key and output).
    PER_KEY = 4

    def __init__(self) -> None:
        self._free: dict[tuple, list[Any]] = {}

    def take(self, key: tuple) -> Any:
        """A reset metric for `key`, or None when there is none spare."""
        free = self._free.get(key)
        return free.pop() if free else None

    def give(self, key: tuple, metric: Any) -> None:
        free = self._free.setdefault(key, [])
        if len(free) < self.PER_KEY and all(m is not metric for m in free):
            metric.reset()
            free.append(metric)


_SPARES = Spares()


class _Held:
    """The prepared batches not yet given to the block metrics that see the same output and
    prepare it alike (accuracy, F1, precision and recall of one output share one argmax a batch
    and one concatenation): `indices` are those metrics' places in the set."""

    __slots__ = ("kind", "key", "select", "labels", "indices", "preds", "targets", "nbytes")

    def __init__(self, kind: str, key: str, select: Any) -> None:
        self.kind, self.key, self.select = kind, key, select
        # what torchmetrics' update does first for class scores: hold labels, not scores
        self.labels = kind in ("multiclass", "onehot") and key != "auroc"
        self.indices: list[int] = []
        self.preds: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        self.nbytes = 0

    @staticmethod
    def group(kind: str, key: str, select: Any) -> tuple:
        """What metrics sharing a `_Held` have in common (`_prepare` differs only for AUROC)."""
        return kind, key == "auroc", select

    def add(self, preds: torch.Tensor, target: torch.Tensor) -> int:
        """Hold one batch; the bytes held now."""
        preds, target = _prepare(self.kind, self.key, preds, target)
        if self.labels and preds.dim() == 2 and target.dim() == 1:
            preds = preds.argmax(dim=1)
        self.preds.append(preds)
        self.targets.append(target)
        self.nbytes += preds.nbytes + target.nbytes
        return self.nbytes

    def give(self, items: list) -> None:
        if not self.preds:
            return
        preds, targets = self.preds, self.targets
        self.clear()
        if len(preds) == 1:
            joined, target = preds[0], targets[0]
        else:
            joined, target = torch.cat(preds), torch.cat(targets)
        for index in self.indices:
            items[index][1].update(joined, target)

    def clear(self) -> None:
        self.preds, self.targets, self.nbytes = [], [], 0


#: One built metric of a `MetricSet`: (log name, metric, kind, key, select, weight), `select` being
#: the `OutputMetric.select` of a metric of one output (None: the whole model's output) and `weight`
#: what picks its sample weights from a batch's (None: an unweighted metric).
_Item = tuple[str, Any, str, str, Callable[[Any, Any], tuple[Any, Any]] | None, Callable[[Any, Any], Any] | None]


class MetricSet:
    """The metrics of one phase (train or validation). `prefix` is `""` or `"val_"`."""

    def __init__(self, specs: list, prefix: str = ""):
        self.specs = specs
        self.prefix = prefix
        self._items: list[_Item] | None = None
        self._pending: dict | None = None  # states to apply once the metrics are built
        self._tasks: dict[str, tuple[str, int]] = {}
        self._held: list[_Held] = []  # the block metrics' batches not given yet, one per group
        self._each: list[int] = []  # the indices of the metrics updated at every batch
        self._spares: dict[int, tuple] = {}  # by item index: the `Spares` key of a named torchmetrics metric
        self.device = torch.device("cpu")  # where metrics rebuilt from a saved state live

    def __bool__(self) -> bool:
        return any(not isinstance(spec, LossParts) or spec.active for spec in self.specs)

    @property
    def names(self) -> list[str]:
        return [self.prefix + n for n in self._base_names()]

    @property
    def base_names(self) -> list[str]:
        """The metrics' names without the prefix, in order."""
        return self._base_names()

    def _base_names(self) -> list[str]:
        if self._items is not None:
            return [name[len(self.prefix):] for name, *_ in self._items]
        names: list[str] = []
        for spec in self.specs:
            names.extend(spec.names() if isinstance(spec, LossParts) else [metric_name(spec)])
        return names

    def _build(self, outputs: Any, target: Any, saved: dict | None = None) -> None:
        """Build the metrics from the first batch, or from a saved state's task and class count."""
        # Their states are ordinary tensors even when the first batch comes under inference mode
        # (`evaluate`): a Keras variable is reset in place later, outside it.
        with torch.inference_mode(False):
            self._build_items(outputs, target, saved)

    def _build_items(self, outputs: Any, target: Any, saved: dict | None) -> None:
        items: list[_Item] = []
        for spec in self.specs:
            if isinstance(spec, LossParts):
                names = spec.names() if saved is None else [
                    k[len(self.prefix):] for k in saved if k.startswith(self.prefix) and k.endswith("_loss")]
                items.extend((self.prefix + name, _Part(spec, name[: -len("_loss")]), "part", name, None, None)
                             for name in names)
                continue
            name, select = metric_name(spec), (spec.select if isinstance(spec, OutputMetric) else None)
            base = spec.spec if isinstance(spec, OutputMetric) else spec
            weight = None
            if isinstance(base, Weighted):
                base, weight = base.spec, _weight_picker(spec)
            preds: Any  # the batch's output and target (None: rebuilt from a saved state)
            tgt: Any
            preds, tgt = (None, None) if saved is not None else _select(select, outputs, target)
            metric: Any
            if isinstance(base, str) and (weight is not None or keras_computed(base)):
                metric, kind, key = keras_mean(_weighted_entry(base) if weight is not None else base), "keras", name
            elif is_keras_metric(base):
                metric, kind, key = KerasObjectMetric(base), "keras", name
            elif isinstance(base, str) and _keras_elementwise(base, preds, tgt, saved.get(self.prefix + name) if saved is not None else None):
                metric, kind, key = keras_mean(_KERAS_CLASS_OF[base.lower()]), "keras", name
            elif isinstance(base, str):
                key = _ALIASES.get(base.lower(), base.lower())
                if saved is not None:
                    kind, classes = saved[self.prefix + name]["_task"]
                else:
                    kind, classes = _keras_task(base.lower(), preds, tgt) or _infer(key, preds, tgt)
                device = preds.device if preds is not None else self.device
                counted = key == "accuracy" and kind in ("multiclass", "onehot") and not _distributed()
                spare = (key, kind, classes, device, counted)
                self._spares[len(items)] = spare
                metric = _SPARES.take(spare)
                if metric is None:
                    metric = CountedAccuracy(classes, device) if counted else _construct(key, kind, classes).to(device)
                self._tasks[self.prefix + name] = (kind, classes)
                items.append((self.prefix + name, metric, kind, key, select, weight))
                continue
            elif _is_metric(base):
                metric = base.clone() if hasattr(base, "clone") else base
                kind, key = "custom", name
            elif keras_order(base):  # Keras' MeanMetricWrapper of a function of (y_true, y_pred)
                metric, kind, key = function_mean(base), "keras", name
            else:
                metric, kind, key = _Mean(base), "custom", name
            if hasattr(metric, "to"):
                metric = metric.to(preds.device if preds is not None else self.device)
            items.append((self.prefix + name, metric, kind, key, select, weight))
        self._items = items
        self._held, self._each = _grouped(items)
        if self._pending:
            self._apply(self._pending)
            self._pending = None

    def _give_held(self) -> None:
        """Update the block metrics with the batches they hold (before anything reads them)."""
        if self._items is None:
            return
        for held in self._held:
            if held.preds:
                held.give(self._items)

    def export_state(self) -> dict | None:
        """The accumulated values (tensors and numbers), to resume an epoch exactly."""
        if not self._items:
            return None
        self._give_held()
        out: dict[str, dict[str, Any]] = {}
        for name, metric, *_ in self._items:
            if isinstance(metric, (_Mean, KerasMean)):
                out[name] = {"total": torch.as_tensor(metric.total).cpu(), "count": torch.as_tensor(metric.count).cpu()
                             if isinstance(metric, KerasMean) else metric.count}
            elif isinstance(metric, KerasObjectMetric):
                out[name] = metric.export()
            else:
                # Under several processes, the states of all of them (rank 0 saves and restores).
                synced = _distributed() and not getattr(metric, "_is_synced", True)
                if synced:
                    metric.sync()
                out[name] = {k: (v.cpu() if isinstance(v, torch.Tensor) else [t.cpu() for t in v])
                             for k, v in metric.metric_state.items()}
                if synced:
                    metric.unsync()
            if name in self._tasks:
                out[name]["_task"] = list(self._tasks[name])
        return out

    def load_state(self, states: dict | None) -> None:
        if not states:
            return
        for held in self._held:
            held.clear()
        if self._items is not None:
            self._apply(states)
        elif all(isinstance(spec, (str, LossParts)) or isinstance(getattr(spec, "spec", None), str)
                 for spec in self.specs):
            self._pending = states
            self._build(None, None, saved=states)  # names only: rebuild now, no batch needed
        else:
            self._pending = states

    def _apply(self, states: dict) -> None:
        assert self._items is not None  # applied to built metrics only
        for name, metric, *_ in self._items:
            saved = states.get(name)
            if saved is None:
                continue
            if isinstance(metric, (_Mean, KerasMean)):
                metric.total, metric.count = saved["total"], saved["count"]
                continue
            if isinstance(metric, (KerasObjectMetric, CountedAccuracy)):
                metric.load(saved)
                continue
            device = metric.device
            for key, value in saved.items():
                if key == "_task":
                    continue
                setattr(metric, key, value.to(device) if isinstance(value, torch.Tensor) else [t.to(device) for t in value])
            metric._update_count = max(metric._update_count, 1)
            metric._computed = None

    def higher_is_better(self) -> dict[str, bool | None]:
        if self._items is None:
            return {}
        return {name: getattr(metric, "higher_is_better", None) for name, metric, *_ in self._items}

    def update(self, outputs: Any, target: Any, sample_weight: Any = None) -> None:
        """Add one batch; `sample_weight` reaches the metrics of `weighted_metrics` only (Keras)."""
        if self._items is None:
            self._build(outputs, target)
        assert self._items is not None  # set by `_build`
        items, plain, nbytes = self._items, None, 0
        for index in self._each:
            _, metric, kind, key, select, weight = items[index]
            if kind == "part":
                preds, tgt = None, target
            elif select is None:
                if plain is None:
                    plain = _whole(outputs, target)
                preds, tgt = plain
            else:
                preds, tgt = _select(select, outputs, target)
            w = weight(outputs, sample_weight) if weight is not None and sample_weight is not None else None
            _update(metric, kind, key, preds, tgt, w)
        for held in self._held:
            if held.select is None:
                if plain is None:
                    plain = _whole(outputs, target)
                nbytes += held.add(*plain)
            else:
                nbytes += held.add(*_select(held.select, outputs, target))
        if nbytes > HELD_BYTES:
            self._give_held()

    def update_one(self, index: int, outputs: Any, target: Any, sample_weight: Any = None) -> None:
        """Update only the `index`-th metric (`Model.metrics[i].update_state` in a custom step)."""
        if self._items is None:
            self._build(outputs, target)
        assert self._items is not None  # set by `_build`
        self._give_held()
        _, metric, kind, key, select, weight = self._items[index]
        preds, tgt = _select(select, outputs, target) if kind != "part" else (None, target)
        w = weight(outputs, sample_weight) if weight is not None and sample_weight is not None else None
        _update(metric, kind, key, preds, tgt, w)

    def compute(self) -> dict[str, float]:
        if not self._items:
            return {}
        self._give_held()
        return {name: float(metric.compute()) for name, metric, *_ in self._items}

    def results(self) -> dict[str, torch.Tensor]:
        """The values so far as device tensors (no host read), under the names without prefix:
        what `Model.compute_metrics` returns in a custom step."""
        if not self._items:
            return {}
        self._give_held()
        return {name[len(self.prefix):]: metric.compute() for name, metric, *_ in self._items}

    def result_of(self, index: int) -> torch.Tensor | None:
        """The `index`-th metric's value so far (None before its first update)."""
        if not self._items:
            return None
        self._give_held()
        return self._items[index][1].compute()

    def release(self) -> None:
        """Give the built named metrics to the sets built after this one (`Spares`), which then
        skip constructing them; this set is as before its first update (it builds anew if used
        again). Call it where the set's values are read and the set is done with::

            metrics = MetricSet(["accuracy"])
            metrics.update(outputs, target)
            values = metrics.compute()
            metrics.release()
        """
        if self._items is None:
            return
        for index, spare in self._spares.items():
            _SPARES.give(spare, self._items[index][1])
        self._items, self._held, self._each, self._spares, self._tasks = None, [], [], {}, {}

    def reset(self) -> None:
        self._pending = None
        for held in self._held:
            held.clear()
        for _, metric, *_ in self._items or ():
            metric.reset()


def _grouped(items: list[_Item]) -> tuple[list[_Held], list[int]]:
    """The block metrics of `items` (unweighted, of a kind whose state counts) grouped by what
    they hold, and the indices of the others, updated at every batch."""
    groups: dict[tuple, _Held] = {}
    each: list[int] = []
    for index, (_, _, kind, key, select, weight) in enumerate(items):
        if kind in BLOCK_KINDS and weight is None:
            held = groups.setdefault(_Held.group(kind, key, select), _Held(kind, key, select))
            held.indices.append(index)
        else:
            each.append(index)
    return list(groups.values()), each


def _whole(outputs: Any, target: Any) -> tuple[Any, Any]:
    """`_select` for a metric of the whole model's output; one tensor (the common case) directly."""
    if type(outputs) is torch.Tensor:
        return (outputs.detach() if outputs.requires_grad else outputs), target
    return _select(None, outputs, target)


def _select(select: Any, outputs: Any, target: Any) -> tuple[Any, Any]:
    """What one metric sees: its output and target (`OutputMetric.select`), or for a metric of
    the whole model the one output matching one target (`single_output`), detached."""
    if select is not None:
        preds, tgt = select(outputs, target)
    else:
        if is_structure(target) and is_structure(outputs) and not (isinstance(outputs, dict) and any(
                k in outputs for k in PREDICTION_KEYS)):
            raise ValueError(
                "`metrics` is a flat list but the module returned several outputs with one target each: pass the metrics "
                "per output, a list of lists in the outputs' order or a dict by output name (Keras 3 asks the same)")
        preds, tgt = single_output(outputs, target, what="metrics"), target
    return (preds.detach() if isinstance(preds, torch.Tensor) else preds), tgt


def _weight_picker(spec: Any) -> Callable[[Any, Any], Any]:
    """What picks a weighted metric's sample weights from a batch's: one array weighs every
    output; a list or dict gives each output its own (the first for all when there are fewer
    weights than outputs, as Keras repeats it)."""
    key = spec.key if isinstance(spec, OutputMetric) else None

    def pick_weight(outputs: Any, sample_weight: Any) -> Any:
        if not is_structure(sample_weight):
            return sample_weight
        if key is None or not is_structure(outputs):
            return next(iter(sample_weight.values())) if isinstance(sample_weight, dict) else sample_weight[0]
        names = output_names(outputs)
        if isinstance(sample_weight, (list, tuple)) and len(sample_weight) < len(names):
            return sample_weight[0]
        return pick(sample_weight, key, names, "sample_weight")

    return pick_weight


def _update(metric: Any, kind: str, key: str, preds: Any, target: Any, weight: Any = None) -> None:
    if kind == "part":
        metric.update(target)
    elif kind == "keras":
        metric.update(preds, target, weight)
    elif kind == "custom":
        metric.update(preds, target)
    else:
        metric.update(*_prepare(kind, key, preds, target))


class _Part(_Mean):
    """One output's loss (`<output>_loss`), as the compiled loss computed it this batch, averaged
    over the samples like the loss."""

    def __init__(self, parts: LossParts, output: str):
        super().__init__(None)
        self.parts, self.output = parts, output

    def update(self, target: Any) -> None:  # type: ignore[override]
        values = self.parts.parts()
        if not values or self.output not in values:
            return
        value = values[self.output]
        n = _rows(target)
        self.total = self.total + value.float() * n
        self.count += n


def _rows(target: Any) -> int:
    while isinstance(target, (tuple, list, dict)):
        target = next(iter(target.values())) if isinstance(target, dict) else target[0]
    return int(target.shape[0]) if isinstance(target, torch.Tensor) and target.dim() else 1
