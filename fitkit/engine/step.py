"""The mechanics of one step over Fabric: forward, loss, backward, clipping, optimizer step,
clearing gradients, train/eval mode.

`Stepper` decides once, when a run starts, whether the step can skip Fabric's wrappers: on one
device in full precision with no Fabric callbacks they only add checks and no-op conversions
(about 30 us a step), so the module, backward and optimizer are called directly.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from fitkit.adapters.label_smoothing import smoothed_loss
from fitkit.adapters.losses import Loss
from fitkit.common.frozen import overrides_train, train_plan
from fitkit.common.wrappers import torch_optimizer
from fitkit.engine.data.batch import Batch

if TYPE_CHECKING:
    from fitkit.config.arguments import TrainingArguments
    from fitkit.engine.token_loss import LossItems

#: What a step calls as its loss, `loss(outputs, targets, sample_weight)`: a compiled `Loss`, or
#: the stand-in that checks the first batch (`fitkit.engine.checks`).
LossFn = Callable[[Any, Any, Any], torch.Tensor]


class FirstStepHook(Protocol):
    """What checks a phase's first real forward (`fitkit.engine.checks.FirstStep`): called with the
    stepper instead of its plain forward until it hands the forward back (`Stepper.hook = None`)."""

    def forward(self, stepper: Stepper, batch: Batch, with_loss: bool) -> tuple[torch.Tensor | None, Any]: ...


class Stepper:
    """Forward / backward / optimizer calls for one run, direct or through Fabric.

        stepper = Stepper(fabric, module, optimizer, loss)
        loss, out = stepper.forward_backward(batch, cycle=1, last=True)
        stepper.clip(1.0); stepper.step(); stepper.zero_grad()
    """

    # What the stepper `fitkit.engine.on_batch` keeps was built for (set there, on that one only).
    key_module: torch.nn.Module
    key_args: TrainingArguments

    def __init__(self, fabric: Any, module: torch.nn.Module, optimizer: Any, loss: Loss | None,
                 compute_loss: Callable[..., torch.Tensor] | None = None,
                 label_smoothing: tuple[float, bool] | None = None) -> None:
        self.fabric = fabric
        # HF's `label_smoothing_factor` for a module computing its own loss: (factor, shift), see adapters.label_smoothing
        self.label_smoothing = label_smoothing
        self.module = module  # as set up by Fabric: what callbacks and checkpoints see
        self.optimizer = optimizer  # Fabric's wrapper
        self.loss: LossFn | None = loss
        self.compute_loss = compute_loss  # a `Model.compute_loss` override, replacing `loss`
        self.direct = plain_single_device(fabric)
        self.hook: FirstStepHook | None = None  # the first-step checks while armed (`forward` calls it)
        self._items: LossItems | None = None  # set for one training forward of a token-counted window
        self._kept = False  # see `keep_parameters`
        self._params: list[torch.nn.Parameter] | None = None
        # The one place the path is chosen: what forward, backward, clipping and the optimizer call.
        if self.direct:  # Fabric's wrappers (LocalFabric's module is the module itself)
            self.forward_module = module.__dict__["_modules"].get("_forward_module", module)
            self._backward: Callable[[torch.Tensor], Any] = torch.Tensor.backward
            inner = optimizer.optimizer if optimizer is not None else None
        else:
            self.forward_module = module
            self._backward = fabric.backward
            inner = optimizer
        if not any(p.requires_grad for p in module.parameters()):  # Keras trains it: loss reported, nothing updated
            self._backward = frozen_backward()
            inner = torch_optimizer(inner)  # torch's own step: a no-op without gradients, no grad scaler
        self._inner_optimizer = inner
        self.zero_grad: Callable[[], None] = grad_clearer(inner, self.direct) if optimizer is not None else _nothing

    # -- forward and backward -------------------------------------------------------------
    def forward(self, batch: Batch, with_loss: bool = True) -> tuple[torch.Tensor | None, Any]:
        """`(loss, outputs)` of one batch; the loss is None without targets or `with_loss` (or
        when a module computing its own loss returned none: unlabeled evaluation data)."""
        if self.hook is not None:
            return self.hook.forward(self, batch, with_loss)
        return self.plain_forward(batch, with_loss, self.forward_module, self.loss)

    def plain_forward(self, batch: Batch, with_loss: bool, module: Any,
                      loss_fn: LossFn | None) -> tuple[torch.Tensor | None, Any]:
        """`forward` through `module` and `loss_fn` (the first-step checks pass their wrappers)."""
        if self.compute_loss is not None:
            return self._forward_with_compute_loss(batch, with_loss, module)
        inputs, target = batch.inputs, batch.target
        if loss_fn is None and with_loss and target is not None:
            if self.label_smoothing is not None and isinstance(inputs, dict):  # the Trainer's LabelSmoother
                out = module(**inputs)
                return smoothed_loss(out, target, *self.label_smoothing), metric_outputs(out)
            if isinstance(inputs, dict):
                items = self._items  # the Trainer's `num_items_in_batch`, in a token-counted training window
                out = (module(**inputs, labels=target) if items is None
                       else module(**inputs, labels=target, num_items_in_batch=items.tokens))
            else:
                out = module(*inputs, target)
            return scalar_loss(model_loss(out)), metric_outputs(out)
        out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
        if not with_loss:
            return None, out
        if loss_fn is None:  # a module that computes its loss from the inputs alone (or none: no labels)
            if torch.is_grad_enabled() or returned_loss(out):
                return scalar_loss(model_loss(out)), metric_outputs(out)
            return None, out
        if target is None:
            return None, out
        loss = loss_fn(out, target, batch.sample_weight)  # the loss picks the output(s)
        if loss.dim():
            scalar_loss(loss)  # raises
        return loss, out

    def _forward_with_compute_loss(self, batch: Batch, with_loss: bool, module: Any) -> tuple[torch.Tensor | None, Any]:
        """`forward` when a `Model` subclass overrides `compute_loss(x, y, y_pred, sample_weight)`."""
        inputs = batch.inputs
        out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
        if not with_loss:
            return None, out
        x = inputs[0] if isinstance(inputs, tuple) and len(inputs) == 1 else inputs
        assert self.compute_loss is not None  # this forward is chosen only with one
        loss = self.compute_loss(x, batch.target, out, batch.sample_weight)
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"`compute_loss` must return a scalar tensor, got {type(loss).__name__}")
        return scalar_loss(loss), out

    def forward_backward(self, batch: Batch, cycle: int, last: bool,
                         items: LossItems | None = None) -> tuple[torch.Tensor, Any]:
        """Forward and backward of one micro-batch of an accumulation cycle of `cycle`; the
        gradient sync between processes is skipped until the `last` one. `items`: the window's
        label tokens (`fitkit.engine.token_loss`), given to the module as `num_items_in_batch`;
        its loss is then multiplied by `items.scale` and not divided by `cycle`, as the Trainer's."""
        if cycle > 1 and not self.direct and not self.sync_each_batch:  # one device has no gradient sync to skip
            with self.fabric.no_backward_sync(self.module, enabled=not last):
                return self._forward_backward(batch, cycle, items)
        return self._forward_backward(batch, cycle, items)

    def no_sync(self, cycle: int, last: bool) -> contextlib.AbstractContextManager[Any]:
        """A context in which backward skips the gradient sync, except at the `last` micro-batch."""
        if cycle > 1 and not self.direct and not self.sync_each_batch:
            return self.fabric.no_backward_sync(self.module, enabled=not last)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward on this run's path (Fabric's, with its precision and strategy, or torch's)."""
        self._backward(loss)

    def _forward_backward(self, batch: Batch, cycle: int, items: LossItems | None = None) -> tuple[torch.Tensor, Any]:
        self._items = items
        try:
            loss, out = self.forward(batch)
        finally:
            self._items = None
        if loss is None:
            raise ValueError("training needs targets: pass `y`, or batches of (x, y), or a module that returns its loss")
        if items is not None:  # normalised over the window's tokens by the module: not divided again
            if items.scale != 1:
                loss = loss * items.scale
            self._backward(loss)
        else:
            self._backward(loss / cycle if cycle > 1 else loss)
        return loss, out

    # -- the optimizer --------------------------------------------------------------------------
    def clip(self, max_norm: float | None, measure: bool = False) -> torch.Tensor | None:
        """Clip the gradients to `max_norm` (None: no clipping) and return their total norm before
        clipping, a device tensor (never read here); None when nothing was clipped, unless
        `measure` asks for the norm anyway (HF's Trainer logs it with clipping off too)."""
        if max_norm is None and not measure:
            return None
        if self.direct:  # no wrapper and no precision plugin to go through
            params = self._parameters()
            if max_norm is None:
                grads = [p.grad for p in params if p.grad is not None]
                return torch.nn.utils.get_total_norm(grads) if grads else None
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        if max_norm is None:  # the norm alone (sharded strategies compute it their way), NaN included
            norm = self.fabric.clip_gradients(self.module, self.optimizer, max_norm=float("inf"),
                                              error_if_nonfinite=False)
        else:
            norm = self.fabric.clip_gradients(self.module, self.optimizer, max_norm=max_norm)
        return norm if isinstance(norm, torch.Tensor) else None

    def keep_parameters(self) -> None:
        """Clip over the module's parameters as listed at the first clip from now on, instead of
        listing them at every clip: `module.parameters()` walks every submodule, 0.3 - 0.6 ms a
        step for a small transformer, as much as the clipping itself. `fit` keeps them for its
        run (the list includes frozen parameters, so unfreezing some mid-run is seen)."""
        self._kept = True

    def _parameters(self) -> Iterable[torch.nn.Parameter]:
        if not self._kept:
            return self.forward_module.parameters()
        if self._params is None:
            self._params = list(self.forward_module.parameters())
        return self._params

    def step(self) -> None:
        assert self._inner_optimizer is not None  # only a run with an optimizer steps
        self._inner_optimizer.step()

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- modes ----------------------------------------------------------------------------------
    #: set by `ending_epoch`: an evaluation leaves a module that defines `train()` in eval mode
    train_at_next_epoch = False
    #: norm layers of wholly frozen parts run in inference mode while training (Keras); the run
    #: policy turns it off for a Trainer run, whose `model.train()` trains every BatchNorm
    freeze_norms = True
    #: Accelerate's `sync_each_batch` (HF's `accelerator_config`): every micro-batch's backward syncs gradients
    sync_each_batch = False

    def train_mode(self, mode: bool) -> None:
        set_training(self.module, mode, self.freeze_norms)

    @contextlib.contextmanager
    def inference(self, fast: bool = False) -> Iterator[GradMode]:
        """Eval mode and no gradients; the previous mode comes back after. `fast`: under
        `torch.inference_mode` on the direct path (see `GradMode`)::

            with stepper.inference(fast=True) as mode:
                ...
        """
        was_training = self.module.training
        set_training(self.module, False)
        try:
            with GradMode(fast and self.direct) as mode:
                yield mode
        finally:
            if not (self.train_at_next_epoch and overrides_train(self.module)):
                set_training(self.module, was_training, self.freeze_norms)

    @contextlib.contextmanager
    def ending_epoch(self) -> Iterator[None]:
        """An epoch's last evaluation: a module with its own `train()` stays in eval mode after
        it, and the next epoch's `train_mode(True)` calls `train()` once, as a hand-written loop
        (`net.train()` at each epoch's start, `net.eval()` before validating) calls it."""
        self.train_at_next_epoch = True
        try:
            yield
        finally:
            self.train_at_next_epoch = False


class GradMode:
    """The autograd mode of one `evaluate` or `predict`: `torch.no_grad`, and inside it
    `torch.inference_mode` when `fast` (as Lightning's Trainer evaluates; inference mode also
    skips the version counters and view tracking, about 5 - 10% of a small network's forward).

    A forward that fails under inference mode (one that computes gradients inside with
    `torch.enable_grad`, which inference mode does not let out) is run again after `fall_back`,
    which leaves inference mode for `no_grad` for the rest of the call::

        with GradMode(fast=True) as mode:
            try:
                out = module(x)
            except RuntimeError:
                if not mode.fall_back():
                    raise  # the forward's own error: it failed under no_grad
                out = module(x)
    """

    __slots__ = ("fast", "_outer", "_inner")

    def __init__(self, fast: bool) -> None:
        self.fast = fast
        self._outer = torch.no_grad()
        self._inner: torch.inference_mode | None = None

    def __enter__(self) -> GradMode:
        self._outer.__enter__()
        if self.fast:
            self._inner = torch.inference_mode()
            self._inner.__enter__()
        return self

    def fall_back(self) -> bool:
        """Leave inference mode for `no_grad`; False when already there."""
        if self._inner is None:
            return False
        inner, self._inner, self.fast = self._inner, None, False
        inner.__exit__(None, None, None)
        return True

    def __exit__(self, *exc: Any) -> None:
        if self._inner is not None:
            self._inner.__exit__(*exc)
        self._outer.__exit__(*exc)


def _nothing() -> None:
    return None


def frozen_backward() -> Callable[[torch.Tensor], None]:
    """The backward of a module none of whose parameters requires grad: there is nothing to
    compute (torch would raise "element 0 of tensors does not require grad"); the first call
    warns, once per run."""
    warned: list[bool] = []

    def backward(loss: torch.Tensor) -> None:
        if not warned:
            warned.append(True)
            warnings.warn("no parameter of the module requires grad (all are frozen): fit reports the loss and "
                          "updates nothing; unfreeze the ones to train with `p.requires_grad_(True)`",
                          UserWarning, stacklevel=3)

    return backward


def scalar_loss(loss: torch.Tensor) -> torch.Tensor:
    if loss.dim() != 0:
        raise ValueError(
            f"the loss must be a scalar tensor but has shape {tuple(loss.shape)}: reduce it "
            "(for example `.mean()`), or use `reduction='mean'` in the loss module"
        )
    return loss


def model_loss(out: Any) -> torch.Tensor:
    """The loss a module returned itself: a tensor, `out["loss"]`, `out.loss` or `out[0]`."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and "loss" in out:
        return out["loss"]
    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise ValueError(
        "`loss=None` means the module returns its loss (a tensor, a dict with 'loss', or a tuple whose first "
        f"item is the loss), but it returned {type(out).__name__}; pass `loss=` to compile"
    )


def returned_loss(out: Any) -> bool:
    """Whether a module's outputs carry a loss: not a transformers output (or dict) whose `loss`
    is None or missing, as a model returns for features without labels (QA evaluation)."""
    if isinstance(out, dict):
        return out.get("loss") is not None
    return getattr(out, "loss", True) is not None


def metric_outputs(out: Any) -> Any:
    """What metrics see when the module returned its own loss: logits, not the loss."""
    if isinstance(out, (tuple, list)) and len(out) > 1:
        return out[1]
    return out


def set_training(module: torch.nn.Module, mode: bool, freeze_norms: bool = True) -> None:
    """`module.train(mode)`, with the norm layers of wholly frozen parts in inference mode while
    training (Keras' frozen BatchNorm, `fitkit.common.frozen.frozen_norms`).

    A module whose tree defines its own `train()` has it called every time, as a hand-written loop
    calls `net.train()`. Otherwise nothing is set when every submodule is in its mode already (a
    loop of `train_on_batch` calls), and Fabric's wrapper's attribute hook, which lists
    `dir(module)` on every assignment (20 us of a call's 27 here), is bypassed."""
    modules, own, frozen = train_plan(module, mode and freeze_norms)
    if not own and all(m.training is (mode and id(m) not in frozen) for m in modules):
        return
    if own or "_forward_module" not in module.__dict__.get("_modules", {}):
        module.train(mode)
    else:
        object.__setattr__(module, "training", mode)  # past `_FabricModule.__setattr__`
        for child in module.children():
            child.train(mode)
    for m in modules if frozen else ():
        if id(m) in frozen:
            m.train(False)


def grad_clearer(optimizer: Any, direct: bool) -> Callable[[], None]:
    """`optimizer.zero_grad(set_to_none=True)`. On the direct path, for a torch optimizer that
    keeps torch's own `zero_grad`, the same loop without its profiler annotation and compiler
    guard (about 10 us a step on a small network)."""
    plain = isinstance(optimizer, torch.optim.Optimizer) and type(optimizer).zero_grad is torch.optim.Optimizer.zero_grad
    if not (direct and plain):
        return lambda: optimizer.zero_grad(set_to_none=True)

    def clear() -> None:
        for group in optimizer.param_groups:  # read each time: a callback may add a group
            for param in group["params"]:
                param.grad = None

    return clear


def plain_single_device(fabric: Any) -> bool:
    """One device, full precision, no Fabric callbacks: nothing for Fabric's wrappers to do
    (always so on a `LocalFabric`, which then needs no Lightning import here)."""
    from fitkit.engine.devices.local import LocalFabric

    if isinstance(fabric, LocalFabric):
        return True
    from lightning_fabric.plugins import Precision
    from lightning_fabric.strategies import SingleDeviceStrategy

    return (type(fabric.strategy) is SingleDeviceStrategy and type(fabric.strategy.precision) is Precision
            and not fabric._callbacks)
