"""Overridden steps: what the loop calls when a `Model` subclass overrides `train_step`,
`test_step`, `predict_step` or `compute_loss` (Keras 3 meanings), and the live pieces such a
step uses (`StepTools`: backward, the optimizer, the module, custom events).

The facade hands the engine plain callables (`StepOverrides`), so the engine never imports it.
With nothing overridden, `StepOverrides()` is falsy and the loop keeps its own fast path.

    overrides = StepOverrides(train_step=model.train_step)   # bound methods, or None
    tools = StepTools(stepper, handler_call, optimizer_step)  # set on the Runtime during a call
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fitkit.adapters.keras_metrics import keras_value

#: trackers already warned about (`StepMeans.recognise`)
_UNTOLD: weakref.WeakSet = weakref.WeakSet()

STEP_NAMES = ("train_step", "test_step", "predict_step", "compute_loss")


@dataclass(frozen=True)
class StepOverrides:
    """The steps a subclass overrides, as callables (None: fitkit's own step)."""

    train_step: Callable[[Any], Any] | None = None
    test_step: Callable[[Any], Any] | None = None
    predict_step: Callable[[Any], Any] | None = None
    compute_loss: Callable[..., torch.Tensor] | None = None
    #: The subclass's own `metrics` property, read: Keras' trackers (`keras.metrics.Mean`, ...)
    #: that the loop resets at each epoch and evaluation, as Keras' `reset_metrics` does.
    metrics: Callable[[], Any] | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, name) is not None for name in STEP_NAMES)

    @classmethod
    def of(cls, obj: Any, base: type) -> StepOverrides:
        """The methods of `obj` whose class overrides `base`'s definition of them."""
        owner: type = type(obj)  # annotated: mypy does not count `type[Any]` as Hashable for the cache
        names = _overridden(owner, base)
        listed: Callable[[], Any] | None = None
        if getattr(owner, "metrics", None) is not getattr(base, "metrics", None):
            listed = lambda: obj.metrics  # noqa: E731 (read at each reset, as Keras does)
        elif own := attribute_trackers(obj):  # Keras tracks the metric objects a model holds
            listed = lambda: own  # noqa: E731
        if not names and listed is None:
            return _NOTHING  # every call of a plain Model: nothing to bind
        return cls(**{name: getattr(obj, name) for name in names}, metrics=listed)

    def trackers(self) -> list[Any]:
        """The trackers the subclass's `metrics` property lists (Keras metric objects, or
        torchmetrics' with `reset()`), without the views fitkit keeps itself (`kept_by_loop`)."""
        if self.metrics is None:
            return []
        listed = self.metrics()
        if listed is None or not isinstance(listed, (list, tuple)):
            raise TypeError(f"the `metrics` property must return a list of metric objects (Keras' "
                            f"`[self.loss_tracker, ...]`), got {type(listed).__name__}")
        return [m for m in listed if not getattr(m, "kept_by_loop", False)]

    def reset_trackers(self) -> frozenset[str]:
        """Reset every listed tracker (Keras' `reset_metrics`: at each epoch start and before an
        evaluation) and return their names: what a step returns under these names is a running
        value, logged as the last step gave it (Keras) rather than averaged again."""
        names = set()
        for tracker in self.trackers():
            reset = getattr(tracker, "reset_state", None) or getattr(tracker, "reset", None)
            if reset is None:
                raise TypeError(f"`metrics` lists {tracker!r}, which has no `reset_state()` (Keras) or `reset()` "
                                "(torchmetrics): list metric objects only, such as keras.metrics.Mean(name='loss')")
            reset()
            name = getattr(tracker, "name", None)
            if isinstance(name, str):
                names.add(name)
        return frozenset(names)

    def unnamed_trackers(self) -> list[Any]:
        """The listed trackers without a `name` (torchmetrics objects): their values are told by
        identity, as their `compute()` returns them (`StepMeans.recognise`)."""
        return [t for t in self.trackers() if not isinstance(getattr(t, "name", None), str)]


@functools.lru_cache(maxsize=256)
def _overridden(owner: type, base: type) -> tuple[str, ...]:
    return tuple(name for name in STEP_NAMES
                 if getattr(owner, name, None) is not None and getattr(owner, name) is not getattr(base, name))


_NOTHING = StepOverrides()


def attribute_trackers(obj: Any) -> list[Any]:
    """The Keras metric objects (`update_state`, `result`, `reset_state`) held as attributes of
    `obj`, e.g. `self.loss_tracker = keras.metrics.Mean(name="loss")`: Keras 3 tracks them in
    `model.metrics` and resets them without a `metrics` property."""
    found = []
    for value in vars(obj).values():
        cls: type = type(value)  # annotated: mypy does not count `type[Any]` as Hashable for the cache
        if _tracker_class(cls) and not getattr(value, "kept_by_loop", False):
            found.append(value)
    return found


@functools.lru_cache(maxsize=512)
def _tracker_class(cls: type) -> bool:
    """Whether instances of `cls` are Keras metric objects or torchmetrics' (read once per class:
    every attribute of the model is looked at, at every call)."""
    if issubclass(cls, type):
        return False
    if all(callable(getattr(cls, name, None)) for name in ("update_state", "result", "reset_state")):
        return True
    return any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics") for c in cls.__mro__)


def step_values(result: Any, step: str) -> dict[str, Any]:
    """An overridden step's return value checked: a dict of name -> tensor or number."""
    if result is None:
        return {}
    if not isinstance(result, dict):
        raise TypeError(f"`{step}` must return a dict of values to log (e.g. {{'loss': loss}}), got "
                        f"{type(result).__name__}")
    return result


class DeferredStep:
    """The optimizer step an overridden `train_step` asks for through `model.optimizer`.

    `step()` runs the loop's optimizer step (clipping, `on_pre_optimizer_step`, the step,
    `on_optimizer_step`, the scheduler) at the last micro-batch of a gradient-accumulation
    cycle and does nothing before it; `zero_grad()` does nothing while a cycle's gradients are
    still being accumulated. `last` and `pending` are the cycle's state, set by `StepTools`::

        deferred = DeferredStep(loop_step, stepper.zero_grad)
        deferred.step()        # steps only when `deferred.last`
    """

    __slots__ = ("_clear", "_step", "last", "pending")

    def __init__(self, step: Callable[[], None], clear: Callable[[], None]):
        self._step, self._clear = step, clear
        self.last = True  # the micro-batch under way ends its accumulation cycle
        self.pending = False  # gradients were accumulated since the last step

    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("an overridden `train_step` computes its loss itself: call `self.optimizer.step()` "
                             "without a closure")
        if self.last:
            self._step()
            self.pending = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not self.pending:
            self._clear()


class StepTools:
    """The live pieces of one call for overridden steps: `backward(loss)`, the deferred optimizer
    step (`deferred`, which `model.optimizer` runs), `module` and `call_event(name, **kwargs)`.
    Held by the call's `RunContext` while the call runs."""

    def __init__(self, stepper: Any, call_event: Callable[..., None], optimizer_step: Callable[[], None] | None):
        self.stepper = stepper
        self.module = stepper.forward_module  # the module that syncs gradients under DDP / FSDP
        self.call_event = call_event
        self.cycle = 1
        self.deferred: DeferredStep | None = None
        self.metrics: Any = None  # the phase's compiled `MetricSet` (set by the loop); None: one per call
        self.last_loss: torch.Tensor | None = None  # the step's `compute_loss` value, for `compute_metrics`
        self.reported = False  # `compute_metrics` updated `metrics` in this step
        # The weight `model.metrics`' loss tracker was given in this step (Keras' `Mean`: 1 unless
        # `update_state(loss, sample_weight=w)`), then what the loop weighs the step's loss by
        self.loss_weight: float | None = None
        self.step_loss_weight: float | None = None
        self.updated = False  # ... in some step since the loop last cleared this
        if stepper.optimizer is not None and optimizer_step is not None:
            self.deferred = DeferredStep(optimizer_step, stepper.zero_grad)

    def compiled_metrics(self, specs: list) -> Any:
        """The `MetricSet` `compute_metrics` updates: the loop's for this phase, else one kept
        for this call (`train_on_batch` and its kin)."""
        if self.metrics is None:
            from fitkit.adapters.metrics import MetricSet

            self.metrics = MetricSet(specs)
        return self.metrics

    def values(self, result: Any, step: str) -> dict[str, Any]:
        """An overridden step's values for the loop: the compiled metrics `compute_metrics`
        updated are left out (the loop logs them exactly from `metrics`, not as per-step means)."""
        values = step_values(result, step)
        self.updated = self.updated or self.reported
        if self.reported and self.metrics is not None:
            compiled = set(self.metrics.base_names)
            values = {name: value for name, value in values.items() if name not in compiled}
        self.step_loss_weight, self.loss_weight = self.loss_weight, None
        self.reported, self.last_loss = False, None
        return values

    def backward(self, loss: torch.Tensor) -> None:
        """Fabric's backward (mixed precision, DDP, FSDP, DeepSpeed), scaled for accumulation."""
        self.stepper.backward(loss / self.cycle if self.cycle > 1 else loss)
        if self.deferred is not None:
            self.deferred.pending = True

    @contextlib.contextmanager
    def micro_batch(self, cycle: int, last: bool) -> Iterator[None]:
        """One micro-batch of an accumulation cycle of `cycle`: gradients are synced between
        processes and the optimizer steps only at the `last` one."""
        self.cycle = cycle
        if self.deferred is not None:
            self.deferred.last = last
        with self.stepper.no_sync(cycle, last):
            yield


class StepMeans:
    """Sample-weighted means of the values overridden steps return, kept on the device (no
    host read until `compute`): per epoch, and since the last logging step.

    Values named in `running` come from trackers (`keras.metrics.Mean(name="loss").result()`, or
    the `compute()` of a torchmetrics object in `unnamed`, told by identity): already running
    means, so each replaces the one before (Keras logs the last step's value)."""

    def __init__(self, device: torch.device, running: frozenset[str] = frozenset(), unnamed: list | None = None):
        self.device = device
        self.running: set[str] = set(running)
        self.unnamed: list[Any] = unnamed or []
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, float] = {}
        self.since: dict[str, tuple[torch.Tensor, float]] = {}

    def __bool__(self) -> bool:
        return bool(self.sums)

    def reset(self) -> None:
        self.sums.clear()
        self.counts.clear()
        self.since.clear()

    def track(self, running: frozenset[str], unnamed: list[Any]) -> None:
        """The trackers of the epoch or evaluation starting (just reset): their names, and the
        ones without a name."""
        self.running, self.unnamed = set(running), unnamed

    def recognise(self, values: dict[str, Any]) -> None:
        """Mark as running the values a step returned straight from an unnamed tracker's
        `compute()` (torchmetrics keeps the value it returned: an identity check, no host read)."""
        for tracker in self.unnamed:
            computed = getattr(tracker, "_computed", None)
            if computed is None:
                continue
            names = [name for name, value in values.items() if value is computed]
            self.running.update(names)
            if not names and values and tracker not in _UNTOLD:
                _UNTOLD.add(tracker)
                warnings.warn(f"the step computed the tracker {type(tracker).__name__} but returned none of its "
                              "`compute()` values as they are (a `.item()` or a copy): fitkit cannot tell its value "
                              "and averages it over the epoch like any other; return `tracker.compute()` itself to "
                              "log its last value, as Keras logs a tracker's", UserWarning, stacklevel=2)

    def add(self, values: dict[str, Any], size: float, loss_weight: float | None = None) -> None:
        """Add one step's values, each weighted by `size` (the batch's samples); "loss" by
        `loss_weight` instead when given (Keras' loss tracker updated without a weight: 1)."""
        if self.unnamed:
            self.recognise(values)
        batch_size = size
        for name, value in values.items():
            size = loss_weight if name == "loss" and loss_weight is not None else batch_size
            value = value.detach() if isinstance(value, torch.Tensor) else keras_value(value)
            weighted = value.to(self.device, torch.float64) * size
            if name in self.running:  # weighted by the last size only: the mean is the value itself
                self.sums[name], self.counts[name] = weighted, size
                self.since[name] = (weighted, size)
                continue
            if name in self.sums:
                self.sums[name] = self.sums[name] + weighted
                self.counts[name] += size
            else:
                self.sums[name], self.counts[name] = weighted, size
            total, count = self.since.get(name, (0.0, 0))
            self.since[name] = (weighted + total, count + size)

    def compute(self, fabric: Any = None, prefix: str = "") -> dict[str, float]:
        """The epoch means (summed over processes when `fabric` runs several)."""
        out = {}
        for name, total in self.sums.items():
            count = self.counts[name]
            if fabric is not None and fabric.world_size > 1:
                total = fabric.all_reduce(total, reduce_op="sum")
                count = int(fabric.all_reduce(torch.tensor(count, device=self.device), reduce_op="sum"))
            out[prefix + name] = float(total) / count if count else float("nan")
        return out

    def since_log(self) -> dict[str, float]:
        """This process's means since the last call (a logging step), then start again."""
        out = {name: float(total) / count for name, (total, count) in self.since.items() if count}
        self.since.clear()
        return out
