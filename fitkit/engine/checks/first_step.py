"""The checks that need the module's outputs, run on the real first forward of a phase (the
first training step, the first evaluation or prediction batch): the module is called no extra
time, and a batch read from a loader is checked as the run reads it (its data checks first, then
the forward's). The `Stepper` calls the armed `FirstStep` instead of its plain forward until
every armed check has run (`Stepper.hook`)::

    FirstStep.of(stepper).arm(pending, training=True)
    loss, out = stepper.forward(batch)   # checked: what raises names the argument and the fix
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from fitkit.adapters.losses import Loss
from fitkit.adapters.outputs import is_structure
from fitkit.common.keras_idioms import keras_idiom_hint
from fitkit.common.memory_errors import out_of_memory
from fitkit.common.options import error_line
from fitkit.common.tensors import tensors_of
from fitkit.engine.checks.inputs import _probe_safe, _read_stats, _warn_non_finite, check_batch
from fitkit.engine.checks.memo import CheckMemo, _identity
from fitkit.engine.checks.names import _describe, _Names, _shape
from fitkit.engine.checks.rules import _check_metrics, _check_rules, _loss_pairs, _module_hint
from fitkit.engine.data.batch import Batch
from fitkit.engine.data.rng import rng_state, set_rng_state

if TYPE_CHECKING:
    from fitkit.engine.step import Stepper


class _Pending:
    """What the checks of a phase's first step need: the source's names, metrics, and its first
    batch with the values read from it (`batch` None: a loader's, checked when the step reads it)."""

    def __init__(self, module: torch.nn.Module, batch: Batch | None, names: _Names, stats: dict[str, float],
                 metrics: Any, with_loss: bool, *, training: bool = False, forward_checks: bool = True,
                 seen: Callable[[Batch], None] | None = None):
        self.module, self.batch, self.names, self.stats = module, batch, names, stats
        self.metrics, self.with_loss, self.training = metrics, with_loss, training
        self.forward_checks = forward_checks  # False on several processes: one rank raising alone would hang
        self.seen = seen  # told the batch a deferred check read (summary()'s example shapes)
        self.memo: CheckMemo | None = None  # with `key` (this check but the outputs) and the data's `leaves`
        self.key: tuple | None = None
        self.leaves: list = []
        self.step_batch: Batch | None = None  # the batch the first step runs on, and the loss it reads values for
        self.step_loss: Any = None
        self._outputs: Any = None  # the outputs `_key_with_outputs` was made for
        self._key_with_outputs: tuple = ()

    def read(self, batch: Batch, loss: Any) -> None:
        """The data checks of a loader's first batch, on the batch the run itself read."""
        self.stats = check_batch(batch, self.module, loss, self.names, training=self.training,
                                 with_loss=self.with_loss)
        if isinstance(loss, Loss) and is_structure(batch.target):
            loss.structured = True  # one loss on several outputs: `<output>_loss` is logged from the first step
        self.batch = batch
        if self.seen is not None:
            self.seen(batch)

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
        if batch is not None and self.stats and self.batch is not None and not _same_data(batch, self.batch):
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
    """The stepper's hook while checks are armed: the first training forward checks `train`,
    the first forward without gradients `infer`; then the stepper's plain forward again. Its
    exception, the loss rules, the loss itself and the metric callables are checked there,
    before the backward and the optimizer step, and re-raised with the context."""

    def __init__(self) -> None:
        self.train: _Pending | None = None
        self.infer: _Pending | None = None

    @classmethod
    def of(cls, stepper: Stepper) -> FirstStep:
        """The stepper's armed checks, armed now if they were not."""
        if not isinstance(stepper.hook, cls):
            stepper.hook = cls()
        return stepper.hook

    def arm(self, pending: _Pending, training: bool) -> None:
        if training:
            self.train = pending
        else:
            self.infer = pending

    def forward(self, stepper: Stepper, batch: Batch, with_loss: bool = True) -> tuple[Any, Any]:
        training = torch.is_grad_enabled()
        pending = self.train if training else self.infer
        if pending is None:
            return stepper.plain_forward(batch, with_loss, stepper.forward_module, stepper.loss)
        if training:
            self.train = None
        else:
            self.infer = None
        if self.train is None and self.infer is None:  # nothing left to check: the plain forward again
            stepper.hook = None
        if pending.batch is None:  # a loader's first batch: its data checks, as the run reads it
            pending.read(batch, stepper.loss if with_loss and pending.with_loss else None)
        if not pending.forward_checks:
            return stepper.plain_forward(batch, with_loss, stepper.forward_module, stepper.loss)
        loss, out = self.checked(stepper, pending, batch, with_loss)
        infer = self.infer
        if training and infer is not None and infer.batch is not None and not infer.passed_before(out):
            _check_validation(stepper, infer, out, batch)  # validation data, before any optimizer step
        return loss, out

    @staticmethod
    def checked(stepper: Stepper, pending: _Pending, batch: Batch, with_loss: bool) -> tuple[Any, Any]:
        """The step's forward through a module and a loss that re-raise with the context."""
        pending.step_batch, pending.step_loss = batch, stepper.loss if with_loss else None
        module, loss_fn = stepper.forward_module, stepper.loss
        own_loss = with_loss and pending.with_loss and loss_fn is None
        recorder = _Recorder(module, pending, own_loss and batch.target is not None)
        checked_loss = _CheckedLoss(loss_fn, pending) if loss_fn is not None and pending.with_loss else loss_fn
        loss, out = stepper.plain_forward(batch, with_loss, recorder, checked_loss)
        if own_loss and loss is not None:
            _check_own_loss(loss, pending.names)
        if pending.passed_before(out):
            return loss, out
        pending.step_stats()  # (the loss read them already when it has rules)
        if with_loss and pending.with_loss and pending.metrics and batch.target is not None:
            _check_metrics(pending.metrics, out, batch.target, pending.names)
        pending.remember(out)
        return loss, out


def unread(stepper: Stepper) -> bool:
    """Whether the stepper's training data, armed to be checked as the run reads it, gave no batch."""
    hook = stepper.hook
    pending = hook.train if isinstance(hook, FirstStep) else None
    return pending is not None and pending.batch is None and pending.forward_checks  # (a rank's shard may be empty)


class _Recorder:
    """The module, called as the step calls it; what it raises is re-raised with the context."""

    def __init__(self, module: Any, pending: _Pending, own_loss: bool):
        self.module, self.pending, self.own_loss = module, pending, own_loss

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.module(*args, **kwargs)
        except Exception as err:
            if out_of_memory(err):  # not the data's fault: raised as it is (`auto_find_batch_size` acts on it)
                raise
            raise _module_error(self.pending, self.own_loss, err) from err

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def _module_error(pending: _Pending, own_loss: bool, err: Exception) -> ValueError:
    names, batch = pending.names, pending.batch
    assert batch is not None  # read before the forward
    try:
        hint = keras_idiom_hint(err) or _module_hint(pending.module, batch, names, own_loss)
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


def _call_loss(loss: Any, outputs: Any, targets: Any, sample_weight: Any, pending: _Pending) -> Any:
    names = pending.names
    try:
        return loss(outputs, targets, sample_weight)
    except Exception as err:
        if (isinstance(err, ValueError) and "sample_weight" in str(err)) or out_of_memory(err):
            raise  # a loss that cannot weight samples says so itself; memory is not the data's fault
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
    if value.dim() != 0:  # (the step's own `scalar_loss` check, with the argument named)
        raise ValueError(f"`loss`={loss.name!r} on the first batch of `{names.name}`: the loss must be a scalar tensor "
                         f"but has shape {_shape(value)}: reduce it (for example `.mean()`), or use "
                         "`reduction='mean'` in the loss module")
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
    assert batch is not None  # in-memory validation data: read before the run
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
    """The module on the validation data's first batch (in-memory data: a slice, read without
    drawing), as evaluation runs it: eval mode through the module's own `eval()`/`train()`, no
    gradients, every generator (Python's, NumPy's, torch's) and every submodule's mode put back
    after; checked as its first evaluation step would be."""
    module = pending.module
    saved, modes = rng_state(), [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        with torch.no_grad():
            FirstStep.checked(stepper, pending, pending.batch, True)  # type: ignore[arg-type]
    finally:
        for m, mode in modes:  # parents first: `train` sets the children, each of which comes after
            if m.training is not mode:
                m.train(mode)
        set_rng_state(saved)
