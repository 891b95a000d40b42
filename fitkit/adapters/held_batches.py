"""The batches named classification metrics hold before they update, and the built metrics
finished sets give back. Their torchmetrics states count (or keep) what they see, so one update
over many batches equals one per batch: `Held` keeps a group's prepared batches on the device and
gives them in blocks (`HELD_BYTES`); `Spares` keeps reset metrics for the sets built later::

    held = Held("multiclass", "accuracy", None)
    held.add(preds, target)          # prepared and kept: the bytes held
    held.give(items)                 # one update of each metric of the group
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.adapters.metric_tasks import prepare

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


SPARES = Spares()


class Held:
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
        """What metrics sharing a `Held` have in common (`prepare` differs only for AUROC)."""
        return kind, key == "auroc", select

    def add(self, preds: torch.Tensor, target: torch.Tensor) -> int:
        """Hold one batch; the bytes held now."""
        preds, target = prepare(self.kind, self.key, preds, target)
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

