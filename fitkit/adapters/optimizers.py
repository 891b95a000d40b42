"""Optimizers by name, class or factory, and the learning-rate schedules.

A name builds torch's optimizer with Keras 3's defaults for every hyperparameter (`KERAS_DEFAULTS`);
an HF `optim` name (`TorchDefaults`, from `TrainingArguments(optim=...)`) keeps torch's / HF's::

    build_optimizer("rmsprop", net.parameters(), None, None)     # Keras' RMSprop(lr=1e-3, rho=0.9, eps=1e-7)
    build_optimizer(TorchDefaults("adamw"), net.parameters(), 5e-5, 0.0)  # HF's AdamW (eps=1e-8)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from fitkit.adapters import keras_optimizers
from fitkit.common.options import did_you_mean
from fitkit.common.wrappers import torch_optimizer

#: name -> (class, Keras default learning rate): each class computes Keras 3's update
#: (`fitkit.adapters.keras_optimizers`; Nadam is torch's NAdam with Keras' momentum schedule;
#: Adagrad is torch's, equal to Keras' to float32 rounding with Keras' initial accumulator).
OPTIMIZERS: dict[str, tuple[type, float]] = {
    "adam": (keras_optimizers.Adam, 1e-3),
    "adamw": (keras_optimizers.AdamW, 1e-3),
    "sgd": (keras_optimizers.SGD, 1e-2),
    "rmsprop": (keras_optimizers.RMSprop, 1e-3),
    "adagrad": (keras_optimizers.Adagrad, 1e-3),
    "adadelta": (keras_optimizers.Adadelta, 1e-3),
    "adamax": (keras_optimizers.Adamax, 1e-3),
    "nadam": (torch.optim.NAdam, 1e-3),
    "lion": (keras_optimizers.Lion, 1e-3),
}

#: torch's own classes, for the HF `optim` names (`TorchDefaults`): HF's Trainer builds these.
TORCH_CLASSES: dict[str, type] = {
    "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD,
    "rmsprop": torch.optim.RMSprop, "adagrad": torch.optim.Adagrad,
}

#: Keras 3 optimizers fitkit does not build, with what to use instead (lower-case class names).
REFUSED: dict[str, str] = {
    "adafactor": "Keras' Adafactor is not built by name; torch.optim.Adafactor is another variant of it "
                 "(pass optimizer=torch.optim.Adafactor)",
    "ftrl": "Keras' Ftrl has no torch counterpart; pass a torch.optim.Optimizer subclass (e.g. optimizer=\"adagrad\")",
    "lamb": "Keras' Lamb has no torch counterpart; pass a torch.optim.Optimizer subclass (e.g. optimizer=\"adamw\")",
    "muon": "Keras' Muon is not built by name; torch.optim.Muon takes 2-D weights only "
            "(pass a callable params -> optimizer that builds it on the matrices and AdamW on the rest)",
    "schedulefreeadamw": "Keras' ScheduleFreeAdamW has no torch counterpart; use optimizer=\"adamw\" with lr_scheduler=",
    "lossscaleoptimizer": "loss scaling is fitkit's precision option: pass precision=\"16-mixed\" (Fabric's gradient scaler)",
    "multioptimizer": "pass a callable params -> optimizer that builds one torch optimizer with parameter groups",
    "optimizermap": "pass a callable params -> optimizer that builds one torch optimizer with parameter groups",
}


#: Keras 3's default for every hyperparameter of each named optimizer, as torch's keywords
#: (keras/src/optimizers/*.py, Keras 3.15; `alpha` is Keras' `rho` for RMSprop). The classes
#: place epsilon where Keras does and decay the weights as Keras does (decoupled): the updates
#: equal Keras' to float32 rounding (docs/migrating-from-keras.md, "Optimizer defaults").
KERAS_DEFAULTS: dict[str, dict[str, Any]] = {
    "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-7, "amsgrad": False},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-7, "weight_decay": 0.004, "amsgrad": False},
    "sgd": {"lr": 1e-2, "momentum": 0.0, "nesterov": False},
    "rmsprop": {"lr": 1e-3, "alpha": 0.9, "eps": 1e-7, "momentum": 0.0, "centered": False},
    "adagrad": {"lr": 1e-3, "initial_accumulator_value": 0.1, "eps": 1e-7},
    "adadelta": {"lr": 1e-3, "rho": 0.95, "eps": 1e-7},
    "adamax": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-7},
    "nadam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-7, "momentum_decay": 1.0,
              "decoupled_weight_decay": True},
    "lion": {"lr": 1e-3, "betas": (0.9, 0.99)},
}


@dataclass(frozen=True)
class TorchDefaults:
    """A named optimizer built with torch's defaults (HF's Trainer builds torch's classes so):
    what `TrainingArguments(optim="adamw_torch")` and the other HF names select; `options`: the
    keywords HF's `optim_args` gives it (`fitkit.adapters.optim_args`), over the others."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()


def check_optimizer(spec: Any) -> None:
    """Fail early (at `compile`) on an optimizer that cannot be built."""
    if isinstance(spec, TorchDefaults):
        spec = spec.name
    if isinstance(spec, str):
        if spec.lower().replace("_", "") in REFUSED:
            raise ValueError(f"optimizer {spec!r} is not available by name: {REFUSED[spec.lower().replace('_', '')]}")
        if spec.lower() not in OPTIMIZERS:
            raise ValueError(
                f"{did_you_mean(spec, OPTIMIZERS)}unknown optimizer {spec!r} for `optimizer`; valid names are: {', '.join(OPTIMIZERS)} "
                "(or pass a torch.optim.Optimizer subclass or a callable params -> optimizer)"
            )
    elif type(spec).__module__.split(".")[0] == "keras":
        raise TypeError(_keras_object_error(spec))
    elif not (isinstance(spec, torch.optim.Optimizer) or callable(spec)):
        raise TypeError(
            f"`optimizer` must be a name, a torch.optim.Optimizer subclass or instance, or a callable "
            f"params -> optimizer; got {type(spec).__name__}"
        )


def _keras_object_error(spec: Any) -> str:
    """What to pass instead of a `keras.optimizers` object (a Keras optimizer steps Keras variables)."""
    name = type(spec).__name__.lower()
    if name in REFUSED:
        return f"a keras.optimizers.{type(spec).__name__} object cannot drive a torch module: {REFUSED[name]}"
    if name not in OPTIMIZERS:
        return f"a keras.optimizers.{type(spec).__name__} object cannot drive a torch module: pass a torch.optim.Optimizer"
    cls = OPTIMIZERS[name][0]
    return (f"a keras.optimizers.{type(spec).__name__} object cannot drive a torch module: pass optimizer={name!r} "
            f"(Keras' algorithm and defaults; learning_rate= and weight_decay= to compile), or, for Keras' other "
            f"options, optimizer=lambda params: {cls.__module__}.{cls.__name__}(params, ...) with torch's keywords "
            f"({', '.join(KERAS_DEFAULTS[name])}); docs/migrating-from-keras.md, \"Optimizer defaults\"")


#: The implementation torch runs fastest for a named optimizer on a device type, measured with
#: torch 2.13 (CPU: one thread, the tiny MLP of `benchmarks/`: fused Adam 213 us a step against
#: 298 us for the default, Adagrad 206 against 242; fused SGD 182 against 174, and foreach no
#: faster than the default anywhere on CPU). "fused" and "foreach" compute the same update as the
#: default loop (the same algorithm, not an approximation); names not listed keep torch's default.
#: The classes fitkit writes itself (`keras_optimizers.ForeachOptimizer`) always run foreach.
FASTEST: dict[tuple[str, str], str] = {
    ("adam", "cpu"): "fused", ("adamw", "cpu"): "fused", ("adagrad", "cpu"): "fused",
    ("adam", "cuda"): "fused", ("adamw", "cuda"): "fused", ("sgd", "cuda"): "fused",
    ("adagrad", "cuda"): "foreach", ("rmsprop", "cuda"): "foreach",
}

#: The names HF's `adam_beta1`, `adam_beta2` and `adam_epsilon` apply to (the algorithms with those two betas and eps).
ADAM_FAMILY = ("adam", "adamw", "adamax", "nadam")

#: Named optimizers whose `eps` would vanish in float16 (1e-8 underflows): used with "16-true".
_EPS_FP16 = {"adam": 1e-4, "adamw": 1e-4, "rmsprop": 1e-4, "adagrad": 1e-4, "adamax": 1e-4, "nadam": 1e-4}


def build_optimizer(
    spec: Any, params: Iterable[torch.nn.Parameter], learning_rate: float | None, weight_decay: float | None,
    precision: str | int | None = None, module: torch.nn.Module | None = None,
    adam: tuple[float | None, float | None, float | None] = (None, None, None),
) -> torch.optim.Optimizer:
    """Build the optimizer over `params` (the parameters of the module as set up by Fabric).

    A name builds torch's class in the fastest exact implementation for the parameters' device
    (`FASTEST`; `module` tells whether some layer makes sparse gradients, which only the default
    implementation takes). A class, instance or callable is built as given. `adam`: HF's
    (adam_beta1, adam_beta2, adam_epsilon), each None for the name's default, for the names whose
    algorithm has them (Adam, AdamW, Adamax, NAdam)."""
    check_optimizer(spec)
    if isinstance(spec, torch.optim.Optimizer):
        return spec
    kwargs: dict[str, Any] = {}
    if weight_decay is not None:
        kwargs["weight_decay"] = weight_decay
    if isinstance(spec, (str, TorchDefaults)):
        return _named(spec, list(params), learning_rate, kwargs, precision, module, adam)
    if isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer):
        if learning_rate is not None:
            kwargs["lr"] = learning_rate
        return spec(params, **kwargs)
    optimizer = spec(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"the `optimizer` callable must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if learning_rate is not None:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
    return optimizer


def named_keywords(spec: str | TorchDefaults, learning_rate: float | None,
                   weight_decay: float | None = None) -> dict[str, Any]:
    """The keywords a named optimizer is built with: Keras 3's defaults for a name (a
    `TorchDefaults` name: torch's, with Keras' learning rate unless `learning_rate` is given),
    the rate and weight decay given over them::

        named_keywords("adagrad", None)   # {"lr": 1e-3, "initial_accumulator_value": 0.1, "eps": 1e-7}
    """
    name = spec.name if isinstance(spec, TorchDefaults) else spec.lower()
    if isinstance(spec, TorchDefaults):
        kwargs: dict[str, Any] = {"lr": OPTIMIZERS[name][1]}
    else:
        kwargs = dict(KERAS_DEFAULTS[name])
    if learning_rate is not None:
        kwargs["lr"] = learning_rate
    if weight_decay is not None:
        kwargs["weight_decay"] = weight_decay
        if name == "adam" and not isinstance(spec, TorchDefaults) and weight_decay:
            kwargs["decoupled_weight_decay"] = True  # Keras decays every optimizer's weights directly
    return kwargs


def _named(spec: str | TorchDefaults, params: list, learning_rate: float | None, given: dict[str, Any],
           precision: str | int | None, module: torch.nn.Module | None,
           adam: tuple[float | None, float | None, float | None] = (None, None, None)) -> torch.optim.Optimizer:
    """A named optimizer in the fastest exact implementation for the parameters' device."""
    name = spec.name if isinstance(spec, TorchDefaults) else spec.lower()
    cls = TORCH_CLASSES[name] if isinstance(spec, TorchDefaults) else OPTIMIZERS[name][0]
    kwargs = named_keywords(spec, learning_rate, given.get("weight_decay"))
    beta1, beta2, eps = adam
    if name in ADAM_FAMILY and (beta1 is not None or beta2 is not None):
        first, second = kwargs.get("betas", (0.9, 0.999))
        kwargs["betas"] = (first if beta1 is None else beta1, second if beta2 is None else beta2)
    if name in ADAM_FAMILY and eps is not None:
        kwargs["eps"] = eps
    if isinstance(spec, TorchDefaults):  # the Trainer's: the decay in the groups, the defaults the class's own
        params = _groups_with_decay(params, kwargs.pop("weight_decay", None))
        kwargs.update(spec.options)
    if str(precision) in ("16-true", "16") and name in _EPS_FP16:
        kwargs["eps"] = _EPS_FP16[name]  # pure float16 weights: keep the denominator representable
    kind = None if issubclass(cls, keras_optimizers.ForeachOptimizer) else fastest_implementation(name, params, module)
    if kind is not None:
        try:
            return cls(params, **kwargs, **{kind: True})
        except (RuntimeError, ValueError):  # a device or dtype this implementation does not take
            pass
    return cls(params, **kwargs)


def _groups_with_decay(params: list, decay: float | None) -> list:
    """`params` as groups that each carry their weight decay (the run's where a group has none),
    as the Trainer builds its groups: the optimizer's own default `weight_decay` (or the one HF's
    `optim_args` gives) then decays nothing."""
    if decay is None or not params:
        return params
    if not isinstance(params[0], dict):
        return [{"params": params, "weight_decay": decay}]
    return [group if "weight_decay" in group else {**group, "weight_decay": decay} for group in params]


def fastest_implementation(name: str, params: list, module: torch.nn.Module | None = None) -> str | None:
    """"fused", "foreach" or None (torch's default) for the optimizer `name` over `params`."""
    flat = [p for p in params if isinstance(p, torch.Tensor)] or [
        p for group in params if isinstance(group, dict) for p in group["params"]]
    if not flat or any(not p.is_floating_point() for p in flat):  # complex parameters: the default loop
        return None
    if module is not None and any(getattr(m, "sparse", False) is True for m in module.modules()):
        return None  # sparse embedding gradients: only the default loop takes them
    devices = {p.device.type for p in flat}
    return FASTEST.get((name, devices.pop())) if len(devices) == 1 else None


def implementation(optimizer: Any) -> str:
    """Which implementation `optimizer` (torch's, or Fabric's wrapper around it) runs:
    "fused", "foreach" or "for-loop" (torch's loop over tensors); "its own" for an optimizer
    without those options."""
    inner = torch_optimizer(optimizer)
    group = inner.param_groups[0] if getattr(inner, "param_groups", None) else {}
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    if "foreach" in group or "fused" in group:
        on_cuda = group.get("foreach") is None and all(p.is_cuda for p in group["params"])
        return "foreach" if on_cuda else "for-loop"  # torch's default: foreach for CUDA tensors
    return "its own"


def describe(optimizer: Any) -> str:
    """`Adam (fused)`: the class and its implementation, for `summary()` and logs."""
    inner = torch_optimizer(optimizer)
    return f"{type(inner).__name__} ({implementation(inner)})"


def optimizer_note(spec: Any, built: Any = None) -> str:
    """The summary's optimizer line: what was built, else what a name will build."""
    if built is not None:
        return f"Optimizer: {describe(built)}"
    if isinstance(spec, TorchDefaults):
        spec = spec.name
    if isinstance(spec, str):
        devices: dict[str, list[str]] = {}  # implementation -> the device types it is chosen on
        for (name, device), kind in FASTEST.items():
            if name == spec.lower():
                devices.setdefault(kind, []).append(device)
        where = "; ".join(f"{kind} on {', '.join(devices[kind])}" for kind in sorted(devices))
        where = f"{where}, torch's default elsewhere" if where else "torch's default"
        cls = OPTIMIZERS[spec.lower()][0]
        if issubclass(cls, keras_optimizers.ForeachOptimizer):
            where = "foreach"
        return f"Optimizer: {cls.__name__} ({where}; built at the first fit)"
    return f"Optimizer: {getattr(spec, '__name__', type(spec).__name__)} (as given)"


def build_scheduler(
    spec: Any, optimizer: torch.optim.Optimizer, num_training_steps: int, warmup_steps: int
):
    """The run's scheduler, or None when the rate is constant (nothing to do per step).

    `spec` is a name (HF's schedules: "constant", "linear", "cosine", each after a linear
    warm-up over `warmup_steps` that starts the first step at rate 0), a callable
    `(optimizer, num_training_steps) -> scheduler`, or a scheduler object built on the run's
    optimizer (e.g. a torch `ReduceLROnPlateau`, stepped with the metric after each evaluation)::

        build_scheduler("linear", opt, num_training_steps=100, warmup_steps=10)
        build_scheduler(lambda o, n: torch.optim.lr_scheduler.ReduceLROnPlateau(o), opt, 100, 0)
    """
    if callable(spec) and not isinstance(spec, str) and not hasattr(spec, "optimizer"):
        return spec(optimizer, num_training_steps)
    if not isinstance(spec, str):
        return _own_scheduler(spec, optimizer)
    if spec == "constant" and warmup_steps == 0:
        return None
    total = max(num_training_steps, 1)

    def factor(step: int) -> float:  # HF's `get_{constant,linear,cosine}_schedule_with_warmup`
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        if spec == "constant":
            return 1.0
        if spec == "linear":
            return max(0.0, (total - step) / max(1, total - warmup_steps))
        progress = (step - warmup_steps) / max(1, total - warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _own_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> Any:
    """A scheduler object the user built: it must drive the optimizer the run steps."""
    inner = torch_optimizer(scheduler.optimizer)
    if inner is not optimizer:
        raise ValueError(
            f"`lr_scheduler` is a {type(scheduler).__name__} built on another optimizer than the one this run steps: "
            "pass the optimizer it was built on to compile (optimizer=that_optimizer), or pass a factory "
            "lr_scheduler=lambda optimizer, num_training_steps: ... that builds it on the run's optimizer"
        )
    return scheduler


def is_plateau(scheduler: Any) -> bool:
    """True for a scheduler stepped with a metric after each evaluation, not per step."""
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
