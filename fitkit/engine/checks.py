"""First-batch checks: data that does not fit the module, the loss or the metrics fails before
the first training step and before anything is written, with an error that names the argument
and the likely fix (docs/common-errors.md lists them). Only the first batch of each source is
looked at, once per call; nothing is added to the steps.

    check_data(stepper, module, train, metrics=specs, training=True)   # fit, before the loop
    check_data(stepper, module, val, metrics=specs)                      # its validation data
    check_data(stepper, module, source, with_loss=False)                 # predict

What is checked, in this order:

1. the data yields a batch, with targets where the loss needs them (training, validation);
2. the features' dtype: integer features for a module whose first parameter is floating are a
   TypeError, unless the module's first layer with parameters is an Embedding (float64 features
   were already cast to float32 when the data was adapted, as NumPy's are);
3. NaN or inf in the first batch's features or targets: one `UserWarning` naming the argument;
4. a probe, on the direct path only (`Stepper.direct`: one device, full precision; other
   strategies skip it, since a forward outside the step is not safe under all of them, e.g.
   FSDP): the module's forward on the first batch in eval mode without gradients, the named
   losses' rules (class labels: integer indices of shape (N,) in [0, C), or probabilities of the
   outputs' shape; binary targets: the outputs' shape, in [0, 1]; regression: the outputs'
   shape), the loss itself (it must return a scalar tensor) and every metric callable (a scalar
   tensor or a number). What the module, the loss or a metric raises is re-raised as a
   ValueError naming the argument, with the shapes, dtypes and likely fix, chained to it.

The probe saves and restores torch's random number generator (CPU, and the CUDA device's: a
forward that draws noise even in eval mode) and every submodule's train/eval flag, so a run draws
exactly what it would draw without it and a resumed run stays bit-exact. Getting the first batch
is `DataSource.first_batch`: the first samples of in-memory data, sliced (no permutation); a fresh
iterator for a loader, every generator it may draw from (global and its own) put back after (a
DataLoader with worker processes starts them once more for it, unless `persistent_workers`);
when nothing draws before the pass and the read drew nothing, that batch opens the pass
(`LoaderSource.first_batch`), so an evaluation reads each batch once. The
values the checks compare (label range, NaN) come back to the host in one transfer. Modules
compiled with `torch.compile` or holding lazy parameters are not probed (the probe would compile
or initialise them).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import torch

from fitkit.adapters.keras_metrics import Weighted, is_keras_metric
from fitkit.adapters.losses import LOSS_KINDS, Loss, keras_order, sparse_targets
from fitkit.adapters.metric_specs import metric_name
from fitkit.adapters.outputs import (
    LossParts,
    OutputLosses,
    OutputMetric,
    is_structure,
    output_names,
    pick,
    single_output,
)
from fitkit.common.options import error_line
from fitkit.common.tensors import tensors_of
from fitkit.engine.data.batch import Batch
from fitkit.engine.data.sources import DataSource, TensorSource
from fitkit.engine.step import LossFn, Stepper, scalar_loss

IGNORE_INDEX = -100  # a class label that F.cross_entropy and F.nll_loss skip
_INDEX_DTYPES = (torch.int64, torch.uint8)  # the class index dtypes F.cross_entropy takes
_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


class CheckMemo:
    """The in-memory sources already checked against a module, loss and metrics, so that calling
    `fit` again on the same tensors (a loop of short fits, a search) checks nothing again. A
    source is known by its tensors' storage, shape, dtype and version counter (an in-place
    change is a new version); the tensors are kept referenced, so their memory is not reused.

    What depends on the data alone (the first batch and the values read from it, by the kind of
    loss) is kept apart, in `firsts`, which the memos of a search's trials share (`sharing`):
    each trial's new module is checked, its data's values are not read again."""

    SIZE = 8

    def __init__(self, firsts: dict[tuple, tuple[Batch, dict[str, float], list]] | None = None,
                 passed: dict[tuple, list] | None = None) -> None:
        self._seen: dict[tuple, list] = {}
        self.firsts = firsts if firsts is not None else {}
        # The first steps whose output checks passed: by data, loss, metrics and the outputs'
        # structure, shapes (less the batch) and dtypes, which is all those checks look at.
        self.passed = passed if passed is not None else {}

    def sharing(self) -> CheckMemo:
        """A new memo (nothing checked against a module) sharing this one's data values and the
        first steps that passed: a search's next trial, whose module gives outputs of the same
        shapes on the same data, runs its first step with no check but the loss value's."""
        return CheckMemo(self.firsts, self.passed)

    def keep_passed(self, key: tuple, leaves: list) -> None:
        # the data's tensors are kept referenced, so their addresses in the key stay theirs
        _bounded_put(self.passed, key, leaves, 4 * self.SIZE)

    def first(self, source: DataSource, loss: Any,
              data: tuple | None = None) -> tuple[tuple | None, tuple[Batch, dict[str, float]] | None]:
        """The key of `source`'s first batch read for `loss` (None: not in-memory data), and the
        (batch, values) kept for it (None: not read yet). `data`: `self.data(source)` if read."""
        key = self.key(source, LOSS_KINDS.get((loss if isinstance(loss, str) else _named(loss)) or ""), data=data)
        if key is None:
            return None, None
        kept = self.firsts.get(key[0])
        return key, (kept[0], kept[1]) if kept is not None else None

    def keep_first(self, key: tuple | None, batch: Batch, stats: dict[str, float]) -> None:
        if key is not None:
            _bounded_put(self.firsts, key[0], (batch, stats, key[1]), self.SIZE)

    def key(self, source: DataSource, *parts: Any, data: tuple | None = None) -> tuple | None:
        data = data if data is not None else self.data(source)
        if data is None:
            return None
        return (*parts, *data[0]), data[1]

    @staticmethod
    def data(source: DataSource) -> tuple | None:
        """What identifies in-memory data (None for any other source): its place and its tensors'
        storage, shape, dtype and version, with the tensors themselves (kept referenced)."""
        if not isinstance(source, TensorSource):
            return None
        leaves = tensors_of((source.x, source.y, source.sample_weight, source.class_weight))
        place = (source.name, source.batch_size, source.offset, source.rank, source.world_size)
        return (place, _identity(leaves)), leaves

    def seen(self, key: tuple | None) -> bool:
        return key is not None and key[0] in self._seen

    def add(self, key: tuple | None) -> None:
        if key is not None:
            _bounded_put(self._seen, key[0], key[1], self.SIZE)


def _bounded_put(table: dict, key: Any, value: Any, size: int) -> None:
    """`table[key] = value`, the oldest entry dropped first when `table` holds `size` already (its
    keys listed first: a search's trials may run in threads)."""
    for oldest in list(table)[:1] if len(table) >= size else ():
        table.pop(oldest, None)
    table[key] = value


def _identity(tensors: list[torch.Tensor]) -> tuple:
    """What tells tensors apart without reading them: storage, shape, strides, dtype, device and
    version counter (an in-place change is a new version)."""
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t._version) for t in tensors)


def check_data(stepper: Stepper, module: torch.nn.Module, source: DataSource | None, *, metrics: Any = (),
               training: bool = False, with_loss: bool = True, memo: CheckMemo | None = None) -> Batch | None:
    """Check the first batch of `source` (nothing for None) against `module` (the user's, not
    Fabric's wrapper), the stepper's loss (unless `with_loss` is False: predict) and the
    `metrics` specs; raise ValueError / TypeError naming `source.name` and the fix. With a
    `memo`, in-memory data already checked against the same module, loss and metrics is not
    checked again. Returns the batch it checked (None when it checked none)."""
    if source is None:
        return None
    data = memo.data(source) if memo is not None else None  # (read once for both keys)
    key = memo.key(source, id(module), id(stepper.loss), tuple(map(id, metrics)), training, with_loss,
                   stepper.direct, data=data) if memo is not None else None
    if memo is not None and memo.seen(key):  # (no key: not seen)
        return None
    batch = _check(stepper, module, source, metrics=metrics, training=training, with_loss=with_loss, memo=memo,
                   data=data)
    if memo is not None:
        memo.add(key)
    return batch


def _check(stepper: Stepper, module: torch.nn.Module, source: DataSource, *, metrics: Any, training: bool,
           with_loss: bool, memo: CheckMemo | None = None, data: tuple | None = None) -> Batch | None:
    first_key, kept = memo.first(source, stepper.loss if with_loss else None, data) if memo is not None else (None, None)
    batch = source.first_batch() if kept is None else kept[0]
    names = _Names(source.name, isinstance(source, TensorSource))
    if batch is None:
        if stepper.fabric.world_size == 1:  # a rank's shard may be empty while another's is not
            raise ValueError(f"`{source.name}` is empty: it yields no batch; pass at least one sample")
        return None
    loss = stepper.loss if with_loss else None
    if isinstance(loss, Loss) and is_structure(batch.target):
        loss.structured = True  # one loss on several outputs: `<output>_loss` is logged from the first step
    if with_loss:
        _check_targets_given(batch, loss, names, training)
    _check_features(batch, module, names)
    stats = _read_stats(batch, loss) if kept is None else kept[1]
    if kept is None and memo is not None:
        memo.keep_first(first_key, batch, stats)
    _warn_non_finite(stats, names)
    if stepper.fabric.world_size == 1:  # one rank raising alone would leave the others waiting
        pending = _Pending(module, batch, names, stats, metrics, with_loss)
        if memo is not None and first_key is not None:
            pending.memo = memo
            pending.key = (first_key[0], training, with_loss, id(stepper.loss), tuple(map(id, metrics)), stepper.direct)
            pending.leaves = first_key[1]
        FirstStep.of(stepper).arm(pending, training)
    return batch


def keeps_float64(module: torch.nn.Module) -> bool:
    """True when `module` computes in float64: its float64 input is then not cast to float32."""
    param = next(module.parameters(), None)
    return param is not None and param.dtype == torch.float64


def first_layer(module: torch.nn.Module) -> torch.nn.Module | None:
    """The first submodule (in registration order) holding parameters of its own."""
    for sub in module.modules():
        if next(sub.parameters(recurse=False), None) is not None:
            return sub
    return None


class _Names:
    """How messages name the features and targets of a source: `x` / `y` for in-memory training
    data, "the inputs of `validation_data`" and so on otherwise."""

    def __init__(self, name: str, in_memory: bool):
        self.name = name
        self.x = f"`{name}`" if name == "x" else f"the inputs of `{name}`"
        self.y = "`y`" if name == "x" and in_memory else f"the targets of `{name}`"
        self.s = "s" if name == "x" else ""  # `x` holds, the inputs of `validation_data` hold
        self.ys = "s" if self.y == "`y`" else ""

    def for_output(self, output: str) -> _Names:
        """The names for one output's targets: "the targets of output 'cls' in `y`"."""
        names = _Names(self.name, False)
        names.x, names.s = self.x, self.s
        names.y, names.ys = f"the targets of output {output!r} in {self.y}", ""
        return names


# -- without the module's forward --------------------------------------------------------------
def _check_targets_given(batch: Batch, loss: LossFn | None, names: _Names, training: bool) -> None:
    if batch.target is not None or loss is None:
        return
    if training:
        raise ValueError("training needs targets: pass `y`, or batches of (x, y), or a module that returns its loss")
    if names.name != "x":  # validation data
        raise ValueError(
            f"`{names.name}` has no targets, so no validation loss can be computed: pass "
            "`validation_data=(x_val, y_val)` (or (x_val, y_val, sample_weight)), or a Dataset / DataLoader whose "
            "batches are (x, y)"
        )


def _check_features(batch: Batch, module: torch.nn.Module, names: _Names) -> None:
    """Integer features for a module that takes floats (one input; an Embedding first is fine)."""
    inputs = batch.inputs
    if not (isinstance(inputs, tuple) and len(inputs) == 1 and isinstance(inputs[0], torch.Tensor)):
        return
    x = inputs[0]
    if x.is_floating_point() or x.is_complex():
        return
    param, layer = next(module.parameters(), None), first_layer(module)
    if param is None or not param.is_floating_point() or isinstance(layer, _EMBEDDINGS):
        return
    raise TypeError(
        f"{names.x} hold{names.s} integer values ({x.dtype}, shape {_shape(x)}) but the module's first layer, "
        f"{_layer(layer)}, takes floating-point inputs ({param.dtype}): pass float features, e.g. `x.float()` "
        "(NumPy: `x.astype('float32')`); integer inputs suit a module whose first layer is an Embedding"
    )


def _read_stats(batch: Batch, loss: Any) -> dict[str, float]:
    """What the value checks compare, read back to the host in one transfer: whether features and
    targets are finite, and the targets' range when the named loss has rules for it."""
    parts: dict[str, torch.Tensor] = {}
    floats = [t for t in tensors_of(batch.inputs) if t.is_floating_point()]
    if floats:
        finite = [torch.isfinite(t).all() for t in floats]
        parts["x_finite"] = finite[0] if len(finite) == 1 else torch.stack(finite).all()
    y, named = batch.target, loss if isinstance(loss, str) else _named(loss)
    kind = LOSS_KINDS.get(named or "")
    if isinstance(y, torch.Tensor) and y.numel() and not y.is_complex():
        if y.is_floating_point():
            parts["y_finite"] = torch.isfinite(y).all()
        if y.dtype != torch.bool and kind in ("class", "binary"):
            # masking the ignored label with 0 keeps the maximum (unless all are ignored: then 0 fits)
            kept = y.masked_fill(y == IGNORE_INDEX, 0) if kind == "class" and not y.is_floating_point() else y
            parts["y_min"], parts["y_max"] = torch.aminmax(kept)
    if not parts:
        return {}
    device = next(iter(parts.values())).device
    values = torch.stack([v.to(device) for v in parts.values()]).tolist()  # one dtype by promotion
    return dict(zip(parts, values))


def _warn_non_finite(stats: dict[str, float], names: _Names) -> None:
    for key, who, s in (("x_finite", names.x, names.s), ("y_finite", names.y, names.ys)):
        if stats.get(key, 1.0) == 0.0:
            warnings.warn(
                f"{who} hold{s} NaN or infinite values in its first batch: the loss, then the weights, will turn NaN; "
                "clean them (e.g. `torch.nan_to_num`) or drop those samples",
                UserWarning, stacklevel=5,
            )


def _probe_safe(module: torch.nn.Module) -> bool:
    """False for a module the probe would change: compiled (a new graph) or lazy (initialised)."""
    if hasattr(module, "_orig_mod"):  # torch.compile's OptimizedModule
        return False
    return not any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in module.modules())


# -- the first real step: forward, loss and metrics --------------------------------------------
class _Pending:
    """What `check_data` read from a source without the module, for the checks of its first step."""

    def __init__(self, module: torch.nn.Module, batch: Batch, names: _Names, stats: dict[str, float], metrics: Any,
                 with_loss: bool):
        self.module, self.batch, self.names, self.stats = module, batch, names, stats
        self.metrics, self.with_loss = metrics, with_loss
        self.memo: CheckMemo | None = None  # with `key` (this check but the outputs) and the data's `leaves`
        self.key: tuple | None = None
        self.leaves: list = []
        self.step_batch: Batch | None = None  # the batch the first step runs on, and the loss it reads values for
        self.step_loss: Any = None
        self._outputs: Any = None  # the outputs `_key_with_outputs` was made for
        self._key_with_outputs: tuple = ()

    def passed_before(self, outputs: Any) -> bool:
        """Whether a first step on the same data, loss and metrics, with outputs of the same
        structure, shapes and dtypes, passed these checks (a search's earlier trial)."""
        return self.memo is not None and self.key is not None and self._full_key(outputs) in self.memo.passed

    def remember(self, outputs: Any) -> None:
        if self.memo is not None and self.key is not None:
            self.memo.keep_passed(self._full_key(outputs), self.leaves)

    def _full_key(self, outputs: Any) -> tuple:
        if self._outputs is not outputs:  # (asked by the loss, then by the step, of the same outputs)
            self._outputs, self._key_with_outputs = outputs, (self.key, _signature(outputs))
        return self._key_with_outputs

    def step_stats(self) -> dict[str, float]:
        """The values read from the step's batch (the data's first batch read before, unless
        the step's is another one: shuffled)."""
        batch = self.step_batch
        if batch is not None and self.stats and not _same_data(batch, self.batch):
            stats = _read_stats(batch, self.step_loss)
            if all(self.stats.get(k, 1.0) for k in ("x_finite", "y_finite")):  # not warned about yet
                _warn_non_finite(stats, self.names)
            self.batch, self.stats = batch, stats
        return self.stats


def _signature(value: Any) -> Any:
    """The structure, shapes less the first dimension, and dtypes of outputs."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape[1:]), value.dtype, value.device.type
    if isinstance(value, dict):
        return type(value).__name__, tuple((key, _signature(v)) for key, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_signature(v) for v in value)
    return type(value).__name__


class FirstStep:
    """The checks that need the module's outputs, run on the real first forward of a phase (the
    first training step, the first evaluation or prediction batch): the module is called no
    extra time. Its exception, the loss rules, the loss itself and the metric callables are
    checked there, before the backward and the optimizer step, and re-raised with the context.
    The stepper's `forward` is wrapped until every armed check has run."""

    def __init__(self, stepper: Stepper):
        self.stepper, self.original = stepper, stepper.forward
        self.train: _Pending | None = None
        self.infer: _Pending | None = None

    @classmethod
    def of(cls, stepper: Stepper) -> FirstStep:
        found = stepper.__dict__.get("_first_step")
        if found is None:
            found = stepper.__dict__["_first_step"] = cls(stepper)
            stepper.forward = found.forward  # type: ignore[method-assign]
        return found

    def arm(self, pending: _Pending, training: bool) -> None:
        if training:
            self.train = pending
        else:
            self.infer = pending

    def forward(self, batch: Batch, with_loss: bool = True) -> tuple[Any, Any]:
        training = torch.is_grad_enabled()
        pending = self.train if training else self.infer
        if pending is None:
            return self.original(batch, with_loss)
        if training:
            self.train = None
        else:
            self.infer = None
        if self.train is None and self.infer is None:  # nothing left to check: the plain forward again
            # (the class's method: an instance attribute holding the stepper's own bound method
            # would keep the stepper, its module and optimizer, in a reference cycle)
            del self.stepper.__dict__["forward"], self.stepper.__dict__["_first_step"]
        loss, out = self._checked(pending, batch, with_loss)
        if training and self.infer is not None and not self.infer.passed_before(out):  # validation data, before any
            _check_validation(self.stepper, self.infer, out, batch)  # optimizer step (unless a trial checked it)
        return loss, out

    def _checked(self, pending: _Pending, batch: Batch, with_loss: bool) -> tuple[Any, Any]:
        stepper = self.stepper
        pending.step_batch, pending.step_loss = batch, stepper.loss if with_loss else None
        module, loss_fn = stepper.forward_module, stepper.loss
        own_loss = with_loss and pending.with_loss and loss_fn is None
        stepper.forward_module = _Recorder(module, pending, stepper, own_loss and batch.target is not None)
        if loss_fn is not None and pending.with_loss:
            stepper.loss = _CheckedLoss(loss_fn, pending)
        try:
            loss, out = self.original(batch, with_loss)
        finally:
            stepper.forward_module, stepper.loss = module, loss_fn
        if own_loss and loss is not None:
            _check_own_loss(loss, pending.names)
        if pending.passed_before(out):
            return loss, out
        pending.step_stats()  # (the loss read them already when it has rules)
        if with_loss and pending.with_loss and pending.metrics and batch.target is not None:
            _check_metrics(pending.metrics, out, batch.target, pending.names)
        pending.remember(out)
        return loss, out


class _Recorder:
    """The module, called as the step calls it; what it raises is re-raised with the context."""

    def __init__(self, module: Any, pending: _Pending, stepper: Stepper, own_loss: bool):
        self.module, self.pending, self.stepper, self.own_loss = module, pending, stepper, own_loss

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.module(*args, **kwargs)
        except Exception as err:
            raise _module_error(self.pending, self.own_loss, err) from err

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def _module_error(pending: _Pending, own_loss: bool, err: Exception) -> ValueError:
    names, batch = pending.names, pending.batch
    try:
        hint = _module_hint(pending.module, batch, names, own_loss)
    except Exception:  # noqa: BLE001 - a hint must never hide the module's own error
        hint = f"give {names.x} the shape and dtype the module's forward expects"
    return ValueError(f"the module raised on the first batch of `{names.name}`: inputs {_describe(batch.inputs)}; "
                      f"likely fix: {hint} ({error_line(err)})")


def _check_own_loss(loss: Any, names: _Names) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = f"a tensor of shape {_shape(loss)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"`loss=None` means the module returns its loss, but on the first batch of `{names.name}` it returned "
            f"{got}, not a scalar loss: pass `loss=` to compile (e.g. loss='cross_entropy'), or return the loss "
            "(a scalar tensor, `out['loss']` or `out[0]`) from the module"
        )


class _CheckedLoss:
    """The compiled loss on the first batch: the named losses' target rules first (nothing
    reaches the loss that would fail on the device), then the loss, whose exception, non-tensor
    or non-scalar value is re-raised with the context."""

    def __init__(self, loss: Any, pending: _Pending):
        self.loss, self.pending = loss, pending
        self.name, self.spec = getattr(loss, "name", "loss"), getattr(loss, "spec", None)

    def __call__(self, outputs: Any, targets: Any, sample_weight: Any = None) -> torch.Tensor:
        pending = self.pending
        if not pending.passed_before(outputs):
            for named, out, target, names in _loss_pairs(self.loss, outputs, targets, pending.names):
                stats = pending.step_stats() if names is pending.names else _read_stats(Batch((), target, None, 0),
                                                                                        named)
                _check_rules(named, out, target, names, stats)
        value = _call_loss(self.loss, outputs, targets, sample_weight, pending)
        _check_value(self.loss, value, pending)
        return value
def _module_hint(module: torch.nn.Module, batch: Batch, names: _Names, own_loss: bool) -> str:
    """The likely fix for an exception from the module's forward on `batch`."""
    if own_loss and batch.target is not None:
        return ("with `loss=None` the module is called as module(x, y) (module(**inputs, labels=y) for dict inputs) "
                "and must return its loss: pass `loss=` to compile (e.g. loss='cross_entropy') if it does not")
    layer, x = first_layer(module), _single_input(batch)
    param = next(module.parameters(), None)
    if x is None or layer is None:
        return f"make {names.x} match the arguments of the module's forward (their number or names, shapes, dtypes)"
    if isinstance(layer, torch.nn.Linear) and x.dim() and x.shape[-1] != layer.in_features:
        return (f"the module's first layer, {_layer(layer)}, takes {layer.in_features} features in the last "
                f"dimension, not the {x.shape[-1]} of {names.x}: pass data with {layer.in_features} features, or build "
                f"the module with in_features={x.shape[-1]}")
    conv = isinstance(layer, torch.nn.modules.conv._ConvNd)
    if conv and x.dim() >= 2 and x.shape[1] != layer.in_channels:
        return (f"the module's first layer, {_layer(layer)}, takes {layer.in_channels} channels in dimension 1, "
                f"not the {x.shape[1]} of {names.x} (shape {_shape(x)}): pass channels-first data (N, C, ...) with "
                f"{layer.in_channels} channels")
    if isinstance(layer, _EMBEDDINGS) and not x.is_floating_point() and x.device.type == "cpu" and x.numel():
        low, high = int(x.min()), int(x.max())
        if low < 0 or high >= layer.num_embeddings:
            return (f"the module's first layer, {_layer(layer)}, takes indices in [0, {layer.num_embeddings}) but "
                    f"{names.x} hold{names.s} indices from {low} to {high}: build the Embedding with "
                    f"num_embeddings={high + 1}, or map the indices into range")
    if param is not None and x.dtype != param.dtype and (x.is_floating_point() or param.is_floating_point()):
        return f"cast {names.x} to the module's dtype, {param.dtype} (e.g. `x.to({param.dtype})`)"
    return f"give {names.x} the shape and dtype the module's forward expects"


def _loss_pairs(loss: Any, outputs: Any, targets: Any, names: _Names) -> list[tuple[str | None, Any, Any, _Names]]:
    """(named loss, output, target, names) for each output a loss applies to, for the rules."""
    if isinstance(loss, OutputLosses) or (is_structure(targets) and is_structure(outputs)):
        plan = loss.losses_for(outputs) if isinstance(loss, OutputLosses) else [
            (i, n, loss, 1.0) for i, n in enumerate(output_names(outputs))]
        all_names = output_names(outputs)
        pairs = []
        for index, name, one, _ in plan:
            target = pick(targets, name if isinstance(targets, dict) else index, all_names) if is_structure(
                targets) else targets
            pairs.append((_named(one), pick(outputs, index), target, names.for_output(name)))
        return pairs
    return [(_named(loss), single_output(outputs, targets), targets, names)]


def _check_rules(named: str | None, outputs: Any, target: Any, names: _Names, stats: dict[str, float]) -> None:
    kind = LOSS_KINDS.get(named or "")
    if not (kind and named and isinstance(outputs, torch.Tensor) and isinstance(target, torch.Tensor)):
        return  # (a kind is a named loss's)
    if kind == "class":
        _check_class_targets(named, outputs, target, names, stats)
        return
    _check_same_shape(named, outputs, target, names)
    if kind == "binary":
        _check_binary_range(named, stats, names)


def _call_loss(loss: Any, outputs: Any, targets: Any, sample_weight: Any, pending: _Pending) -> Any:
    names = pending.names
    try:
        return loss(outputs, targets, sample_weight)
    except Exception as err:
        if isinstance(err, ValueError) and "sample_weight" in str(err):
            raise  # a loss that cannot weight samples says so itself
        order = ("called in Keras' order, loss(y_true, y_pred)" if getattr(loss, "keras_order", False) else
                 "called as loss(outputs, targets); name its first two parameters y_true, y_pred for Keras' order")
        raise ValueError(
            f"`loss`={loss.name!r} raised on the first batch of `{names.name}`: outputs {_describe(outputs)}, "
            f"{names.y} {_describe(targets)}; it is {order}; likely fix: make the loss take these shapes and dtypes, "
            f"or pass targets in the form it expects ({error_line(err)})"
        ) from err


def _check_value(loss: Any, value: Any, pending: _Pending) -> None:
    names, stats = pending.names, pending.stats
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"`loss`={loss.name!r} returned {type(value).__name__} on the first batch of `{names.name}`, not a tensor: "
            "return a scalar torch tensor computed from the outputs (a Python number cannot be backpropagated)"
        )
    try:
        scalar_loss(value)
    except ValueError as err:
        raise ValueError(f"`loss`={loss.name!r} on the first batch of `{names.name}`: {err}") from None
    inputs_finite = stats.get("x_finite", True) and stats.get("y_finite", True)
    # one read of the scalar (the same host sync as `bool(torch.isfinite(...))`, without its three kernels)
    if inputs_finite and not math.isfinite(value.detach().item()):
        warnings.warn(
            f"`loss`={loss.name!r} is {float(value.detach())} on the first batch of `{names.name}`, whose values are finite: "
            "training would only produce NaN; likely fix: check what the loss takes (logits or probabilities, "
            "target range) and the module's outputs (a log of 0, a division by 0)", UserWarning, stacklevel=6)


def _check_validation(stepper: Stepper, pending: _Pending, train_out: Any, train: Batch) -> None:
    """The validation data's first batch, during the first training step (before its optimizer
    step): its targets against the loss rules with the training outputs' shape (no forward);
    the module runs on it (in eval mode, without gradients, random state kept) only when its
    inputs differ in shape or dtype from the training batch's, which the step just ran."""
    batch, loss = pending.batch, stepper.loss
    if not _same_inputs(batch.inputs, train.inputs) and _probe_safe(pending.module):
        _probe_validation(stepper, pending)
        return
    if loss is None or batch.target is None or not pending.with_loss:
        return
    for named, out, target, names in _loss_pairs(loss, train_out, batch.target, pending.names):
        if isinstance(out, torch.Tensor) and isinstance(target, torch.Tensor) and out.dim() and target.dim():
            like = out.detach()[:1].expand(target.shape[0], *out.shape[1:])  # the outputs' shape for this batch
            stats = pending.stats if names is pending.names else _read_stats(Batch((), target, None, 0), named)
            _check_rules(named, like, target, names, stats)


def _same_data(a: Batch, b: Batch) -> bool:
    """Whether two batches hold the same tensors (storage, offset, shape, strides, dtype,
    version): the same slice of in-memory data cut twice, whose values need no second read."""
    if a is b:
        return True
    if (a.target is None) != (b.target is None) or (a.sample_weight is None) != (b.sample_weight is None):
        return False
    return _identity(tensors_of((a.inputs, a.target, a.sample_weight))) == _identity(
        tensors_of((b.inputs, b.target, b.sample_weight)))


def _same_inputs(a: Any, b: Any) -> bool:
    """Whether two batches' inputs have the same structure, dtypes and shapes but the first."""
    if type(a) is not type(b) or (isinstance(a, dict) and list(a) != list(b)):
        return False
    ta, tb = tensors_of(a), tensors_of(b)
    return len(ta) == len(tb) and all(x.dtype == y.dtype and x.shape[1:] == y.shape[1:] for x, y in zip(ta, tb))


def _probe_validation(stepper: Stepper, pending: _Pending) -> None:
    """The module on the validation data's first batch, as evaluation runs it (eval mode, no
    gradients), with torch's random state and every submodule's mode put back after; checked
    as its first evaluation step would be."""
    module = stepper.forward_module
    saved = _torch_rng(module)
    modes = [(m, m.training) for m in module.modules()]
    checker = FirstStep(stepper)
    try:
        for m, _ in modes:
            m.__dict__["training"] = False
        with torch.no_grad():
            checker._checked(pending, pending.batch, True)
    finally:
        for m, mode in modes:
            m.__dict__["training"] = mode
        _set_torch_rng(saved)


def _torch_rng(module: torch.nn.Module) -> tuple:
    """torch's CPU generator state, and the CUDA device's when the module is on one."""
    param = next(module.parameters(), None)
    device = param.device if param is not None and param.device.type == "cuda" else None
    return torch.get_rng_state(), device, torch.cuda.get_rng_state(device) if device is not None else None


def _set_torch_rng(saved: tuple) -> None:
    cpu, device, cuda = saved
    torch.set_rng_state(cpu)
    if device is not None:
        torch.cuda.set_rng_state(cuda, device)


def _check_class_targets(named: str, outputs: torch.Tensor, target: torch.Tensor, names: _Names,
                         stats: dict[str, float]) -> None:
    """Class indices of shape (N, d1...) in [0, C), or class probabilities of the outputs' shape."""
    loss = f"`loss`={named!r}"
    if outputs.dim() < 2:
        raise ValueError(
            f"{loss} needs outputs of shape (N, C), one score per class, but the module returned shape "
            f"{_shape(outputs)}: make its last layer output C class scores (or use loss='binary_crossentropy' for "
            "one logit per sample)"
        )
    classes, wanted = outputs.shape[1], (outputs.shape[0], *outputs.shape[2:])
    if named == "sparse_categorical_crossentropy":  # Keras' name takes (N, 1) indices too: the loss squeezes them
        target = sparse_targets(outputs, target)
    if target.is_floating_point():
        if target.shape == outputs.shape:  # class probabilities (one-hot rows)
            return
        raise ValueError(
            f"{names.y} hold{names.ys} floats of shape {_shape(target)} but {loss} needs integer class indices of shape "
            f"{tuple(wanted)} or class probabilities of the outputs' shape {_shape(outputs)}; likely fix: pass "
            "`y.long()` (NumPy: `y.astype('int64')`)"
        )
    if tuple(target.shape) != tuple(wanted):
        column = target.dim() == outputs.dim() and target.shape[-1] == 1 and target.shape[:-1] == wanted
        fix = f"reshape y to {tuple(wanted)} with `y.reshape(-1)`" if column else f"pass labels of shape {tuple(wanted)}"
        raise ValueError(
            f"{names.y} ha{'s' if names.ys else 've'} shape {_shape(target)} but {loss} needs one class index per sample, shape "
            f"{tuple(wanted)}, for outputs of shape {_shape(outputs)}; likely fix: {fix}"
        )
    if target.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{names.y} hold{names.ys} {target.dtype} class labels but {loss} needs torch.int64 class indices: "
                        "pass `y.long()` (NumPy: `y.astype('int64')`)")
    low, high = stats.get("y_min"), stats.get("y_max")
    if low is not None and low < 0:
        raise ValueError(
            f"{names.y} hold{names.ys} negative class labels (down to {int(low)}) but {loss} needs labels in [0, {classes}) "
            f"({IGNORE_INDEX} marks a sample to ignore); likely fix: map the labels to 0..{classes - 1}"
        )
    if high is not None and high >= classes:
        raise ValueError(
            f"{names.y} hold{names.ys} class labels up to {int(high)} but the module outputs {classes} class scores (outputs "
            f"of shape {_shape(outputs)}), so {loss} needs labels in [0, {classes}); likely fix: make the last layer "
            f"output {int(high) + 1} classes, or map the labels to 0..{classes - 1}"
        )


def _check_same_shape(named: str, outputs: torch.Tensor, target: torch.Tensor, names: _Names) -> None:
    """Binary and regression losses compare outputs and targets element by element."""
    if target.shape == outputs.shape:
        return
    if target.dim() == outputs.dim() - 1 and outputs.shape[-1] == 1 and target.shape == outputs.shape[:-1]:
        return  # outputs (N, 1), targets (N,): the loss squeezes the outputs, as Keras does
    out, got = _shape(outputs), _shape(target)
    if target.dim() == outputs.dim() - 1 and outputs.shape[-1] == 1 and target.shape == outputs.shape[:-1]:
        fix = f"reshape y to {out} with `y.reshape(-1, 1)` (or `y[:, None]`)" if target.dim() == 1 else (
            f"reshape y to {out} with `y.unsqueeze(-1)`")
    elif outputs.dim() == target.dim() - 1 and target.shape[-1] == 1 and target.shape[:-1] == outputs.shape:
        fix = f"reshape y to {out} with `y.reshape(-1)`, or make the module output shape {got}"
    else:
        fix = f"pass targets of shape {out}, or make the module output shape {got}"
    raise ValueError(
        f"{names.y} ha{'s' if names.ys else 've'} shape {got} but the module's outputs have shape {out}: `loss`={named!r} needs targets of the "
        f"outputs' shape (it does not broadcast); likely fix: {fix}"
    )


def _check_binary_range(named: str, stats: dict[str, float], names: _Names) -> None:
    low, high = stats.get("y_min"), stats.get("y_max")
    if low is not None and high is not None and (low < 0 or high > 1):  # read together
        raise ValueError(
            f"{names.y} hold{names.ys} values from {low:g} to {high:g} but `loss`={named!r} needs targets in [0, 1] (0/1 labels "
            "or probabilities); likely fix: for class indices use loss='cross_entropy' with one output per class"
        )


def _check_metrics(specs: Any, outputs: Any, target: Any, names: _Names) -> None:
    """Metric callables (not names, not metric objects) return a scalar tensor or a number."""
    for spec in specs:
        if isinstance(spec, LossParts):
            continue
        if isinstance(spec, OutputMetric):
            preds, tgt = spec.select(outputs, target)
            spec, metric_names = spec.spec, names.for_output(spec.output)
        else:
            preds, tgt, metric_names = outputs, target, names
            if is_structure(preds) and not is_structure(target):
                preds = single_output(preds, target, what="metrics")
        preds = preds.detach() if isinstance(preds, torch.Tensor) else preds
        _check_metric(spec, preds, tgt, metric_names)


def _check_metric(spec: Any, preds: Any, target: Any, names: _Names) -> None:
    if isinstance(spec, Weighted):
        spec = spec.spec
    if isinstance(spec, str) or not callable(spec) or (hasattr(spec, "update") and hasattr(spec, "compute")):
        return
    if is_keras_metric(spec) or keras_order(spec):  # Keras' objects and per-sample functions: run as Keras runs them
        return
    name = metric_name(spec)
    try:
        value = spec(preds, target)
    except Exception as err:
        raise ValueError(
            f"metric `{name}` in `metrics` raised on the first batch of `{names.name}`: predictions "
            f"{_describe(preds)}, {names.y} {_describe(target)}; likely fix: make it take (predictions, targets) "
            f"of these shapes and return one number ({error_line(err)})"
        ) from err
    tensor = isinstance(value, torch.Tensor)
    if (tensor and value.numel() == 1) or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        return
    got = f"a tensor of shape {_shape(value)}" if tensor else type(value).__name__
    raise TypeError(
        f"metric `{name}` in `metrics` returned {got} on the first batch of `{names.name}`: a metric callable "
        "must return a scalar tensor or a number (reduce per-sample values, e.g. with `.mean()`)"
    )


# -- small helpers -------------------------------------------------------------------------------
def _named(loss: Loss | None) -> str | None:
    spec = getattr(loss, "spec", None)
    return spec if isinstance(spec, str) else None


def _single_input(batch: Batch) -> torch.Tensor | None:
    inputs = batch.inputs
    if isinstance(inputs, tuple) and len(inputs) == 1 and isinstance(inputs[0], torch.Tensor):
        return inputs[0]
    return None


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _layer(layer: torch.nn.Module | None) -> str:
    if layer is None:
        return "the module itself"
    extra = layer.extra_repr().splitlines()
    return f"{type(layer).__name__}({extra[0] if len(extra) == 1 else ''})"


def _describe(value: Any) -> str:
    """`of shape (32, 8) dtype torch.float32`, or each part of a tuple or dict of them."""
    if isinstance(value, torch.Tensor):
        return f"of shape {_shape(value)} dtype {value.dtype}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        if len(value) == 1:
            return _describe(value[0])
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return f"of type {type(value).__name__}"
