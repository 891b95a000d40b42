"""`MetricSet`: the metrics of one phase (train or validation), computed as exact dataset values.

Its specs are what `fitkit.adapters.metric_specs.check_metrics` returned: names, `torchmetrics.Metric`
objects, Keras metrics, callables. Named metrics become torchmetrics objects when the first batch is
seen, which tells the task and the class count (`fitkit.adapters.metric_tasks`). Metrics accumulate
on the device; nothing is read back to the host until `compute()` (once per epoch or evaluation).
Named classification metrics' batches are held on the device and given to torchmetrics in blocks
(`fitkit.adapters.held_batches`), which leaves a batch with the work a hand-written loop does for it::

    metrics = MetricSet(check_metrics(["accuracy", "f1"]), prefix="val_")
    for outputs, target in batches:
        metrics.update(outputs, target)
    metrics.compute()   # {"val_accuracy": 0.91, "val_f1": 0.88}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fitkit.adapters import held_batches
from fitkit.adapters.counted_accuracy import CountedAccuracy
from fitkit.adapters.held_batches import BLOCK_KINDS, SPARES, Held
from fitkit.adapters.keras_metrics import (
    KerasMean,
    KerasObjectMetric,
    Weighted,
    distributed,
    function_mean,
    is_keras_metric,
    keras_mean,
)
from fitkit.adapters.losses import keras_order
from fitkit.adapters.metric_outputs import CallableMean, LossPart, select_for, weight_picker, whole
from fitkit.adapters.metric_specs import ALIASES, KERAS_CLASS_OF, is_metric, keras_computed, metric_name, weighted_entry
from fitkit.adapters.metric_tasks import construct, infer_task, keras_elementwise, keras_task, update_metric
from fitkit.adapters.outputs import LossParts, OutputMetric

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
        self._held: list[Held] = []  # the block metrics' batches not given yet, one per group
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
                items.extend((self.prefix + name, LossPart(spec, name[: -len("_loss")]), "part", name, None, None)
                             for name in names)
                continue
            name, select = metric_name(spec), (spec.select if isinstance(spec, OutputMetric) else None)
            base = spec.spec if isinstance(spec, OutputMetric) else spec
            weight = None
            if isinstance(base, Weighted):
                base, weight = base.spec, weight_picker(spec)
            preds: Any  # the batch's output and target (None: rebuilt from a saved state)
            tgt: Any
            preds, tgt = (None, None) if saved is not None else select_for(select, outputs, target)
            metric: Any
            if isinstance(base, str) and (weight is not None or keras_computed(base)):
                metric, kind, key = keras_mean(weighted_entry(base) if weight is not None else base), "keras", name
            elif is_keras_metric(base):
                metric, kind, key = KerasObjectMetric(base), "keras", name
            elif isinstance(base, str) and keras_elementwise(base, preds, tgt, saved.get(self.prefix + name) if saved is not None else None):
                metric, kind, key = keras_mean(KERAS_CLASS_OF[base.lower()]), "keras", name
            elif isinstance(base, str):
                key = ALIASES.get(base.lower(), base.lower())
                if saved is not None:
                    kind, classes = saved[self.prefix + name]["_task"]
                else:
                    kind, classes = keras_task(base.lower(), preds, tgt) or infer_task(key, preds, tgt)
                device = preds.device if preds is not None else self.device
                counted = key == "accuracy" and kind in ("multiclass", "onehot") and not distributed()
                spare = (key, kind, classes, device, counted)
                self._spares[len(items)] = spare
                metric = SPARES.take(spare)
                if metric is None:
                    metric = CountedAccuracy(classes, device) if counted else construct(key, kind, classes).to(device)
                self._tasks[self.prefix + name] = (kind, classes)
                items.append((self.prefix + name, metric, kind, key, select, weight))
                continue
            elif is_metric(base):
                metric = base.clone() if hasattr(base, "clone") else base
                kind, key = "custom", name
            elif keras_order(base):  # Keras' MeanMetricWrapper of a function of (y_true, y_pred)
                metric, kind, key = function_mean(base), "keras", name
            else:
                metric, kind, key = CallableMean(base), "custom", name
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
            if isinstance(metric, (CallableMean, KerasMean)):
                out[name] = {"total": torch.as_tensor(metric.total).cpu(), "count": torch.as_tensor(metric.count).cpu()
                             if isinstance(metric, KerasMean) else metric.count}
            elif isinstance(metric, KerasObjectMetric):
                out[name] = metric.export()
            else:
                # Under several processes, the states of all of them (rank 0 saves and restores).
                synced = distributed() and not getattr(metric, "_is_synced", True)
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
            if isinstance(metric, (CallableMean, KerasMean)):
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
                    plain = whole(outputs, target)
                preds, tgt = plain
            else:
                preds, tgt = select_for(select, outputs, target)
            w = weight(outputs, sample_weight) if weight is not None and sample_weight is not None else None
            update_metric(metric, kind, key, preds, tgt, w)
        for held in self._held:
            if held.select is None:
                if plain is None:
                    plain = whole(outputs, target)
                nbytes += held.add(*plain)
            else:
                nbytes += held.add(*select_for(held.select, outputs, target))
        if nbytes > held_batches.HELD_BYTES:
            self._give_held()

    def update_one(self, index: int, outputs: Any, target: Any, sample_weight: Any = None) -> None:
        """Update only the `index`-th metric (`Model.metrics[i].update_state` in a custom step)."""
        if self._items is None:
            self._build(outputs, target)
        assert self._items is not None  # set by `_build`
        self._give_held()
        _, metric, kind, key, select, weight = self._items[index]
        preds, tgt = select_for(select, outputs, target) if kind != "part" else (None, target)
        w = weight(outputs, sample_weight) if weight is not None and sample_weight is not None else None
        update_metric(metric, kind, key, preds, tgt, w)

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
            SPARES.give(spare, self._items[index][1])
        self._items, self._held, self._each, self._spares, self._tasks = None, [], [], {}, {}

    def reset(self) -> None:
        self._pending = None
        for held in self._held:
            held.clear()
        for _, metric, *_ in self._items or ():
            metric.reset()


def _grouped(items: list[_Item]) -> tuple[list[Held], list[int]]:
    """The block metrics of `items` (unweighted, of a kind whose state counts) grouped by what
    they hold, and the indices of the others, updated at every batch."""
    groups: dict[tuple, Held] = {}
    each: list[int] = []
    for index, (_, _, kind, key, select, weight) in enumerate(items):
        if kind in BLOCK_KINDS and weight is None:
            held = groups.setdefault(Held.group(kind, key, select), Held(kind, key, select))
            held.indices.append(index)
        else:
            each.append(index)
    return list(groups.values()), each

