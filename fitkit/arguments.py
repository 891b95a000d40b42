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

#: Aliases a Keras or HF user may reach for, mapped to the argument name used here.
ALIASES = {
    "epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size",
    "evaluation_strategy": "eval_strategy",
    "lr": "learning_rate",
    "lr_scheduler_type": "lr_scheduler",
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
    num_train_epochs: int = 1
    max_steps: int = -1
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int | None = None
    shuffle: bool = True
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
    eval_steps: int | None = None
    logging_strategy: str = "epoch"
    logging_steps: int = 500
    logging_first_step: bool = False
    save_strategy: str = "no"
    save_steps: int = 500
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

    def __post_init__(self) -> None:
        _check_and_convert(self)

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
        for key, value in options.items():
            name = ALIASES.get(key, key)
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
    "num_train_epochs": (1, False), "per_device_train_batch_size": (1, False),
    "per_device_eval_batch_size": (1, True), "gradient_accumulation_steps": (1, False), "warmup_steps": (0, False),
    "eval_steps": (1, True), "logging_steps": (1, False), "save_steps": (1, False), "save_total_limit": (1, True),
    "num_nodes": (1, False),
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
}
#: String fields taking one of a set of names, and whether None is allowed too.
_CHOICES: dict[str, tuple[tuple, bool]] = {
    "eval_strategy": (STRATEGIES, True), "logging_strategy": (STRATEGIES, False),
    "save_strategy": (SAVE_STRATEGIES, False), "log_level": (LOG_LEVELS, False),
    "log_level_replica": (LOG_LEVELS, False),
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
    _check_the_others(args, fail, set_value)


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
    if not (callable(args.lr_scheduler) or (isinstance(args.lr_scheduler, str) and args.lr_scheduler in SCHEDULERS)):
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
