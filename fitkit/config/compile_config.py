"""`CompileConfig`: what `Model.compile` was given, validated, with a JSON round trip.

    config = CompileConfig.build("adam", "cross_entropy", ["accuracy"], learning_rate=1e-3)
    config.arguments(epochs=3)                     # TrainingArguments for a fit
    text = config.to_json()                        # saved by Model.save
    CompileConfig.from_json(text)                  # the same configuration (names only), else None
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fitkit.adapters.keras_metrics import Weighted
from fitkit.adapters.losses import build_loss
from fitkit.adapters.metric_specs import check_metrics, metric_name, weighted_metrics
from fitkit.adapters.optimizers import check_optimizer
from fitkit.adapters.outputs import LossParts, OutputMetric
from fitkit.common.options import FIT_DEFAULTS, check_output_dir
from fitkit.config.arguments import TrainingArguments, _jsonable
from fitkit.config.hf_arguments import from_hf, hf_explicit, is_hf_arguments, trainer_defaults


@dataclass(frozen=True)
class CompileConfig:
    """The optimizer, loss and metrics as given (names, classes, objects or callables), the
    other compile options, and what was built from them: the loss function and the
    `TrainingArguments` the options make (the defaults of every fit)."""

    optimizer: Any = "adam"
    loss: Any = None
    metrics: list = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    loss_fn: Any = field(default=None, compare=False, repr=False)
    args: TrainingArguments = field(default_factory=TrainingArguments, compare=False, repr=False)
    loss_parts: Any = field(default=None, compare=False, repr=False)
    #: the options `args` was built from: `options` without compile's own `loss_weights` and
    #: `run_eagerly` (`run_eagerly=True` as `jit_compile=False`)
    argument_options: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def logged_metrics(self) -> list:
        """The metric specs a run logs: the compiled metrics, then the per-output losses
        (`<output>_loss`, a `LossParts`) when the loss turns out to have several outputs."""
        return self.metrics if self.loss_parts is None else [*self.metrics, self.loss_parts]

    @classmethod
    def build(cls, optimizer: Any = "adam", loss: Any = None, metrics: Sequence | None = None,
              **options: Any) -> CompileConfig:
        """Validate everything now (unknown names, bad options and device settings raise here)."""
        from fitkit.config.devices import check_devices

        check_optimizer(optimizer)
        given = dict(options)
        loss_fn = build_loss(loss, options.pop("loss_weights", None))  # kept in `options` for Model.save
        _run_eagerly(options)
        specs = check_metrics(metrics)
        if "weighted_metrics" in options:  # kept in `options` for Model.save; a built config's metrics hold them too
            specs = [spec for spec in specs if not _is_weighted(spec)]
            specs += weighted_metrics(options.pop("weighted_metrics"), specs)
        _refuse_repeated_names(specs)
        args = TrainingArguments.from_options(**options)
        check_devices(args)
        parts = LossParts(loss_fn) if loss_fn is not None else None
        return cls(optimizer, loss, specs, given, loss_fn, args, parts, options)

    def arguments(self, args: TrainingArguments | None = None, **options: Any) -> TrainingArguments:
        """The arguments of a fit: compile's options, `args` over them and the options given over
        both (`fitkit.config.option_merge`: conflicting values are named in a warning). None for fit's
        own `batch_size`, `epochs`, `shuffle` and `max_steps` means "not given"; any other option
        set to None is the value None. The devices and `output_dir` are checked here, before anything runs."""
        from fitkit.config.devices import check_devices
        from fitkit.config.option_merge import canonical_names, explicit_fields, merge

        explicit: set[str] = set()
        hf_given = args is not None and not isinstance(args, TrainingArguments) and is_hf_arguments(args)
        if hf_given:
            explicit = hf_explicit(args)
            args = from_hf(args)  # a transformers.TrainingArguments: its values under fitkit's names
            if "strategy" in explicit and "strategy" in self.argument_options and self.args.strategy != args.strategy:
                raise ValueError(f"compile(strategy={self.args.strategy!r}) and the Hugging Face arguments' strategy "
                                 f"({args.strategy!r}, from their `fsdp` or `deepspeed`) disagree: drop one of them")
        elif isinstance(args, TrainingArguments):
            explicit = explicit_fields(args)
        if args is not None and not isinstance(args, TrainingArguments):
            raise TypeError(f"`args` must be a fitkit.TrainingArguments, got {type(args).__name__}: build one with "
                            "TrainingArguments(...), or pass the options as keywords (fit(x, y, epochs=3, ...))")
        given = {k: v for k, v in options.items() if v is not None or k not in FIT_DEFAULTS}
        if args is None:
            run = self.args.replace(**given) if given else self.args
        else:  # compile < args= < fit's keywords, conflicts named (fitkit.config.option_merge)
            run = merge(self.args, self.argument_options, self.optimizer, args, explicit, given)
        if run.hf_trainer and not hf_given:  # the Trainer face chosen by name: the Trainer's defaults
            named = canonical_names({**self.argument_options, **given}).keys() | explicit
            run = trainer_defaults(run, named, self.optimizer)
        check_devices(run)
        check_output_dir(run)
        return run

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able: names stay names; a class, object or callable becomes `{"object": its name}`."""
        return {"optimizer": _spec(self.optimizer), "loss": _spec(self.loss),
                "metrics": [_metric_spec(m) for m in self.metrics if not _is_weighted(m)],  # those: in options
                "options": {k: _spec(v) if _holds_callable(v) or k == "weighted_metrics" else _jsonable(v)
                            for k, v in self.options.items()}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> CompileConfig | None:
        """The configuration `to_json` wrote, built again; None when it held objects or callables
        (their names alone cannot rebuild them: pass them to `compile` again)."""
        data = json.loads(text)
        if not _names_only(data):
            return None
        return cls.build(data["optimizer"], data["loss"], _metrics_from(data["metrics"]), **data["options"])


def _run_eagerly(options: dict[str, Any]) -> None:
    """Keras' `run_eagerly` (removed from `options`): PyTorch runs eagerly already, as Keras does
    on its torch backend, so False changes nothing; True turns `jit_compile` off, with Keras'
    warning when it was asked for."""
    if "run_eagerly" not in options:
        return
    value = options.pop("run_eagerly")
    if not isinstance(value, bool):
        raise TypeError(f"`run_eagerly` must be True or False, got {value!r}")
    if value:
        if options.get("jit_compile", "auto") not in ("auto", False, None):
            warnings.warn("`run_eagerly=True` turns `jit_compile` off (as Keras does): the module is not compiled",
                          UserWarning, stacklevel=4)
        options["jit_compile"] = False


def _spec(value: Any) -> Any:
    """A name (or None) as is; a list or dict of them (one per output) element-wise; anything
    else `{"object": its name}`."""
    if isinstance(value, (list, tuple)):
        return [_spec(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _spec(v) for k, v in value.items()}
    return value if value is None or isinstance(value, str) else {"object": _jsonable(value)}


def _is_weighted(spec: Any) -> bool:
    return isinstance(spec.spec if isinstance(spec, OutputMetric) else spec, Weighted)


def _metric_spec(spec: Any) -> Any:
    if isinstance(spec, OutputMetric):
        return {"output": spec.key, "metric": _spec(spec.spec)}
    return _spec(spec)


def _metrics_from(saved: list) -> Any:
    """The `metrics` argument that gives the saved specs back (a dict by output when per output)."""
    if not any(isinstance(m, dict) and "output" in m for m in saved):
        return saved
    return [OutputMetric(m["metric"], m["output"]) if isinstance(m, dict) else m for m in saved]


def _is_name(value: Any) -> bool:
    """A name or None, or a list / dict of them (a per-output loss)."""
    if isinstance(value, (list, tuple)):
        return all(_is_name(v) for v in value)
    if isinstance(value, dict):
        return set(value) != {"object"} and all(_is_name(v) for v in value.values())
    return value is None or isinstance(value, str)


def _holds_callable(value: Any) -> bool:
    """A callable, or a dict holding one (`jit_compile={"backend": fn}`): saved by name only."""
    return callable(value) or (isinstance(value, dict) and any(callable(v) for v in value.values()))


def _names_only(data: dict[str, Any]) -> bool:
    return isinstance(data["optimizer"], (str, type(None))) and _is_name(data["loss"]) and all(
        isinstance(m, str) or (isinstance(m, dict) and isinstance(m.get("metric"), str)) for m in data["metrics"]) and not any(
        _holds_object(v) for v in data["options"].values())  # a callable option, also inside a dict or list


def _holds_object(value: Any) -> bool:
    """True when `value` (JSON) holds an object saved by name (`{"object": ...}`), at any depth."""
    if isinstance(value, dict):
        return set(value) == {"object"} or any(_holds_object(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_object(v) for v in value)
    return False


def _refuse_repeated_names(specs: list) -> None:
    """Two metrics logged under one name would keep one value: refused, naming the fix."""
    seen: dict[str, Any] = {}
    for spec in specs:
        if isinstance(spec, LossParts):
            continue
        name = metric_name(spec)
        if name in seen:
            raise ValueError(f"`metrics`: two metrics are logged as {name!r} ({seen[name]!r} and {spec!r}), and one "
                             "would hide the other: give each its own `name=` (Keras' metric objects, "
                             "`keras.metrics.F1Score(name='f1_macro')`), or drop one")
        seen[name] = spec
