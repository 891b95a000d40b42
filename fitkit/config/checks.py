"""The checks of every `TrainingArguments` field, run once when one is built: the tables of
allowed values and ranges, and the checks that read them. A bad value is a `ValueError` naming
the field and the fix (with the closest name for a misspelt choice)::

    check_and_convert(args)   # by TrainingArguments.__post_init__; "1e-3" -> 0.001, a Path -> str
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from fitkit.common.options import did_you_mean, parse_number
from fitkit.config.jit_compile import jit_problem

STRATEGIES = ("no", "steps", "epoch")
SAVE_STRATEGIES = ("no", "steps", "epoch", "best")
SCHEDULERS = ("constant", "linear", "cosine")
PRECISIONS = (
    "32-true", "32", "bf16-mixed", "bf16-true", "bf16", "16-mixed", "16-true", "16",
    "64-true", "64", "transformer-engine",
)
VERBOSITY = (0, 1, 2, "auto")
LOG_LEVELS = ("passive", "debug", "info", "warning", "error", "critical")
FSDP_SHARDING = ("full", "hybrid")
#: `data_order`: fitkit's own (Keras' way), or the batches and global draws of transformers.Trainer.
DATA_ORDERS = ("fitkit", "trainer")
#: HF's `train_sampling_strategy` names fitkit builds (the training order, and the evaluation's with grouping).
SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length", "batch_rebalance")
#: HF's `debug` options fitkit takes (its other, "tpu_metrics_debug", is XLA's).
DEBUG_OPTIONS = ("underflow_overflow",)

#: Integer fields: the smallest value allowed, and whether None is allowed too.
_INTS: dict[str, tuple[int, bool]] = {
    "per_device_train_batch_size": (1, False),
    "per_device_eval_batch_size": (1, True), "gradient_accumulation_steps": (1, False), "warmup_steps": (0, False),
    "save_total_limit": (1, True),
    "num_nodes": (1, False), "steps_per_epoch": (1, True), "validation_steps": (1, True), "validation_freq": (1, False),
    "dataloader_num_workers": (0, False), "eval_accumulation_steps": (1, True),
    "generation_max_length": (1, True), "generation_num_beams": (1, True),
    "dataloader_prefetch_factor": (1, True), "torch_empty_cache_steps": (1, True), "ddp_timeout": (1, True), "ddp_bucket_cap_mb": (1, True),
}
#: Float fields: the test of the value, what to pass instead, and whether None is allowed too.
_FLOATS: dict[str, tuple[Callable[[float], bool], str, bool]] = {
    "learning_rate": (lambda v: v >= 0, "pass a finite number >= 0", True),
    "weight_decay": (lambda v: v >= 0, "pass a finite number >= 0", True),
    "max_grad_norm": (lambda v: v > 0, "pass a number > 0, or None to skip clipping", True),
    "warmup_ratio": (lambda v: 0 <= v < 1, "pass a fraction in [0, 1)", False),
    "adam_beta1": (lambda v: 0 <= v < 1, "pass a number in [0, 1), or None for the optimizer's default", True),
    "adam_beta2": (lambda v: 0 <= v < 1, "pass a number in [0, 1), or None for the optimizer's default", True),
    "adam_epsilon": (lambda v: v >= 0, "pass a number >= 0, or None for the optimizer's default", True),
    "label_smoothing_factor": (lambda v: 0 <= v < 1, "pass a fraction in [0, 1) (0: no smoothing)", False),
    "neftune_noise_alpha": (lambda v: v > 0, "pass a number > 0 (NEFTune's alpha, 5 in its paper), or None", True),
}
#: Bool fields, and whether None is allowed too.
_BOOLS: dict[str, bool] = {
    "shuffle": False, "logging_first_step": False, "load_best_model_at_end": False, "greater_is_better": True,
    "save_on_sigterm": True, "save_async": False, "skip_memory_metrics": False, "log_on_each_node": False,
    "fsdp_full_checkpoint": False, "fsdp_load_once": False, "fsdp_reshard_after_forward": False,
    "fsdp_cpu_offload": False, "fsdp_activation_checkpointing": False, "dataloader_pin_memory": False, "gradient_checkpointing": True, "prefetch": False,
    "tune_cpu_allocator": False, "predict_with_generate": False, "hf_trainer": False, "ignore_data_skip": False,
    "dataloader_drop_last": False, "logging_nan_inf_filter": False, "eval_on_start": False,
    "prediction_loss_only": False, "use_cache": True, "dataloader_persistent_workers": False,
    "dataloader_in_order": False, "ddp_find_unused_parameters": True, "ddp_broadcast_buffers": True,
    "ddp_static_graph": True, "full_determinism": False, "save_only_model": False,
    "bf16_full_eval": False, "fp16_full_eval": False, "eval_do_concat_batches": False, "batch_eval_metrics": False,
    "eval_use_gather_object": False, "restore_callback_states_from_checkpoint": False,
    "average_tokens_across_devices": False, "auto_find_batch_size": False, "save_on_each_node": False,
    "split_batches": False, "even_batches": False, "use_seedable_sampler": False, "sync_each_batch": False,
}
#: String fields taking one of a set of names, and whether None is allowed too.
_CHOICES: dict[str, tuple[tuple, bool]] = {
    "eval_strategy": (STRATEGIES, True), "logging_strategy": (STRATEGIES, False),
    "save_strategy": (SAVE_STRATEGIES, False), "log_level": (LOG_LEVELS, False),
    "log_level_replica": (LOG_LEVELS, False), "fsdp_sharding": (FSDP_SHARDING, False),
    "data_order": (DATA_ORDERS, False),
    "train_sampling_strategy": (SAMPLING_STRATEGIES, False), "debug": (("", *DEBUG_OPTIONS), False),
}
#: HF's `include_num_input_tokens_seen`: its names (True is "all", False "no").
TOKENS_SEEN = ("no", "all", "non_padding")


#: Fields whose checks read no other field: a copy of checked arguments that changes only these
#: (a search trial's learning rate and output folder, say) checks only them (`check_fields`).
ALONE = frozenset({*_INTS, *_FLOATS, "shuffle", "num_train_epochs", "output_dir", "seed", "verbose"})


def check_fields(args: Any, names: Iterable[str]) -> None:
    """`check_and_convert` of `names` alone (all in `ALONE`), for a copy of arguments whose other
    fields were checked already: the same conversions and the same errors."""
    fail, set_value = _actions(args)
    for name in names:
        if name in _INTS:
            _check_int(args, name, fail, set_value)
        elif name in _FLOATS:
            _check_float(args, name, fail, set_value)
        elif name == "shuffle":
            _check_bool(args, name, fail)
        elif name == "num_train_epochs":
            _check_epochs(args, fail, set_value)
        elif name == "output_dir":
            _check_output_dir(args, fail, set_value)
        elif name == "seed":
            _check_seed(args, fail, set_value)
        else:
            _check_verbose(args, fail)


def check_and_convert(args: Any) -> None:
    """Check the type and range of every field; numbers given as text ("1e-3", "3") and paths
    given as `os.PathLike` are converted (the dataclass is frozen: `object.__setattr__`)."""
    fail, set_value = _actions(args)
    for name in _INTS:
        _check_int(args, name, fail, set_value)
    steps = parse_number(args.max_steps, int)
    if steps is None or not (steps == -1 or steps > 0):
        fail("max_steps", "pass a positive number of optimizer steps, or -1 to train by epochs")
    set_value("max_steps", steps)
    for name in _FLOATS:
        _check_float(args, name, fail, set_value)
    for name in _BOOLS:
        _check_bool(args, name, fail)
    for name, (choices, optional) in _CHOICES.items():
        value = getattr(args, name)
        if not ((isinstance(value, str) and value in choices) or (optional and value is None)):
            fail(name, f"{did_you_mean(value, choices)}use one of {list(choices)}")
    tokens = args.include_num_input_tokens_seen
    if isinstance(tokens, bool):
        set_value("include_num_input_tokens_seen", "all" if tokens else "no")
    elif tokens not in TOKENS_SEEN:
        fail("include_num_input_tokens_seen", f"{did_you_mean(tokens, TOKENS_SEEN)}use one of {list(TOKENS_SEEN)}, "
             "True or False")
    _check_fractions(args, fail, set_value)
    _check_the_others(args, fail, set_value)


_Fail = Callable[[str, str], NoReturn]
_Set = Callable[[str, Any], None]


def _actions(args: Any) -> tuple[_Fail, _Set]:
    """What the checks of `args` call: raise the error naming a field and the fix, and set a
    converted value (the dataclass is frozen)."""
    def fail(name: str, fix: str) -> NoReturn:
        raise ValueError(f"`{name}`={getattr(args, name)!r} is invalid: {fix}")

    def set_value(name: str, value: Any) -> None:
        object.__setattr__(args, name, value)

    return fail, set_value


def _check_int(args: Any, name: str, fail: _Fail, set_value: _Set) -> None:
    least, optional = _INTS[name]
    value = getattr(args, name)
    if value is None and optional:
        return
    number = parse_number(value, int)
    if number is None or number < least:
        fail(name, f"pass an integer {'> 0' if least == 1 else f'>= {least}'}" + (", or None" if optional else ""))
    set_value(name, number)


def _check_float(args: Any, name: str, fail: _Fail, set_value: _Set) -> None:
    test, fix, optional = _FLOATS[name]
    value = getattr(args, name)
    if value is None and optional:
        return
    number = parse_number(value, float)
    if number is None or not test(number):
        fail(name, fix)
    set_value(name, number)


def _check_bool(args: Any, name: str, fail: _Fail) -> None:
    optional, value = _BOOLS[name], getattr(args, name)
    if not (isinstance(value, bool) or (optional and value is None)):
        fail(name, "pass True or False" + (" (or None for the default)" if optional else ""))


def _check_epochs(args: Any, fail: _Fail, set_value: _Set) -> None:
    epochs = parse_number(args.num_train_epochs, float)
    if epochs is None or epochs <= 0:
        fail("num_train_epochs", "pass a number of epochs > 0 (a float such as 1.5 trains part of the last one)")
    set_value("num_train_epochs", int(epochs) if epochs == int(epochs) else epochs)


def _check_output_dir(args: Any, fail: _Fail, set_value: _Set) -> None:
    if isinstance(args.output_dir, os.PathLike):  # a path may be a pathlib.Path
        set_value("output_dir", os.fspath(args.output_dir))
    if not isinstance(args.output_dir, str) or not args.output_dir:
        fail("output_dir", "pass the path of a folder (a str); it is created when missing")


def _check_seed(args: Any, fail: _Fail, set_value: _Set) -> None:
    if args.seed is not None:
        seed = parse_number(args.seed, int)
        if seed is None:
            fail("seed", "pass an integer or None")
        set_value("seed", seed)


def _check_verbose(args: Any, fail: _Fail) -> None:
    if isinstance(args.verbose, bool) or args.verbose not in VERBOSITY:
        fail("verbose", "use 0 (silent), 1 (progress bar), 2 (a line per epoch) or 'auto'")


def _whole_or_fraction(value: Any, fraction: bool) -> int | float | None:
    """An int >= 1 as an int (`3.0` too), or (with `fraction`) a float in (0, 1) as is; else None."""
    number = parse_number(value, float)
    if number is None or number <= 0:
        return None
    if number >= 1:
        return int(number) if number == int(number) else None
    return number if fraction else None


def _check_fractions(args: Any, fail: _Fail, set_value: _Set) -> None:
    """HF's numbers that may be fractions: `logging_steps` / `eval_steps` / `save_steps` below 1
    are a share of `max_steps`; `num_train_epochs` may be a float (1.5 epochs); `eval_delay` >= 0."""
    for name, optional in (("logging_steps", False), ("eval_steps", True), ("save_steps", False)):
        value = getattr(args, name)
        if value is None and optional:
            continue
        number = _whole_or_fraction(value, fraction=True)
        if number is None:
            fail(name, "pass an integer > 0 (steps) or a fraction in (0, 1) of `max_steps`"
                 + (", or None" if optional else ""))
        set_value(name, number)
    _check_epochs(args, fail, set_value)
    delay = parse_number(args.eval_delay, float)
    if delay is None or delay < 0:
        fail("eval_delay", "pass the epochs (eval_strategy='epoch') or steps ('steps') to wait, a number >= 0")
    set_value("eval_delay", int(delay) if delay == int(delay) else delay)


def _check_the_others(args: Any, fail: _Fail, set_value: _Set) -> None:
    _check_output_dir(args, fail, set_value)
    if isinstance(args.resume_from_checkpoint, os.PathLike):
        set_value("resume_from_checkpoint", os.fspath(args.resume_from_checkpoint))
    if not (args.resume_from_checkpoint is None or isinstance(args.resume_from_checkpoint, (bool, str))):
        fail("resume_from_checkpoint", "pass True (the last checkpoint in `output_dir`) or a checkpoint's path")
    if args.metric_for_best_model is None:
        if args.load_best_model_at_end or args.save_strategy == "best":
            fail("metric_for_best_model", "`load_best_model_at_end` and save_strategy='best' need the name of a "
                 "logged value, e.g. 'val_loss' or 'val_accuracy'")
    elif not isinstance(args.metric_for_best_model, str) or not args.metric_for_best_model:
        fail("metric_for_best_model", "pass the name of a logged value, e.g. 'val_loss' or 'val_accuracy', or None "
             "to track no best model")
    scheduler_object = hasattr(args.lr_scheduler, "optimizer") and callable(getattr(args.lr_scheduler, "step", None))
    if not (callable(args.lr_scheduler) or scheduler_object
            or (isinstance(args.lr_scheduler, str) and args.lr_scheduler in SCHEDULERS)):
        fail("lr_scheduler", f"{did_you_mean(args.lr_scheduler, SCHEDULERS)}use one of {list(SCHEDULERS)} or a "
             "callable (optimizer, num_training_steps) -> scheduler")
    _check_verbose(args, fail)
    if args.precision is not None and (isinstance(args.precision, bool) or str(args.precision) not in PRECISIONS):
        fail("precision", f"{did_you_mean(args.precision, PRECISIONS)}use one of {list(PRECISIONS)}")
    _check_seed(args, fail, set_value)
    if args.data_seed is not None:
        data_seed = parse_number(args.data_seed, int)
        if data_seed is None:
            fail("data_seed", "pass an integer (the seed of the training order) or None to use `seed`")
        set_value("data_seed", data_seed)
    report_to = args.report_to
    if not (report_to is None or isinstance(report_to, (str, list, tuple))):
        fail("report_to", "pass a tracker's name ('tensorboard', 'mlflow', ...), a list of names, 'all' or 'none'")
    for item in [] if report_to is None or isinstance(report_to, str) else report_to:
        if not isinstance(item, str):
            raise TypeError(f"`report_to` takes names (str), got {item!r}; pass logger callbacks in `callbacks`")
    if args.accelerator is None or isinstance(args.accelerator, (bool, int, float, list, tuple, dict)):
        fail("accelerator", "pass a name such as 'cpu', 'cuda' or 'auto', or a lightning Accelerator")
    problem = jit_problem(args.jit_compile)
    if problem is not None:
        fail("jit_compile", problem)
    if isinstance(args.jit_compile, dict):
        set_value("jit_compile", dict(args.jit_compile))  # a copy: changing the caller's dict changes no run
    _check_hf_fields(args, fail)


def _check_hf_fields(args: Any, fail: Callable[[str, str], NoReturn]) -> None:
    """The Hugging Face fields: names, callables and the optimizer name."""
    for name in ("run_name", "logging_dir"):
        value = getattr(args, name)
        if isinstance(value, os.PathLike):
            object.__setattr__(args, name, os.fspath(value))
        elif not (value is None or isinstance(value, str)):
            fail(name, "pass a str, or None for the default")
    if args.optim is not None:
        from fitkit.config.hf_names import HF_OPTIMIZERS

        if args.optim not in HF_OPTIMIZERS:
            fail("optim", f"{did_you_mean(args.optim, HF_OPTIMIZERS)}use one of {list(HF_OPTIMIZERS)}, or pass an "
                 "optimizer to compile")
    if args.optim_args is not None:
        if not isinstance(args.optim_args, str):
            fail("optim_args", "pass 'key=value,...' (options of the optimizer `optim` names), or None")
        if args.optim is None and args.optim_args:
            fail("optim_args", "it gives options to the optimizer `optim` names: pass `optim` too (e.g. 'sgd'), or "
                 "pass compile an optimizer built with its options")
        from fitkit.adapters.optim_args import parse_optim_args

        parse_optim_args(args.optim_args)  # a malformed text fails here, naming `optim_args`
    if not isinstance(args.length_column_name, str) or not args.length_column_name:
        fail("length_column_name", "pass the name of a datasets.Dataset column holding each sample's length")
    names = args.label_names
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names) or not names):
        fail("label_names", "pass a list of the batch keys that hold the target, e.g. ['labels']")
    for name in ("compute_metrics", "data_collator", "preprocess_logits_for_metrics", "post_process_function"):
        if getattr(args, name) is not None and not callable(getattr(args, name)):
            fail(name, "pass a function, or None")
    if args.save_on_each_node and args.save_async:
        fail("save_on_each_node", "each node's writer is the synchronous one: pass save_async=False with it")
    from fitkit.config.hf_processing import check_habit_fields

    check_habit_fields(args, fail)
