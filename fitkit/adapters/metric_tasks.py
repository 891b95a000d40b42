"""Named metrics' tasks and torchmetrics objects, and their batches prepared.

A name takes its task (binary, multiclass, one-hot, multilabel, regression, Keras' fixed ones)
and class count from its first batch; the torchmetrics object is built for it, and each batch
prepared so torchmetrics never inspects values (no host sync)::

    kind, classes = keras_task("accuracy", preds, target) or infer_task("accuracy", preds, target)
    metric = construct("accuracy", kind, classes)      # torchmetrics.classification.MulticlassAccuracy
    metric.update(*prepare(kind, "accuracy", preds, target))
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.adapters.metric_specs import KERAS_CLASS_OF


def infer_task(key: str, preds: torch.Tensor, target: torch.Tensor) -> tuple[str, int]:
    """The task (regression, binary, multiclass, onehot, multilabel) and class count of a batch."""
    if key in ("mae", "mse"):
        return "regression", 1
    classes = preds.shape[-1] if preds.dim() >= 2 else 1
    if classes > 1 and target.shape == preds.shape:
        # one-hot rows (Keras' categorical targets) are multiclass; anything else is multilabel
        onehot = bool(((target == 0) | (target == 1)).all() and (target.sum(-1) == 1).all())
        return ("onehot" if onehot else "multilabel"), classes
    return ("multiclass" if classes > 1 else "binary"), classes


def keras_elementwise(name: str, preds: Any, target: Any, saved: dict | None) -> bool:
    """Whether fitkit's `"precision"` / `"recall"` take Keras' meaning: targets of the outputs'
    shape (one-hot or several labels) are thresholded element by element, as Keras' `Precision`
    does; class indices, which Keras' metric does not take, keep fitkit's macro average. A saved
    state tells by having no task."""
    if name.lower() not in KERAS_CLASS_OF:
        return False
    if saved is not None:
        return "_task" not in saved
    return isinstance(preds, torch.Tensor) and isinstance(target, torch.Tensor) and preds.shape == target.shape


def keras_task(name: str, preds: torch.Tensor, target: torch.Tensor) -> tuple[str, int] | None:
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


def construct(key: str, kind: str, classes: int):
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


def prepare(kind: str, name: str, preds: torch.Tensor, target: torch.Tensor):
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


def update_metric(metric: Any, kind: str, key: str, preds: Any, target: Any, weight: Any = None) -> None:
    """One batch into a built metric, as its kind takes it: a loss part its target, a Keras metric
    the sample weights too, a named torchmetrics metric the batch `prepare`d."""
    if kind == "part":
        metric.update(target)
    elif kind == "keras":
        metric.update(preds, target, weight)
    elif kind == "custom":
        metric.update(preds, target)
    else:
        metric.update(*prepare(kind, key, preds, target))

