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
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

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


@dataclass(frozen=True)
class TrainingArguments:
    """The frozen configuration of one run. See the field list for defaults."""

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
        def need(cond: bool, name: str, fix: str) -> None:
            if not cond:
                raise ValueError(f"`{name}`={getattr(self, name)!r} is invalid: {fix}")

        def positive_int(name: str) -> None:
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, name, "pass an integer > 0")

        positive_int("num_train_epochs")
        positive_int("per_device_train_batch_size")
        if self.per_device_eval_batch_size is not None:
            positive_int("per_device_eval_batch_size")
        positive_int("gradient_accumulation_steps")
        positive_int("logging_steps")
        positive_int("save_steps")
        positive_int("num_nodes")
        need(isinstance(self.max_steps, int) and self.max_steps != 0, "max_steps",
             "pass a positive number of optimizer steps, or -1 to train by epochs")
        if self.eval_steps is not None:
            positive_int("eval_steps")
        if self.learning_rate is not None:
            need(isinstance(self.learning_rate, (int, float)) and self.learning_rate >= 0
                 and math.isfinite(self.learning_rate), "learning_rate", "pass a finite number >= 0")
        if self.weight_decay is not None:
            need(self.weight_decay >= 0, "weight_decay", "pass a number >= 0")
        if self.max_grad_norm is not None:
            need(self.max_grad_norm > 0, "max_grad_norm", "pass a number > 0, or None to skip clipping")
        need(isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "warmup_steps",
             "pass an integer >= 0")
        need(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", "pass a fraction in [0, 1)")
        need(callable(self.lr_scheduler) or self.lr_scheduler in SCHEDULERS, "lr_scheduler",
             f"use one of {list(SCHEDULERS)} or a callable (optimizer, num_training_steps) -> scheduler")
        need(self.eval_strategy is None or self.eval_strategy in STRATEGIES, "eval_strategy",
             f"use one of {list(STRATEGIES)}")
        need(self.logging_strategy in STRATEGIES, "logging_strategy", f"use one of {list(STRATEGIES)}")
        need(self.save_strategy in SAVE_STRATEGIES, "save_strategy", f"use one of {list(SAVE_STRATEGIES)}")
        if self.save_total_limit is not None:
            positive_int("save_total_limit")
        need(self.verbose in VERBOSITY, "verbose", "use 0 (silent), 1 (progress bar), 2 (a line per epoch) or 'auto'")
        need(self.precision is None or str(self.precision) in PRECISIONS, "precision",
             f"use one of {list(PRECISIONS)}")
        need(self.seed is None or isinstance(self.seed, int), "seed", "pass an integer or None")
        need(self.log_level in LOG_LEVELS, "log_level", f"use one of {list(LOG_LEVELS)}")
        need(self.log_level_replica in LOG_LEVELS, "log_level_replica", f"use one of {list(LOG_LEVELS)}")

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

        An unknown option raises `TypeError` naming it and listing the valid ones.
        """
        return cls(**cls._canonical(options))

    @classmethod
    def _canonical(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Options by field name (aliases resolved); an unknown one raises `TypeError` listing the valid ones."""
        known = cls.__dataclass_fields__
        values: dict[str, Any] = {}
        for key, value in options.items():
            name = ALIASES.get(key, key)
            if name not in known:
                valid = sorted(set(known) | set(ALIASES))
                raise TypeError(f"unknown option {key!r}; valid options are: {', '.join(valid)}")
            values[name] = value
        return values

    def replace(self, **options: Any) -> "TrainingArguments":
        """A copy with some options changed (aliases accepted), validated again."""
        return dataclasses.replace(self, **self._canonical(options))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (callables and objects by name)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """Values a tracker accepts as hyperparameters (bool, int, float, str)."""
        return {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in self.to_dict().items()}
