"""Keras 3's metrics with Keras' values: its metric names computed in torch, weighted as Keras' `Mean` weighs them, and its metric objects run as they are.

Three kinds of Keras metric reach `compile(metrics=..., weighted_metrics=...)`:

* a name (`"mape"`, `"MeanSquaredLogarithmicError"`, `"cosine_similarity"`, ...): every name
  `keras.metrics.get` knows is either computed here (`KERAS_MEANS`: one value per sample,
  averaged as Keras' `MeanMetricWrapper` averages it, with `sample_weight` as Keras applies it),
  computed by fitkit's torchmetrics names (`"accuracy"`, `"mae"`, `"auc"`, ...; same values), or
  refused with what to pass instead (`KERAS_REFUSED`: metrics that need arguments or return one
  value per class). Keras itself is not imported for names.
* a `keras.metrics.Metric` object: run as it is (`KerasObjectMetric`), so it gives exactly what
  Keras gives on the same outputs, under its own `name`.
* a function in Keras' order (`fn(y_true, y_pred)` returning one value per sample, such as
  `keras.metrics.mean_absolute_percentage_error`): averaged as Keras' `MeanMetricWrapper` does.

The module's outputs are fitkit's logits where Keras' metric reads probabilities to threshold
or take a log (accuracies, crossentropies, counts, precision and recall): a Keras model ending in
sigmoid / softmax gives the same values. The other metrics read the outputs as they are::

    metric = keras_mean("mape")
    metric.update(preds, target, sample_weight=None)
    metric.compute()            # Keras' MeanAbsolutePercentageError on the same data
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fitkit.adapters.losses import same_rank

EPS = 1e-7  # Keras' backend.epsilon()


def distributed() -> bool:
    """Whether this process is one of several (metric states are then summed across them)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


# -- Keras' per-sample functions, in torch (y_true first, as Keras calls them) ---------------------
def _float_pair(y_true: torch.Tensor, y_pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y_pred = y_pred.float()
    return same_rank(y_true.to(y_pred.dtype), y_pred)


def _binary_accuracy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return (y_true == (y_pred > 0).float()).float()  # logits > 0 is sigmoid > 0.5


def _sparse_labels(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    if y_true.dim() == y_pred.dim() and y_true.shape[-1] == 1:
        y_true = y_true.squeeze(-1)
    return y_true.long()


def _sparse_categorical_accuracy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    return (_sparse_labels(y_true, y_pred) == y_pred.argmax(-1)).float()


def _categorical_accuracy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    return (y_true.argmax(-1) == y_pred.argmax(-1)).float()


def _in_top_k(labels: torch.Tensor, y_pred: torch.Tensor, k: int = 5) -> torch.Tensor:
    scores = y_pred.reshape(-1, y_pred.shape[-1]).float()
    kth = scores.topk(min(k, scores.shape[-1]), dim=-1).values[:, -1:]
    hit = scores.gather(-1, labels.reshape(-1, 1).long()) >= kth  # ties count in, as Keras' in_top_k
    return hit.float().reshape(labels.shape)


def _top_k_categorical_accuracy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    return _in_top_k(y_true.argmax(-1), y_pred)


def _sparse_top_k_categorical_accuracy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    return _in_top_k(_sparse_labels(y_true, y_pred), y_pred)


def _accuracy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    """Keras' `"accuracy"`: binary, sparse or categorical by the shapes, as `compile` picks it."""
    if y_pred.dim() == 0 or y_pred.shape[-1] == 1 or y_pred.dim() == 1:
        return _binary_accuracy(y_true, y_pred)
    if y_true.dim() < y_pred.dim() or y_true.shape[-1] == 1:
        return _sparse_categorical_accuracy(y_true, y_pred)
    return _categorical_accuracy(y_true, y_pred)


def _mae(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return (y_true - y_pred).abs().mean(-1)


def _mse(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return (y_true - y_pred).square().mean(-1)


def _squared_error(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return (y_pred - y_true).square()


def _mape(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return 100.0 * ((y_true - y_pred) / y_true.abs().clamp(min=EPS)).abs().mean(-1)


def _msle(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return (torch.log(y_pred.clamp(min=EPS) + 1.0) - torch.log(y_true.clamp(min=EPS) + 1.0)).square().mean(-1)


def _cosine_similarity(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return (F.normalize(y_true, dim=-1, eps=1e-12) * F.normalize(y_pred, dim=-1, eps=1e-12)).sum(-1)


def _log_cosh(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    x = y_pred - y_true
    return (x + F.softplus(-2.0 * x) - torch.log(torch.tensor(2.0))).mean(-1)


def _huber(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return F.huber_loss(y_pred, y_true, reduction="none", delta=1.0).mean(-1)


def _poisson(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_pred = y_pred.float()
    return (y_pred - y_true.to(y_pred.dtype) * torch.log(y_pred + EPS)).mean(-1)


def _kl_divergence(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_pred = y_pred.float().clamp(EPS, 1.0)
    y_true = y_true.to(y_pred.dtype).clamp(EPS, 1.0)
    return (y_true * torch.log(y_true / y_pred)).sum(-1)


def _hinge_labels(y_true: torch.Tensor) -> torch.Tensor:
    binary = ((y_true == 0) | (y_true == 1)).all()  # 0/1 labels as -1/1, as Keras converts them (no host read)
    return torch.where(binary, 2.0 * y_true - 1.0, y_true)


def _hinge(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_pred = y_pred.float()
    return (1.0 - _hinge_labels(y_true.to(y_pred.dtype)) * y_pred).clamp(min=0.0).mean(-1)


def _squared_hinge(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_pred = y_pred.float()
    return (1.0 - _hinge_labels(y_true.to(y_pred.dtype)) * y_pred).clamp(min=0.0).square().mean(-1)


def _categorical_hinge(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_pred = y_pred.float()
    y_true = y_true.to(y_pred.dtype)
    pos = (y_true * y_pred).sum(-1)
    neg = ((1.0 - y_true) * y_pred).amax(-1)
    return (neg - pos + 1.0).clamp(min=0.0)


def _binary_crossentropy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    return F.binary_cross_entropy_with_logits(y_pred, y_true, reduction="none").mean(-1)


def _categorical_crossentropy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    return -(y_true.float() * torch.log_softmax(y_pred.float(), dim=-1)).sum(-1)


def _sparse_categorical_crossentropy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    labels = _sparse_labels(y_true, y_pred)
    return F.cross_entropy(y_pred.float().reshape(-1, y_pred.shape[-1]), labels.reshape(-1),
                           reduction="none").reshape(labels.shape)


def _binary_focal_crossentropy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    bce = F.binary_cross_entropy_with_logits(y_pred, y_true, reduction="none")
    p = torch.sigmoid(y_pred)
    p_t = y_true * p + (1.0 - y_true) * (1.0 - p)
    return ((1.0 - p_t).square() * bce).mean(-1)  # Keras' gamma=2


def _categorical_focal_crossentropy(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(y_pred.float(), dim=-1).clamp(EPS, 1.0 - EPS)
    cce = -y_true.float() * torch.log(p)
    return (0.25 * (1.0 - p).square() * cce).sum(-1)  # Keras' alpha=0.25, gamma=2


def _pearson(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    t = y_true - y_true.mean(-1, keepdim=True)
    p = y_pred - y_pred.mean(-1, keepdim=True)
    t = t / t.std(-1, keepdim=True, unbiased=False)
    p = p / p.std(-1, keepdim=True, unbiased=False)
    return (t * p).mean(-1)


def _concordance(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    y_true, y_pred = _float_pair(y_true, y_pred)
    t_mean, p_mean = y_true.mean(-1, keepdim=True), y_pred.mean(-1, keepdim=True)
    t_var = (y_true - t_mean).var(-1, keepdim=True, unbiased=False)
    p_var = (y_pred - p_mean).var(-1, keepdim=True, unbiased=False)
    covar = (y_true - p_mean) * (y_pred - p_mean)  # Keras' formula, as written there
    return (2.0 * covar / (t_var + p_var + (t_mean - p_mean).square() + EPS)).mean(-1)


def _counts(kind: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Keras' TruePositives and the like at its default threshold (0.5 on a probability: 0 on a
    logit), one count per element."""
    def count(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
        y_true, y_pred = _float_pair(y_true, y_pred)
        pred, true = y_pred > 0, y_true > 0.5
        hit = {"tp": pred & true, "fp": pred & ~true, "tn": ~pred & ~true, "fn": ~pred & true}[kind]
        return hit.float()

    return count


def _precision(y_true: torch.Tensor, y_pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y_true, y_pred = _float_pair(y_true, y_pred)
    pred = (y_pred > 0).float()
    return pred * (y_true > 0.5).float(), pred


def _recall(y_true: torch.Tensor, y_pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y_true, y_pred = _float_pair(y_true, y_pred)
    true = (y_true > 0.5).float()
    return (y_pred > 0).float() * true, true


@dataclass(frozen=True)
class KerasEntry:
    """How a Keras metric name is computed: its per-sample function, how values accumulate
    (`"mean"`: Keras' `Mean`; `"sqrt"`: the root of that mean; `"sum"`: a weighted count;
    `"ratio"`: a sum over a sum, `fn` giving both) and which way it improves."""

    fn: Callable[..., Any]
    mode: str = "mean"
    higher_is_better: bool | None = False


def _table() -> dict[str, KerasEntry]:
    up, down = True, False
    groups: list[tuple[tuple[str, ...], KerasEntry]] = [
        # "Accuracy" as text is Keras' "accuracy" too (Keras' compile reads the name case-blind); its exact-match
        # class is reachable as an object, keras.metrics.Accuracy()
        (("accuracy", "acc"), KerasEntry(_accuracy, higher_is_better=up)),
        (("binary_accuracy", "BinaryAccuracy"), KerasEntry(_binary_accuracy, higher_is_better=up)),
        (("categorical_accuracy", "CategoricalAccuracy"), KerasEntry(_categorical_accuracy, higher_is_better=up)),
        (("sparse_categorical_accuracy", "SparseCategoricalAccuracy"),
         KerasEntry(_sparse_categorical_accuracy, higher_is_better=up)),
        (("top_k_categorical_accuracy", "TopKCategoricalAccuracy"),
         KerasEntry(_top_k_categorical_accuracy, higher_is_better=up)),
        (("sparse_top_k_categorical_accuracy", "SparseTopKCategoricalAccuracy"),
         KerasEntry(_sparse_top_k_categorical_accuracy, higher_is_better=up)),
        (("mean_absolute_error", "mae", "MAE", "MeanAbsoluteError"), KerasEntry(_mae, higher_is_better=down)),
        (("mean_squared_error", "mse", "MSE", "MeanSquaredError"), KerasEntry(_mse, higher_is_better=down)),
        (("root_mean_squared_error", "RootMeanSquaredError"), KerasEntry(_squared_error, "sqrt", down)),
        (("mean_absolute_percentage_error", "mape", "MAPE", "MeanAbsolutePercentageError"),
         KerasEntry(_mape, higher_is_better=down)),
        (("mean_squared_logarithmic_error", "msle", "MSLE", "MeanSquaredLogarithmicError"),
         KerasEntry(_msle, higher_is_better=down)),
        (("cosine_similarity", "CosineSimilarity"), KerasEntry(_cosine_similarity, higher_is_better=up)),
        (("log_cosh", "log_cosh_error", "LogCoshError"), KerasEntry(_log_cosh, higher_is_better=down)),
        (("huber",), KerasEntry(_huber, higher_is_better=down)),
        (("poisson", "Poisson"), KerasEntry(_poisson, higher_is_better=down)),
        (("kl_divergence", "KLDivergence"), KerasEntry(_kl_divergence, higher_is_better=down)),
        (("hinge", "Hinge"), KerasEntry(_hinge, higher_is_better=down)),
        (("squared_hinge", "SquaredHinge"), KerasEntry(_squared_hinge, higher_is_better=down)),
        (("categorical_hinge", "CategoricalHinge"), KerasEntry(_categorical_hinge, higher_is_better=down)),
        (("binary_crossentropy", "bce", "BCE", "BinaryCrossentropy"),
         KerasEntry(_binary_crossentropy, higher_is_better=down)),
        (("categorical_crossentropy", "CategoricalCrossentropy"),
         KerasEntry(_categorical_crossentropy, higher_is_better=down)),
        (("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"),
         KerasEntry(_sparse_categorical_crossentropy, higher_is_better=down)),
        (("binary_focal_crossentropy",), KerasEntry(_binary_focal_crossentropy, higher_is_better=down)),
        (("categorical_focal_crossentropy",), KerasEntry(_categorical_focal_crossentropy, higher_is_better=down)),
        (("pearson_correlation", "PearsonCorrelation"), KerasEntry(_pearson, higher_is_better=up)),
        (("concordance_correlation", "ConcordanceCorrelation"), KerasEntry(_concordance, higher_is_better=up)),
        (("true_positives", "TruePositives"), KerasEntry(_counts("tp"), "sum", up)),
        (("false_positives", "FalsePositives"), KerasEntry(_counts("fp"), "sum", down)),
        (("true_negatives", "TrueNegatives"), KerasEntry(_counts("tn"), "sum", up)),
        (("false_negatives", "FalseNegatives"), KerasEntry(_counts("fn"), "sum", down)),
        (("Precision",), KerasEntry(_precision, "ratio", up)),
        (("Recall",), KerasEntry(_recall, "ratio", up)),
    ]
    return {name: entry for names, entry in groups for name in names}


#: Every Keras metric name computed here (snake case, class names and Keras' short names).
KERAS_MEANS: dict[str, KerasEntry] = _table()

_OBJECT = "pass the object instead, `keras.metrics.{cls}({args})` (fitkit runs Keras' metric objects as they are)"
#: Keras metric names that are not computed from the name alone, and what to pass instead.
KERAS_REFUSED: dict[str, str] = {
    **{n: "Keras' F1Score gives one value per class by default: use fitkit's 'f1' (macro average), or "
          + _OBJECT.format(cls="F1Score", args="average='macro'") for n in ("f1_score", "F1Score")},
    **{n: "Keras' FBetaScore gives one value per class by default: "
          + _OBJECT.format(cls="FBetaScore", args="beta=2.0, average='macro'") for n in ("f_beta_score", "FBetaScore")},
    **{n: "Keras' R2Score keeps per-output sums: pass `torchmetrics.R2Score()`, or "
          + _OBJECT.format(cls="R2Score", args="") for n in ("r2_score", "R2Score")},
    **{n: f"Keras' {cls} needs its arguments: " + _OBJECT.format(cls=cls, args=args) for names, cls, args in [
        (("io_u", "IoU"), "IoU", "num_classes=..., target_class_ids=[...]"),
        (("mean_io_u", "MeanIoU"), "MeanIoU", "num_classes=..."),
        (("one_hot_io_u", "OneHotIoU"), "OneHotIoU", "num_classes=..., target_class_ids=[...]"),
        (("one_hot_mean_io_u", "OneHotMeanIoU"), "OneHotMeanIoU", "num_classes=..."),
        (("binary_io_u", "BinaryIoU"), "BinaryIoU", "target_class_ids=(0, 1), threshold=0.5"),
        (("precision_at_recall", "PrecisionAtRecall"), "PrecisionAtRecall", "recall=..."),
        (("recall_at_precision", "RecallAtPrecision"), "RecallAtPrecision", "precision=..."),
        (("sensitivity_at_specificity", "SensitivityAtSpecificity"), "SensitivityAtSpecificity", "specificity=..."),
        (("specificity_at_sensitivity", "SpecificityAtSensitivity"), "SpecificityAtSensitivity", "sensitivity=..."),
    ] for n in names},
    **{n: f"Keras' {n!r} is a tracker of values you give it, not a metric of predictions: use it in a custom "
          "`train_step` (`self.tracker.update_state(value)`), or pass a function (y_true, y_pred) -> values"
       for n in ("mean", "Mean", "sum", "Sum", "metric", "Metric", "mean_metric_wrapper", "MeanMetricWrapper")},
}


# -- accumulation -----------------------------------------------------------------------------
def samplewise(values: torch.Tensor, weight: torch.Tensor | None,
               reduce: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Keras' `reduce_to_samplewise_values`: one (weighted) value per sample, and the weights
    reduced to one per sample, shapes matched as Keras matches them."""
    values = values.float()
    if weight is not None:
        weight = torch.as_tensor(weight).to(device=values.device, dtype=values.dtype)
        values, weight = same_rank(values, weight)
        if values.dim() > weight.dim():
            values = reduce(values, dim=tuple(range(weight.dim(), values.dim())))
        weight_dims = weight.dim()
        weight = weight.expand_as(values) if weight.shape != values.shape else weight
        values = values * weight
        if weight_dims > 1:
            weight = weight.mean(dim=tuple(range(1, weight_dims)))
    if values.dim() > 1:
        values = reduce(values, dim=tuple(range(1, values.dim())))
    return values, weight


class KerasMean:
    """A Keras metric computed in torch (a `KerasEntry`), accumulated on the device: the sum of the
    per-sample values (weighted by `sample_weight` when given) and of the samples (or weights)."""

    def __init__(self, entry: KerasEntry):
        self.entry = entry
        self.higher_is_better = entry.higher_is_better
        self.total: torch.Tensor | float = 0.0
        self.count: torch.Tensor | float = 0.0

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        mode = self.entry.mode
        values = self.entry.fn(target, preds)
        if mode == "ratio":
            num, den = values
            num, _ = samplewise(num, sample_weight, torch.sum)
            den, _ = samplewise(den, sample_weight, torch.sum)
            total, count = num.sum(), den.sum()
        else:
            values, weight = samplewise(values, sample_weight, torch.sum if mode == "sum" else torch.mean)
            total = values.sum()
            count = weight.sum() if weight is not None else torch.tensor(float(values.shape[0] if values.dim() else 1))
        self.total = total.detach() + _on(self.total, total.device)
        self.count = count.detach().to(total.device) + _on(self.count, total.device)

    def compute(self) -> torch.Tensor:
        total = torch.as_tensor(self.total, dtype=torch.float64)
        count = torch.as_tensor(self.count, dtype=torch.float64).to(total.device)
        if distributed():
            both = torch.stack([total, count])
            torch.distributed.all_reduce(both)
            total, count = both[0], both[1]
        if self.entry.mode == "sum":
            return total
        mean = torch.where(count > 0, total / count.clamp(min=1e-300), torch.zeros_like(total))  # divide_no_nan
        return mean.sqrt() if self.entry.mode == "sqrt" else mean

    def reset(self) -> None:
        self.total, self.count = 0.0, 0.0


def keras_value(value: Any) -> torch.Tensor:
    """A Keras result as a torch tensor of its own: a `keras.Variable` (a `result()` that returns
    the variable itself, as the guides' `CategoricalTruePositives` does) is read and copied, so
    later updates of the variable do not change a value already logged."""
    if hasattr(value, "assign") and hasattr(value, "value"):  # a keras.Variable
        return torch.as_tensor(value.value).detach().clone()
    return torch.as_tensor(value)


def _on(value: torch.Tensor | float, device: torch.device) -> torch.Tensor | float:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def keras_mean(name: str) -> KerasMean:
    """The metric a Keras name computed here stands for (a name of `KERAS_MEANS`)."""
    return KerasMean(KERAS_MEANS[name])


def function_mean(fn: Callable[..., Any]) -> KerasMean:
    """Keras' `MeanMetricWrapper` of a function in Keras' order, `fn(y_true, y_pred)`."""
    return KerasMean(KerasEntry(fn, higher_is_better=None))


# -- Keras' own metric objects ----------------------------------------------------------------------
def is_keras_metric(obj: Any) -> bool:
    """True for an instance of `keras.metrics.Metric` (found without importing Keras)."""
    return not isinstance(obj, type) and any(
        c.__name__ == "Metric" and c.__module__.startswith("keras") for c in type(obj).__mro__)


def check_keras_object(obj: Any) -> None:
    """Refuse Keras' `Mean` and `Sum` trackers in `metrics` (Keras' compile fails on them too)."""
    if type(obj).__name__ in ("Mean", "Sum") and type(obj).__module__.startswith("keras"):
        raise ValueError(f"metric {obj.name!r}: {KERAS_REFUSED[type(obj).__name__]} (Keras' compile refuses it too)")


class KerasObjectMetric:
    """A `keras.metrics.Metric` object run as it is: `update_state(y_true, y_pred, sample_weight)`
    each batch, `result()` at the end, `reset_state()` between epochs; a fresh copy per phase
    (training, validation), so the object given to `compile` keeps its own state."""

    def __init__(self, obj: Any):
        check_keras_object(obj)
        if distributed():
            raise ValueError(f"the Keras metric object {obj.name!r} keeps its state in this process only: under several "
                             "processes, pass a fitkit metric name or a torchmetrics.Metric (they sum across processes)")
        try:
            self.obj = type(obj).from_config(obj.get_config())
        except (TypeError, ValueError, KeyError, NotImplementedError):  # a subclass whose config does not rebuild it
            self.obj = copy.deepcopy(obj)
        self.name = obj.name
        self.higher_is_better = getattr(KERAS_MEANS.get(type(obj).__name__), "higher_is_better", None)

    def update(self, preds: Any, target: Any, sample_weight: Any = None) -> None:
        if torch.is_inference_mode_enabled():
            # variables a metric builds at its first update (F1Score's) are ordinary tensors, reset
            # in place later outside inference mode
            with torch.inference_mode(False), torch.no_grad():
                self.obj.update_state(target, preds, sample_weight=sample_weight)
            return
        self.obj.update_state(target, preds, sample_weight=sample_weight)  # as Keras' compiled metrics call it

    def compute(self) -> torch.Tensor:
        value = keras_value(self.obj.result())
        if value.numel() != 1:
            raise ValueError(f"the Keras metric {self.name!r} gives {value.numel()} values (one per class or output), "
                             "not one: pass its `average=` argument (\"macro\", \"micro\", \"weighted\"), or one metric "
                             "per value")
        return value.reshape(()).float()

    def reset(self) -> None:
        self.obj.reset_state()

    def export(self) -> dict[str, Any]:
        return {"variables": [torch.as_tensor(v.value).detach().cpu().clone() for v in self.obj.variables]}

    def load(self, state: dict[str, Any]) -> None:
        for variable, value in zip(self.obj.variables, state["variables"]):
            variable.assign(value)


@dataclass(frozen=True)
class Weighted:
    """A metric of `compile(weighted_metrics=...)`: it sees the batch's `sample_weight`, as Keras'
    weighted metrics do. `name` is the name it is logged under when another metric already has
    its name (Keras' `weighted_<name>`); None keeps its own."""

    spec: Any
    name: str | None = None
