"""Hugging Face `TrainingArguments` names and objects, mapped onto fitkit's.

`fit(args=transformers.TrainingArguments(...))` is read through `from_hf` (HF field names given
to `fit`, `compile` or `fitkit.TrainingArguments(...)` go through `fitkit.config.hf_names.hf_options`).
Whatever fitkit cannot honour is named in one warning, never dropped silently::

    import transformers
    hf = transformers.TrainingArguments(output_dir="out", per_device_train_batch_size=16,
                                        learning_rate=3e-4, eval_strategy="epoch", fp16=False)
    args = from_hf(hf)                       # a fitkit.TrainingArguments
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import warnings
from collections.abc import Collection, Iterator
from typing import Any

from fitkit.config.arguments import TrainingArguments
from fitkit.config.checks import SCHEDULERS
from fitkit.config.hf_distributed import accelerator_options, activation_options, fsdp_options, read_config
from fitkit.config.hf_names import HF_OPTIMIZERS, built_defaults, hf_defaults, hf_options, warn_unhonoured

#: HF fields read by a rule of their own rather than copied under the same name.
_TRANSLATED = ("fp16", "bf16", "disable_tqdm", "use_cpu", "lr_scheduler_type", "warmup_steps", "max_grad_norm",
               "metric_for_best_model", "report_to", "num_train_epochs", "optim", "output_dir", "fsdp_config",
               "fsdp", "deepspeed", "activation_checkpointing", "activation_checkpointing_kwargs", "accelerator_config",
               "torch_compile", "torch_compile_backend", "torch_compile_mode", "enable_jit_checkpoint",
               "tf32", "lr_scheduler_kwargs", "debug", "train_sampling_strategy")

#: HF fields transformers acts on itself when its arguments are built (torch's TF32 flags): in force for fitkit's run.
APPLIED_BY_TRANSFORMERS = ("tf32",)

#: HF fields the HF Trainer itself does not act on (the example scripts read them; the launcher sets local_rank;
#: transformers 5.23's Seq2SeqTrainer no longer reads `sortish_sampler`; the Trainer reads `optim_target_modules`
#: only for the optimizers fitkit does not build, GaLore's and APOLLO's, whose `optim` is warned about itself).
NOT_TRAINER_FIELDS = ("do_train", "do_eval", "do_predict", "local_rank", "sortish_sampler", "optim_target_modules")


@dataclasses.dataclass(frozen=True)
class HFSchedule:
    """`lr_scheduler=` for an HF `lr_scheduler_type` fitkit has no name for, or one given
    `lr_scheduler_kwargs`: transformers' `get_scheduler` with the Trainer's warm-up steps
    (`warmup`: steps, or below 1 a share of the training steps, as `get_warmup_steps` counts)::

        HFSchedule("cosine_with_restarts", 0.1, {"num_cycles": 2})(optimizer, 100)
    """

    name: str
    warmup: float
    kwargs: dict

    def __call__(self, optimizer: Any, num_training_steps: int) -> Any:
        import math

        from transformers import get_scheduler

        warmup = int(self.warmup) if self.warmup >= 1 else math.ceil(num_training_steps * self.warmup)
        return get_scheduler(self.name, optimizer, num_warmup_steps=warmup, num_training_steps=num_training_steps,
                             scheduler_specific_kwargs=self.kwargs)


def optimizer_spec(optim: str, optim_args: str | None = None) -> Any:
    """The optimizer for an HF `optim` name: a fitkit name built with torch's defaults (as HF's
    Trainer builds it, not Keras'), with the options `optim_args` gives that name, or torch's
    class for "adafactor"."""
    import torch

    from fitkit.adapters.optim_args import optim_options
    from fitkit.adapters.optimizers import TorchDefaults

    name = HF_OPTIMIZERS.get(str(optim))
    if name is None:
        raise ValueError(f"`optim`={optim!r} is not available in fitkit; valid names are: {', '.join(HF_OPTIMIZERS)} "
                         "(or pass an optimizer to compile)")
    options = optim_options(str(optim), optim_args)  # a malformed text fails whatever the name, as under the Trainer
    return torch.optim.Adafactor if name == "adafactor" else TorchDefaults(name, options)


#: The Trainer's defaults where fitkit's own differ (the optimizer, its rate and decay, the schedule,
#: clipping, the batches' order): what `hf_trainer=True` without transformers' arguments starts from.
TRAINER_DEFAULTS: dict[str, Any] = {"optim": "adamw_torch", "learning_rate": 5e-5, "weight_decay": 0.0,
                                    "lr_scheduler": "linear", "max_grad_norm": 1.0, "data_order": "trainer",
                                    "logging_nan_inf_filter": True, "restore_callback_states_from_checkpoint": False}


def trainer_defaults(run: Any, given: Collection[str], compile_optimizer: Any) -> Any:
    """`run` (with `hf_trainer=True`, not built from a `transformers.TrainingArguments`) with the
    Trainer's defaults (`TRAINER_DEFAULTS`) in the fields nobody gave (`given`: the fields set by
    compile, `args=` or fit). `optim` only when compile kept its default optimizer::

        trainer_defaults(TrainingArguments(hf_trainer=True), {"hf_trainer"}, "adam").lr_scheduler  # "linear"
    """
    from fitkit.config.option_merge import DEFAULT_OPTIMIZER

    values = {k: v for k, v in TRAINER_DEFAULTS.items() if k not in given}
    if compile_optimizer != DEFAULT_OPTIMIZER:
        values.pop("optim", None)
    return run.settled(**values) if values else run


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def from_hf(hf_args: Any) -> Any:
    """A fitkit `TrainingArguments` from a `transformers.TrainingArguments` (or a subclass, such
    as `Seq2SeqTrainingArguments`): its values under fitkit's names; every field fitkit cannot
    honour that holds another value than a default-built instance of its class is named in one
    warning."""
    cls: Any = type(hf_args)
    defaults, mine = built_defaults(cls), set(TrainingArguments.__dataclass_fields__)
    values = {name: _plain(getattr(hf_args, name)) for name in defaults}
    options: dict[str, Any] = {k: v for k, v in values.items() if k in mine and k not in _TRANSLATED}
    ignored = [k for k, v in values.items() if k not in mine and k not in _TRANSLATED and k not in NOT_TRAINER_FIELDS
               and not _same_value(v, _plain(defaults[k]))]
    options["output_dir"] = values.get("output_dir") or "trainer_output"
    options["data_order"] = "trainer"  # the Trainer's batches and global random draws (`data_seed` is copied)
    epochs = float(values.get("num_train_epochs", 3.0))
    options["num_train_epochs"] = int(epochs) if epochs.is_integer() else epochs
    scheduler = _plain(values.get("lr_scheduler_type", "linear"))
    warmup = values.get("warmup_steps", 0) or 0
    kwargs = values.get("lr_scheduler_kwargs") or None
    if scheduler in SCHEDULERS and not kwargs:
        options["lr_scheduler"] = scheduler
        options["warmup_ratio" if 0 < warmup < 1 else "warmup_steps"] = warmup if 0 < warmup < 1 else int(warmup)
    else:  # the Trainer's own builder: every schedule it names, with its keywords (warm-up included)
        options["lr_scheduler"] = HFSchedule(str(scheduler), warmup, dict(kwargs or {}))
    options["max_grad_norm"] = values.get("max_grad_norm") or None
    options["metric_for_best_model"] = _val_name(values.get("metric_for_best_model"))
    report_to = values.get("report_to") or []
    options["report_to"] = "none" if report_to in ([], "none", ["none"]) else report_to
    optim = str(_plain(values.get("optim", "adamw_torch")))
    if optim in HF_OPTIMIZERS:
        options["optim"] = optim
    else:
        ignored.append(f"optim={optim!r}")
        options.pop("optim_args", None)  # that optimizer's options: not built either
    if any(values.get(k) for k in ("torch_compile", "torch_compile_backend", "torch_compile_mode")):
        # torch.compile with HF's backend and mode (either implies torch_compile, HF fills in the backend)
        options["jit_compile"] = {k: values[f"torch_compile_{k}"] for k in ("backend", "mode")
                                  if values.get(f"torch_compile_{k}") is not None} or True
    options["debug"], unread_debug = _debug(values.get("debug"))
    ignored += [f"debug={name!r}" for name in unread_debug]
    options["train_sampling_strategy"] = _plain(values.get("train_sampling_strategy", "random"))
    if values.get("enable_jit_checkpoint"):  # HF's checkpoint on SIGTERM: fitkit's save_on_sigterm
        options["save_on_sigterm"] = True
    distributed, unread = distributed_options(values, hf_args)
    options.update(distributed)
    ignored += [f"fsdp_config[{key!r}]" for key in unread]
    accelerator, unread = accelerator_options(values.get("accelerator_config"),
                                            int(values.get("gradient_accumulation_steps") or 1))
    options.update(accelerator)
    ignored += [f"accelerator_config[{key!r}]" for key in unread]
    translated, _ = hf_options({k: values[k] for k in ("fp16", "bf16", "disable_tqdm", "use_cpu") if k in values}, mine)
    options.update(translated)
    options["hf_trainer"] = True  # the Trainer's log history, printed as its printer does under disable_tqdm
    warn_unhonoured(ignored, "TrainingArguments fields", stacklevel=5)
    return TrainingArguments(**options)


def distributed_options(values: dict[str, Any], hf_args: Any = None) -> tuple[dict[str, Any], list[str]]:
    """fitkit's options for HF's `fsdp`, `fsdp_config`, `deepspeed` and `activation_checkpointing*`
    (`values`: the fields by name), and the `fsdp_config` keys that cannot apply. `hf_args` (the
    arguments object) fills DeepSpeed's "auto" values; without it the config is taken as it is."""
    fsdp, deepspeed = values.get("fsdp"), values.get("deepspeed")
    if fsdp and deepspeed:
        raise ValueError("`fsdp` and `deepspeed` are both set: pass only one of them (each is a strategy)")
    options, unread = fsdp_options(fsdp, values.get("fsdp_config"))
    if deepspeed:
        from fitkit.config.hf_deepspeed import deepspeed_config
        options["strategy"] = deepspeed_config(deepspeed, hf_args) if hf_args is not None else read_config(
            deepspeed, "deepspeed")
    options.update(activation_options(values.get("activation_checkpointing"),
                                      values.get("activation_checkpointing_kwargs")))
    return options, unread


def _debug(debug: Any) -> tuple[str, list[str]]:
    """HF's `debug` (its options as text, or the list HF's `__post_init__` makes) as fitkit's field,
    and the options that cannot apply here ("tpu_metrics_debug": XLA's metrics)."""
    names = debug.split() if isinstance(debug, str) else [str(_plain(d)) for d in debug or []]
    return " ".join(n for n in names if n != "tpu_metrics_debug"), [n for n in names if n == "tpu_metrics_debug"]


def _same_value(value: Any, default: Any) -> bool:
    """Whether a field holds its default (None and an empty list or dict count as the same)."""
    empty: tuple[Any, ...] = (None, [], {}, "")
    try:
        return bool(value == default) or (value in empty and default in empty)
    except Exception:  # noqa: BLE001 - a value whose == is not a bool
        return value is default


#: HF fields read under another fitkit name (the others keep theirs).
_FITKIT_NAME = {"fp16": "precision", "bf16": "precision", "disable_tqdm": "verbose", "use_cpu": "accelerator",
                "lr_scheduler_type": "lr_scheduler"}


_DISTRIBUTED = ("fsdp", "fsdp_config", "deepspeed", "activation_checkpointing", "activation_checkpointing_kwargs")


def hf_explicit(hf_args: Any) -> set[str]:
    """The fitkit names of the fields a `transformers.TrainingArguments` sets to something other
    than HF's defaults (what `fitkit.config.option_merge` counts as given by `args=`)."""
    defaults, mine = hf_defaults(), set(TrainingArguments.__dataclass_fields__)
    out = set()
    for name, default in defaults.items():
        if not hasattr(hf_args, name):
            continue
        value = _plain(getattr(hf_args, name))
        try:
            same = value == _plain(default) or (value in (None, [], "", "none", ["none"]) and _plain(default) in (
                None, [], "", "none", ["none"]))  # `debug`: "" made [] by HF
        except Exception:  # noqa: BLE001 - a value whose == is not a bool
            same = False
        if same or (name == "disable_tqdm" and not value) or (name == "run_name" and value == hf_args.output_dir):
            continue  # filled in by HF's __post_init__, not given
        if name == "warmup_steps":
            out.add("warmup_ratio" if 0 < (value or 0) < 1 else "warmup_steps")
        if name in _DISTRIBUTED:
            out.update(distributed_options({k: getattr(hf_args, k, None) for k in _DISTRIBUTED}, hf_args)[0])
        if name == "accelerator_config":
            out.update(accelerator_options(value, int(getattr(hf_args, "gradient_accumulation_steps", 1) or 1))[0])
        target = _FITKIT_NAME.get(name, name)
        if target in mine:
            out.add(target)
    return out


def _val_name(metric: str | None) -> str | None:
    """HF's `metric_for_best_model` always names an evaluation value: fitkit's `val_*` name. None
    stays None: the Trainer then tracks no best model (nor keeps a best checkpoint from rotation)."""
    if not metric:
        return None
    if metric.startswith("eval_"):
        return "val_" + metric[len("eval_"):]
    return metric if metric.startswith("val_") else "val_" + metric


def is_hf_arguments(args: Any) -> bool:
    """True for a `transformers.TrainingArguments` (or a subclass of it)."""
    return any(cls.__module__.startswith("transformers") and cls.__name__ == "TrainingArguments"
               for cls in type(args).__mro__)


def run_optimizer(spec: Any, args: Any) -> Any:
    """The optimizer a fit builds: `args.optim` (an HF name) when set, else compile's `spec`."""
    return optimizer_spec(args.optim, getattr(args, "optim_args", None)) if getattr(args, "optim", None) else spec


@contextlib.contextmanager
def neftune_noise(module: Any, args: Any) -> Iterator[None]:
    """HF's `neftune_noise_alpha` while training runs: transformers' NEFTune hook on the input
    embeddings of `module` (a transformers model), noise added in training mode only, removed
    when training ends, as the Trainer activates and removes it."""
    alpha = getattr(args, "neftune_noise_alpha", None)
    get_embeddings = getattr(module, "get_input_embeddings", None)
    if alpha is None or not callable(get_embeddings):
        yield
        return
    from transformers.integrations.neftune import neftune_post_forward_hook

    embeddings = get_embeddings()
    embeddings.neftune_noise_alpha = alpha
    handle = embeddings.register_forward_hook(neftune_post_forward_hook)
    try:
        yield
    finally:
        handle.remove()
        del embeddings.neftune_noise_alpha


def full_determinism() -> None:
    """HF's `full_determinism`: torch's deterministic algorithms only, cuDNN deterministic and
    not benchmarking, and the environment CUDA's libraries read for it (set for the process, as
    the Trainer sets them; the seeding is fit's own)."""
    import os

    import torch

    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def prepare_module(module: Any, args: Any) -> None:
    """At the start of a fit: `full_determinism`; `debug="underflow_overflow"`: transformers'
    `DebugUnderflowOverflow` on the module (an inf or nan in a forward: the frames before it printed,
    then a ValueError), as the Trainer attaches it; a warning for `label_names` fitkit does not take the target from;
    `gradient_checkpointing=True`: `module.gradient_checkpointing_enable()` (a Hugging Face
    model's method); a module without it gets a warning, and trains as it is."""
    names = getattr(args, "label_names", None)
    if names:
        from fitkit.common.options import LABEL_KEYS

        if len(names) > 1 or names[0] not in LABEL_KEYS:
            warnings.warn(f"`label_names`={names!r} is not honoured: fitkit takes the target from the first of the "
                          f"keys {list(LABEL_KEYS)} in a dict batch; rename the label key, or pass (inputs, target) "
                          "batches", UserWarning, stacklevel=3)
    if getattr(args, "full_determinism", False):
        full_determinism()
    if "underflow_overflow" in str(getattr(args, "debug", "") or "").split():
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(module)  # its hooks stay on the module, as the Trainer leaves them
    use_cache, config = getattr(args, "use_cache", None), getattr(module, "config", None)
    if use_cache is not None and config is not None and hasattr(config, "use_cache"):
        config.use_cache = use_cache  # as the Trainer sets it
    if not getattr(args, "gradient_checkpointing", False):
        return
    enable = getattr(module, "activation_checkpointing_enable", None)
    if callable(enable):  # as the Trainer calls it: `every_n_layers` and `offload` are its own, the rest torch's
        if not getattr(module, "is_gradient_checkpointing", False):
            kwargs = dict(getattr(args, "gradient_checkpointing_kwargs", None) or {})
            layers, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
            enable(activation_checkpointing_kwargs=kwargs or None, every_n_layers=layers, offload=offload)
        return
    enable = getattr(module, "gradient_checkpointing_enable", None)  # a model with the older name alone
    if callable(enable):
        if not getattr(module, "is_gradient_checkpointing", False):
            given = getattr(args, "gradient_checkpointing_kwargs", None)
            enable(**({"gradient_checkpointing_kwargs": given} if given else {}))
    else:
        warnings.warn(f"`gradient_checkpointing`=True is ignored: {type(module).__name__} has no "
                      "gradient_checkpointing_enable() method (wrap blocks in torch.utils.checkpoint yourself)",
                      UserWarning, stacklevel=3)
