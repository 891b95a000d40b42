"""Keras' smaller `Model` methods: one batch at a time, weights as arrays, counts and names.

    model = Model(net).compile("sgd", "mse", metrics=["mae"])
    model.train_on_batch(x, y)                   # [loss, mae] of the batch, before the step
    model.test_on_batch(x, y, return_dict=True)  # {"loss": ..., "mae": ...}
    model.predict_on_batch(x)                    # tensor
    weights = model.get_weights(); model.set_weights(weights)
    model.count_params(), model.metrics_names, model(x)

`Model` inherits them; they use only its public members. `model.optimizer` is the run's optimizer
with Keras' `learning_rate` (`OptimizerView`), also as a Keras-style callback's `self.model`,
which is the model itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from fitkit.adapters.keras_metrics import Weighted
from fitkit.adapters.metric_specs import metric_name
from fitkit.adapters.outputs import OutputMetric
from fitkit.callbacks._monitor import set_learning_rates
from fitkit.engine import on_batch
from fitkit.engine.overrides import StepOverrides
from fitkit.facade.members import ModelMembers
from fitkit.facade.steps import Steps

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from fitkit.config.arguments import TrainingArguments
    from fitkit.config.compile_config import CompileConfig
    from fitkit.engine.runtime import Runtime


def as_list(logs: dict[str, float], names: list[str]) -> float | list[float]:
    """Keras' `return_dict=False` form: the values of `names` (`metrics_names`) in that order,
    then any other value (a custom step's own) in the order it was logged; a single value alone."""
    ordered = [logs[n] for n in names if n in logs] + [v for k, v in logs.items() if k not in names]
    return ordered[0] if len(ordered) == 1 else ordered


def keras_names(config: CompileConfig | None) -> list[str]:
    """The names Keras 3's `evaluate(return_dict=False)` orders its values by: "loss", the
    metrics of a single output as compiled, the per-output losses in the outputs' order (known
    once the loss has run), then per-output and weighted metrics sorted by name (Keras sorts the
    names its compiled metrics do not carry)::

        compile(loss=["mse", "mse"], metrics=[["mse", "mae"], ["acc"]])
        # -> ["loss", "output_0_loss", "output_1_loss", "output_0_mae", "output_0_mse", "output_1_acc"]
    """
    if config is None:
        return ["loss"]
    plain = [metric_name(s) for s in config.metrics if _as_compiled(s)]
    parts = config.loss_parts.names() if config.loss_parts is not None else []
    rest = sorted(metric_name(s) for s in config.metrics if not _as_compiled(s))
    return list(dict.fromkeys(["loss", *plain, *parts, *rest]))


def _as_compiled(spec: Any) -> bool:
    """Whether Keras logs the metric under the name it was compiled with (one output, and no
    `weighted_` prefix), which keeps it in compile order."""
    return not isinstance(spec, OutputMetric) and not (isinstance(spec, Weighted) and spec.name)


class OptimizerView:
    """`Model.optimizer`: the run's optimizer with Keras' `learning_rate` (and `lr`) attribute,
    which reads the first parameter group's rate and assigns every group's (and the scheduler's
    base rates); anything else is the optimizer's own::

        lr = float(model.optimizer.learning_rate)
        model.optimizer.learning_rate = lr * 0.5     # from a Keras-style callback too
    """

    def __init__(self, optimizer: Any, runtime: Any) -> None:
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_runtime", runtime)

    def step(self, closure: Any = None) -> Any:
        """The optimizer's step; inside an overridden `train_step`, the loop's deferred step
        (clipping, the optimizer events, the scheduler, at the end of an accumulation cycle)."""
        tools = self._runtime.tools
        if tools is not None and tools.deferred is not None:
            return tools.deferred.step(closure)
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The optimizer's `zero_grad`; inside an overridden `train_step`, nothing while an
        accumulation cycle's gradients are still being gathered."""
        tools = self._runtime.tools
        if tools is not None and tools.deferred is not None:
            return tools.deferred.zero_grad(set_to_none)
        return self._optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def learning_rate(self) -> float:
        groups = self._optimizer.param_groups
        return float(groups[0]["lr"]) if groups else math.nan

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        rate = _checked_rate(value)
        scheduler = getattr(self._runtime, "scheduler", None)
        set_learning_rates(self._optimizer, scheduler, lambda _i, _old: rate)

    lr = learning_rate

    @property
    def wrapped(self) -> Any:
        """The optimizer itself."""
        return self._optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("learning_rate", "lr"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def __repr__(self) -> str:
        return f"OptimizerView({self._optimizer!r})"


def _checked_rate(value: Any) -> float:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if isinstance(value, bool) or not math.isfinite(rate) or rate < 0:
        raise ValueError(f"`optimizer.learning_rate`={value!r} is invalid: assign a finite number >= 0")
    return rate


class PendingOptimizer:
    """`Model.optimizer` between `compile` and the first `fit`: the optimizer is built over the
    set-up module when training starts (FSDP, for one, replaces the parameters), so until then
    this stands for it, as Keras' built optimizer does for its rate::

        model.compile("adam")
        model.optimizer.learning_rate            # 0.001, the rate fit will start from
        model.optimizer.learning_rate = 1e-2     # fit starts from it
    """

    def __init__(self, model: Any) -> None:
        object.__setattr__(self, "_model", model)

    @property
    def learning_rate(self) -> float:
        from fitkit.adapters.optimizers import named_keywords

        config = self._model.config
        if config.args.learning_rate is not None:
            return float(config.args.learning_rate)
        spec = config.optimizer
        if isinstance(spec, torch.optim.Optimizer):
            return float(spec.param_groups[0]["lr"])
        try:
            return float(named_keywords(spec, None)["lr"])
        except (AttributeError, KeyError, TypeError):
            raise AttributeError(f"the learning rate of optimizer={spec!r} is known once `fit` builds it: read "
                                 "`model.optimizer.learning_rate` after fit, or pass compile(learning_rate=...)") from None

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        import dataclasses

        rate, config = _checked_rate(value), self._model.config
        self._model.config = dataclasses.replace(config, args=config.args.replace(learning_rate=rate),
                                                 argument_options={**config.argument_options, "learning_rate": rate})

    lr = learning_rate

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"`model.optimizer.{name}`: the optimizer is built when `fit` starts (over the set-up "
                             "module); before that only `learning_rate` is offered. Read it after the first fit.")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in ("learning_rate", "lr"):
            self.__getattr__(name)
        object.__setattr__(self, name, value)  # the property's setter

    def __repr__(self) -> str:
        return f"PendingOptimizer({self._model.config.optimizer!r}, learning_rate={self.learning_rate})"


class KerasMethods(ModelMembers):
    """`train_on_batch`, `test_on_batch`, `predict_on_batch`, `get_weights`, `set_weights`,
    `count_params`, `metrics_names` and calling the model, as Keras has them."""

    @property
    def optimizer(self) -> Any:
        """The optimizer (as Fabric set it up) after the first fit, with Keras' `learning_rate`
        (`OptimizerView`); between `compile` and the first fit a `PendingOptimizer` (its
        `learning_rate` only); None before `compile`. It is kept across fits, so its state carries over
        (Keras); `compile` again starts a fresh one. Inside an overridden `train_step`, its
        `step()` also clips, fires the optimizer events and steps the scheduler, at the end of a
        gradient-accumulation cycle."""
        runtime = self.runtime
        optimizer = runtime.optimizer
        if optimizer is None:
            return None if self.config is None else PendingOptimizer(self)  # Keras builds it at compile
        view = self.__dict__.get("_optimizer_view")
        if view is None or view.wrapped is not optimizer:
            view = self.__dict__["_optimizer_view"] = OptimizerView(optimizer, runtime)
        return view

    def _batch_call(self) -> tuple[Runtime, torch.nn.Module, CompileConfig | None, TrainingArguments | None,
                                   StepOverrides]:
        config = self.config
        args = config.args if config is not None else None
        return self.runtime, self.module, config, args, StepOverrides.of(self, Steps)

    def train_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None, class_weight: dict | None = None,
                       return_dict: bool = False) -> float | list[float] | dict[str, float]:
        """One optimizer step on the batch `(x, y)` (no callbacks); returns the batch's loss and
        metrics as they were before the step: a list in `metrics_names` order (the loss alone
        without metrics), or a dict with `return_dict=True`."""
        runtime, module, config, args, overrides = self._batch_call()
        if config is None:
            raise RuntimeError("call `compile(optimizer, loss, metrics)` before `train_on_batch()`")
        logs = on_batch.train(runtime, module, config, args, overrides, x, y, sample_weight, class_weight)
        return logs if return_dict else as_list(logs, self.metrics_names)

    def test_on_batch(self, x: Any, y: Any = None, sample_weight: Any = None,
                      return_dict: bool = False) -> float | list[float] | dict[str, float]:
        """The loss and metrics of the batch `(x, y)` in evaluation mode (nothing updated)."""
        runtime, module, config, args, overrides = self._batch_call()
        if config is None:
            raise RuntimeError("call `compile(optimizer, loss, metrics)` before `test_on_batch()`")
        logs = on_batch.test(runtime, module, config, args, overrides, x, y, sample_weight)
        return logs if return_dict else as_list(logs, self.metrics_names)

    def predict_on_batch(self, x: Any) -> Any:
        """The module's outputs for the batch `x` (evaluation mode, no gradients), on CPU."""
        runtime, module, config, args, overrides = self._batch_call()
        from fitkit.config.arguments import TrainingArguments

        return on_batch.predict(runtime, module, config, args or TrainingArguments(), overrides, x)

    # -- weights -------------------------------------------------------------------------------
    def get_weights(self) -> list[np.ndarray]:
        """Every weight of the module (its `state_dict` values: parameters and buffers) as
        NumPy arrays (copies: training later does not change them), in `state_dict` order."""
        return [value.detach().cpu().numpy().copy() for value in self.module.state_dict().values()]

    def set_weights(self, weights: Sequence[Any]) -> None:
        """Set the module's weights from a list like `get_weights()` returns (arrays or tensors)."""
        state = self.module.state_dict()
        if not isinstance(weights, (list, tuple)) or len(weights) != len(state):
            count = len(weights) if isinstance(weights, (list, tuple)) else type(weights).__name__
            raise ValueError(f"`weights` must be a list of {len(state)} arrays, as get_weights() returns; got {count}")
        new = {}
        for (name, current), value in zip(state.items(), weights):
            tensor = torch.as_tensor(value)
            if tuple(tensor.shape) != tuple(current.shape):
                raise ValueError(f"`weights`: {name} has shape {tuple(current.shape)} in this model but "
                                 f"{tuple(tensor.shape)} was given (pass the arrays in get_weights() order)")
            new[name] = tensor.to(dtype=current.dtype)
        self.module.load_state_dict(new)

    def count_params(self) -> int:
        """The number of parameters of the module (as `summary()` counts them)."""
        return sum(p.numel() for p in self.module.parameters())

    @property
    def metrics_names(self) -> list[str]:
        """The names of the values `evaluate(return_dict=False)` and the `*_on_batch` methods
        return, in their order (Keras 3's), so `dict(zip(model.metrics_names, values))` pairs
        them: "loss", the compiled metrics of a single output, the per-output losses (once a
        call has run the loss, as Keras builds them), then per-output and weighted metrics
        sorted by name. Keras 3 itself lists its compiled metrics as one "compile_metrics"."""
        return keras_names(self.config)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`model(x)`: the module's forward (as it is set up inside an overridden step)."""
        return self.module(*args, **kwargs)
