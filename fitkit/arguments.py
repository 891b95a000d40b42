"""`TrainingArguments`: every knob of a run, validated once, frozen, JSON-serialisable.

Names follow Hugging Face's `TrainingArguments` so callbacks written for the HF Trainer read
the same attributes (`args.output_dir`, `args.logging_steps`, `args.eval_strategy`, ...).
`Model.compile` and `Model.fit` build one from their keyword options; pass a ready one with
`fit(..., args=TrainingArguments(...))`::

    args = TrainingArguments(num_train_epochs=3, per_device_train_batch_size=64,
                             learning_rate=3e-4, eval_strategy="epoch")
    args.to_json_string()
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

from fitkit.jit_compile import jit_problem
from fitkit.options import did_you_mean, parse_number

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

#: Aliases a Keras or HF user may reach for, mapped to the argument name used here.
ALIASES = {
    "epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size",
    "evaluation_strategy": "eval_strategy",
    "lr": "learning_rate",
    "lr_scheduler_type": "lr_scheduler",
    "validation_batch_size": "per_device_eval_batch_size",
    "tokenizer": "processing_class",  # the HF Trainer's older name
}

#: Keras `fit` arguments with no fitkit equivalent, and the fitkit way to say what they mean.
KERAS_ONLY = {
    "workers": "load data in parallel with a DataLoader's `num_workers` (fit(DataLoader(dataset, num_workers=4)))",
    "use_multiprocessing": "load data in worker processes with a DataLoader's `num_workers`",
    "max_queue_size": "a DataLoader's `prefetch_factor` (with `num_workers` > 0) sets how many batches wait",
}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if callable(value):
        return getattr(value, "__qualname__", None) or type(value).__name__
    return repr(value)


def _distributed(getter: str, variable: str, default: int) -> int:
    """A figure of the process group when one is running, else what the launcher's environment
    variable says, else `default` (torch is imported only when it already is)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(getattr(dist, getter)())
    return int(os.environ.get(variable, default))


_MEMO_SIZE = 32


def _memo_key(options: dict[str, Any]) -> tuple | None:
    """A key telling these options apart by value and type (`True`, `1` and `1.0` differ), or
    None when a value cannot be hashed (such options are not remembered)."""
    key = tuple((k, type(v), v) for k, v in sorted(options.items(), key=lambda kv: kv[0]))
    try:
        hash(key)
    except TypeError:
        return None
    return key


@dataclass(frozen=True)
class TrainingArguments:
    """The frozen configuration of one run. See the field list for defaults.

    Every field's type and range is checked once, when built (a `ValueError` naming the field and
    the fix, with the closest name for a misspelt choice); numbers given as text (`"1e-3"`, `"3"`,
    as HF's command line gives them) are converted, and a path-like `output_dir` becomes a str.
    """

    output_dir: str = "fitkit_output"
    # -- schedule of the run
    num_train_epochs: int | float = 1  # a float trains part of the last epoch (HF)
    max_steps: int = -1
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int | None = None
    shuffle: bool = True
    steps_per_epoch: int | None = None  # Keras: batches per epoch (None: the whole data)
    validation_steps: int | None = None  # Keras: batches per evaluation (None: the whole data)
    validation_freq: int = 1  # Keras: evaluate every this many epochs (eval_strategy="epoch")
    gradient_accumulation_steps: int = 1
    # -- optimisation
    learning_rate: float | None = None
    weight_decay: float | None = None
    lr_scheduler: str | Callable = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    max_grad_norm: float | None = None
    # -- logging, evaluation, saving
    eval_strategy: str | None = None  # None: "epoch" when there is validation data, else "no"
    eval_steps: int | float | None = None  # below 1: a fraction of max_steps (HF)
    eval_delay: float = 0  # epochs (eval_strategy='epoch') or steps to wait before the first evaluation (HF)
    logging_strategy: str = "epoch"
    logging_steps: int | float = 500  # below 1: a fraction of max_steps (HF)
    logging_first_step: bool = False
    save_strategy: str = "no"
    save_steps: int | float = 500  # below 1: a fraction of max_steps (HF)
    save_total_limit: int | None = None
    load_best_model_at_end: bool = False
    metric_for_best_model: str = "val_loss"
    greater_is_better: bool | None = None
    resume_from_checkpoint: bool | str | None = None
    save_on_sigterm: bool | None = None  # None: on when a save_strategy is set
    skip_memory_metrics: bool = True  # False: train_mem_* figures in the closing record
    log_level: str = "passive"  # the "fitkit" logger's level on the main process ("passive": leave it)
    log_level_replica: str = "warning"  # ... on the other processes
    log_on_each_node: bool = True  # False: only the main node's main process uses `log_level`
    report_to: str | list[str] = "none"
    verbose: int | str = "auto"
    seed: int | None = 42
    # -- devices (Lightning Fabric)
    accelerator: str = "auto"
    devices: int | str | list[int] = "auto"
    strategy: Any = "auto"
    precision: str | int | None = None
    num_nodes: int = 1
    fsdp_wrap: Any = None  # strategy="fsdp": module classes (or a predicate) to shard as units
    fsdp_full_checkpoint: bool = False  # strategy="fsdp": one full checkpoint file instead of shards
    fsdp_sharding: str = "full"  # strategy="fsdp": "full" over every process, "hybrid" within a node, replicated across
    jit_compile: bool | str | dict = "auto"  # torch.compile the module: True, a mode, a dict of its keywords ("auto": off)
    # -- Hugging Face fields (fitkit.hf_arguments maps `fp16`, `bf16`, `disable_tqdm`, `use_cpu` too)
    run_name: str | None = None  # the trackers' run name (None: the output_dir's name)
    logging_dir: str | None = None  # TensorBoard's directory (None: output_dir/runs)
    optim: str | None = None  # an HF optimizer name ("adamw_torch", "sgd", ...): replaces compile's optimizer
    dataloader_num_workers: int = 0  # worker processes of the DataLoader fitkit builds over a Dataset
    dataloader_pin_memory: bool = False  # pinned batches from the DataLoader fitkit builds over a Dataset
    prefetch: bool = True  # a thread reads the next batches of a map-style Dataset during each step (num_workers=0)
    label_names: list[str] | None = None  # the keys of a dict batch that hold the target (None: "labels", "label", ...)
    gradient_checkpointing: bool | None = False  # call module.gradient_checkpointing_enable() at fit
    compute_metrics: Callable | None = None  # HF's compute_metrics(EvalPrediction) -> dict, over each evaluation
    data_collator: Callable | None = None  # list of samples -> batch, for the DataLoader fitkit builds
    # -- HF Trainer habits (checked by fitkit.hf_processing.check_habit_fields)
    remove_unused_columns: bool = True  # drop sample keys the module's forward does not name (labels kept)
    processing_class: Any = None  # an HF tokenizer/processor: its padding collator by default, saved beside the model
    exclude_from_weight_decay: Any = None  # None: HF's groups with HF arguments; "hf"; regexes of names; [] or "none"

    def __post_init__(self) -> None:
        _check_and_convert(self)

    def __getstate__(self) -> dict[str, Any]:
        # The memo of `replace` is not pickled: its keys hold the options' types (a function's type
        # cannot be pickled), and a child process (ddp_spawn) starts its own.
        state = dict(self.__dict__)
        state.pop("_replaced", None)
        return state

    # -- derived values -----------------------------------------------------------------
    @property
    def epochs(self) -> int:
        return self.num_train_epochs

    @property
    def batch_size(self) -> int:
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size or self.per_device_train_batch_size

    @property
    def train_batch_size(self) -> int:
        return self.per_device_train_batch_size

    @property
    def lr_scheduler_type(self) -> str:
        return self.lr_scheduler if isinstance(self.lr_scheduler, str) else "callable"

    @property
    def evaluation_strategy(self) -> str | None:
        return self.eval_strategy

    @property
    def disable_tqdm(self) -> bool:
        return self.verbose != 1

    @property
    def process_index(self) -> int:
        """This process's global rank (HF's name): 0 on one process."""
        return _distributed("get_rank", "RANK", 0)

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine (HF's name): 0 on one process."""
        return int(os.environ.get("LOCAL_RANK", 0))

    @property
    def world_size(self) -> int:
        """The number of processes of the run (HF's name): 1 on one process."""
        return _distributed("get_world_size", "WORLD_SIZE", 1)

    def get_process_log_level(self, global_rank: int = 0, local_rank: int = 0) -> int | None:
        """The level for the "fitkit" logger in this process (HF): `log_level` on the main
        process (each node's, unless `log_on_each_node=False`), `log_level_replica` elsewhere;
        None for "passive" (leave the level as the application set it)."""
        main = (local_rank if self.log_on_each_node else global_rank) == 0
        name = self.log_level if main else self.log_level_replica
        return None if name == "passive" else getattr(logging, name.upper())

    # -- construction and serialisation ----------------------------------------------------
    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_options(cls, **options: Any) -> "TrainingArguments":
        """Build from keyword options, accepting the Keras/HF aliases (`epochs`, `batch_size`, ...).

        An unknown option raises `TypeError` naming it, the closest valid name and the valid
        ones; a bad value raises `ValueError` naming the option as it was given.
        """
        return _named_as_given(options, lambda: cls(**cls._canonical(options)))

    @classmethod
    def _canonical(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Options by field name (aliases resolved); an unknown one (even set to None) raises
        `TypeError` suggesting the closest valid name, then listing them all."""
        known = cls.__dataclass_fields__
        values: dict[str, Any] = {}
        if not known.keys() >= options.keys():  # HF names: fp16 -> precision, ...; HF fields fitkit lacks: warned
            from fitkit.hf_names import hf_options, warn_unhonoured

            options, ignored = hf_options(options, set(known) | set(ALIASES) | set(KERAS_ONLY))
            warn_unhonoured(ignored)
        for key, value in options.items():
            name = ALIASES.get(key, key)
            if name in KERAS_ONLY:
                raise TypeError(f"`{key}` is a Keras option fitkit does not take: {KERAS_ONLY[name]}")
            if name not in known:
                valid = sorted(set(known) | set(ALIASES))
                raise TypeError(f"{did_you_mean(key, valid)}unknown option {key!r}; "
                                f"valid options are: {', '.join(valid)}")
            if name in values:
                other = next(k for k in options if ALIASES.get(k, k) == name and k != key)
                raise TypeError(f"`{other}` and `{key}` are the same option: pass only one of them")
            values[name] = value
        return values

    def replace(self, **options: Any) -> "TrainingArguments":
        """A copy with some options changed (aliases accepted), validated again.

        The arguments are frozen, so the same change gives the same result: it is remembered
        (for hashable values), and a fit called again with the same options validates nothing again."""
        key = _memo_key(options)
        memo = self.__dict__.get("_replaced")
        if key is not None and memo is not None and key in memo:
            return memo[key]
        new = _named_as_given(options, lambda: dataclasses.replace(self, **self._canonical(options)))
        from fitkit.hf_names import HF_ONLY_TARGETS  # the fields set, for fitkit.option_merge's args= rule

        given = self.__dict__.get("_given", frozenset()) | {HF_ONLY_TARGETS.get(k, ALIASES.get(k, k)) for k in options}
        object.__setattr__(new, "_given", frozenset(given))
        if key is not None:
            if memo is None:
                memo = {}
                object.__setattr__(self, "_replaced", memo)  # not a field: equality and JSON ignore it
            if len(memo) < _MEMO_SIZE:
                memo[key] = new
        return new

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (callables and objects by name)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """Values a tracker accepts as hyperparameters (bool, int, float, str)."""
        return {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in self.to_dict().items()}


def _named_as_given(options: dict[str, Any], build: Callable[[], TrainingArguments]) -> TrainingArguments:
    """`build()`, with a `ValueError` about a field given by its alias (`epochs=0`) naming the
    alias the user wrote rather than the field (`num_train_epochs`)."""
    try:
        return build()
    except ValueError as err:
        text = str(err)
        for key in options:
            field_name = ALIASES.get(key)
            if field_name is not None and text.startswith(f"`{field_name}`="):
                raise ValueError(f"`{key}`=" + text[len(field_name) + 3:]) from None
        raise


# -- the checks of every field (run once, by __post_init__) ------------------------------------
#: Integer fields: the smallest value allowed, and whether None is allowed too.
_INTS: dict[str, tuple[int, bool]] = {
    "per_device_train_batch_size": (1, False),
    "per_device_eval_batch_size": (1, True), "gradient_accumulation_steps": (1, False), "warmup_steps": (0, False),
    "save_total_limit": (1, True),
    "num_nodes": (1, False), "steps_per_epoch": (1, True), "validation_steps": (1, True), "validation_freq": (1, False),
    "dataloader_num_workers": (0, False),
}
#: Float fields: the test of the value, what to pass instead, and whether None is allowed too.
_FLOATS: dict[str, tuple[Callable[[float], bool], str, bool]] = {
    "learning_rate": (lambda v: v >= 0, "pass a finite number >= 0", True),
    "weight_decay": (lambda v: v >= 0, "pass a finite number >= 0", True),
    "max_grad_norm": (lambda v: v > 0, "pass a number > 0, or None to skip clipping", True),
    "warmup_ratio": (lambda v: 0 <= v < 1, "pass a fraction in [0, 1)", False),
}
#: Bool fields, and whether None is allowed too.
_BOOLS: dict[str, bool] = {
    "shuffle": False, "logging_first_step": False, "load_best_model_at_end": False, "greater_is_better": True,
    "save_on_sigterm": True, "skip_memory_metrics": False, "log_on_each_node": False, "fsdp_full_checkpoint": False,
    "dataloader_pin_memory": False, "gradient_checkpointing": True, "prefetch": False,
}
#: String fields taking one of a set of names, and whether None is allowed too.
_CHOICES: dict[str, tuple[tuple, bool]] = {
    "eval_strategy": (STRATEGIES, True), "logging_strategy": (STRATEGIES, False),
    "save_strategy": (SAVE_STRATEGIES, False), "log_level": (LOG_LEVELS, False),
    "log_level_replica": (LOG_LEVELS, False), "fsdp_sharding": (FSDP_SHARDING, False),
}


def _check_and_convert(args: TrainingArguments) -> None:
    """Check the type and range of every field; numbers given as text ("1e-3", "3") and paths
    given as `os.PathLike` are converted (the dataclass is frozen: `object.__setattr__`)."""

    def fail(name: str, fix: str) -> None:
        raise ValueError(f"`{name}`={getattr(args, name)!r} is invalid: {fix}")

    def set_value(name: str, value: Any) -> None:
        object.__setattr__(args, name, value)

    for name, (least, optional) in _INTS.items():
        value = getattr(args, name)
        if value is None and optional:
            continue
        number = parse_number(value, int)
        if number is None or number < least:
            fail(name, f"pass an integer {'> 0' if least == 1 else f'>= {least}'}" + (", or None" if optional else ""))
        set_value(name, number)
    steps = parse_number(args.max_steps, int)
    if steps is None or not (steps == -1 or steps > 0):
        fail("max_steps", "pass a positive number of optimizer steps, or -1 to train by epochs")
    set_value("max_steps", steps)
    for name, (test, fix, optional) in _FLOATS.items():
        value = getattr(args, name)
        if value is None and optional:
            continue
        number = parse_number(value, float)
        if number is None or not test(number):
            fail(name, fix)
        set_value(name, number)
    for name, optional in _BOOLS.items():
        value = getattr(args, name)
        if not (isinstance(value, bool) or (optional and value is None)):
            fail(name, "pass True or False" + (" (or None for the default)" if optional else ""))
    for name, (choices, optional) in _CHOICES.items():
        value = getattr(args, name)
        if not ((isinstance(value, str) and value in choices) or (optional and value is None)):
            fail(name, f"{did_you_mean(value, choices)}use one of {list(choices)}")
    _check_fractions(args, fail, set_value)
    _check_the_others(args, fail, set_value)


def _whole_or_fraction(value: Any, fraction: bool) -> int | float | None:
    """An int >= 1 as an int (`3.0` too), or (with `fraction`) a float in (0, 1) as is; else None."""
    number = parse_number(value, float)
    if number is None or number <= 0:
        return None
    if number >= 1:
        return int(number) if number == int(number) else None
    return number if fraction else None


def _check_fractions(args: TrainingArguments, fail: Callable, set_value: Callable) -> None:
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
    epochs = parse_number(args.num_train_epochs, float)
    if epochs is None or epochs <= 0:
        fail("num_train_epochs", "pass a number of epochs > 0 (a float such as 1.5 trains part of the last one)")
    set_value("num_train_epochs", int(epochs) if epochs == int(epochs) else epochs)
    delay = parse_number(args.eval_delay, float)
    if delay is None or delay < 0:
        fail("eval_delay", "pass the epochs (eval_strategy='epoch') or steps ('steps') to wait, a number >= 0")
    set_value("eval_delay", int(delay) if delay == int(delay) else delay)


def _check_the_others(args: TrainingArguments, fail: Callable, set_value: Callable) -> None:
    for name in ("output_dir", "resume_from_checkpoint"):  # a path may be a pathlib.Path
        if isinstance(getattr(args, name), os.PathLike):
            set_value(name, os.fspath(getattr(args, name)))
    if not isinstance(args.output_dir, str) or not args.output_dir:
        fail("output_dir", "pass the path of a folder (a str); it is created when missing")
    if not (args.resume_from_checkpoint is None or isinstance(args.resume_from_checkpoint, (bool, str))):
        fail("resume_from_checkpoint", "pass True (the last checkpoint in `output_dir`) or a checkpoint's path")
    if not isinstance(args.metric_for_best_model, str) or not args.metric_for_best_model:
        fail("metric_for_best_model", "pass the name of a logged value, e.g. 'val_loss' or 'val_accuracy'")
    scheduler_object = hasattr(args.lr_scheduler, "optimizer") and callable(getattr(args.lr_scheduler, "step", None))
    if not (callable(args.lr_scheduler) or scheduler_object
            or (isinstance(args.lr_scheduler, str) and args.lr_scheduler in SCHEDULERS)):
        fail("lr_scheduler", f"{did_you_mean(args.lr_scheduler, SCHEDULERS)}use one of {list(SCHEDULERS)} or a "
             "callable (optimizer, num_training_steps) -> scheduler")
    if isinstance(args.verbose, bool) or args.verbose not in VERBOSITY:
        fail("verbose", "use 0 (silent), 1 (progress bar), 2 (a line per epoch) or 'auto'")
    if args.precision is not None and (isinstance(args.precision, bool) or str(args.precision) not in PRECISIONS):
        fail("precision", f"{did_you_mean(args.precision, PRECISIONS)}use one of {list(PRECISIONS)}")
    if args.seed is not None:
        seed = parse_number(args.seed, int)
        if seed is None:
            fail("seed", "pass an integer or None")
        set_value("seed", seed)
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


def _check_hf_fields(args: TrainingArguments, fail: Callable) -> None:
    """The Hugging Face fields: names, callables and the optimizer name."""
    for name in ("run_name", "logging_dir"):
        value = getattr(args, name)
        if isinstance(value, os.PathLike):
            object.__setattr__(args, name, os.fspath(value))
        elif not (value is None or isinstance(value, str)):
            fail(name, "pass a str, or None for the default")
    if args.optim is not None:
        from fitkit.hf_names import HF_OPTIMIZERS

        if args.optim not in HF_OPTIMIZERS:
            fail("optim", f"{did_you_mean(args.optim, HF_OPTIMIZERS)}use one of {list(HF_OPTIMIZERS)}, or pass an "
                 "optimizer to compile")
    names = args.label_names
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names) or not names):
        fail("label_names", "pass a list of the batch keys that hold the target, e.g. ['labels']")
    for name in ("compute_metrics", "data_collator"):
        if getattr(args, name) is not None and not callable(getattr(args, name)):
            fail(name, "pass a function, or None")
    from fitkit.hf_processing import check_habit_fields

    check_habit_fields(args, fail)


_dataclass_init = TrainingArguments.__init__


def _init_with_other_names(self: TrainingArguments, *values: Any, **options: Any) -> None:
    """The dataclass constructor, also taking the aliases (`lr_scheduler_type`, `evaluation_strategy`,
    `epochs`, ...) and Hugging Face names (`fp16`, `bf16`, `disable_tqdm`, ...)."""
    canonical = TrainingArguments._canonical(options)
    _dataclass_init(self, *values, **canonical)
    # the fields set by the caller, for fitkit.option_merge (not a field: equality and JSON ignore it)
    object.__setattr__(self, "_given", frozenset(canonical) | frozenset(TrainingArguments.names()[:len(values)]))


TrainingArguments.__init__ = _init_with_other_names  # type: ignore[method-assign]
