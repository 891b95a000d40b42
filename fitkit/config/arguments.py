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
import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fitkit.config.checks import ALONE, check_and_convert, check_fields
from fitkit.config.names import ALIASES, canonical, named_as_given


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


@functools.lru_cache(maxsize=8)
def _field_names(cls: type) -> tuple[str, ...]:
    """The fields of a `TrainingArguments` class, in order (read once per class)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def _memo_key(options: dict[str, Any]) -> tuple | None:
    """A key telling these options apart by value and type (`True`, `1` and `1.0` differ), or
    None when a value cannot be hashed (such options are not remembered)."""
    key = tuple((k, type(v), v) for k, v in sorted(options.items(), key=lambda kv: kv[0]))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _TakesOtherNames(type):
    """Builds `TrainingArguments` from the names users reach for too (`epochs`, `lr`, `fp16`, ...):
    the keywords go through `argument_names.canonical` before the dataclass constructor sees them."""

    if TYPE_CHECKING:
        __dataclass_fields__: dict[str, Any]  # the classes it builds are dataclasses

    def __call__(cls, *values: Any, **options: Any) -> Any:
        named = canonical(options, cls.__dataclass_fields__)
        args = super().__call__(*values, **named)
        # the fields the caller set, for fitkit.config.option_merge's args= rule (not a field: equality and
        # JSON ignore it)
        object.__setattr__(args, "_given", frozenset(named) | frozenset(list(cls.__dataclass_fields__)[:len(values)]))
        return args


@dataclass(frozen=True)
class TrainingArguments(metaclass=_TakesOtherNames):
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
    eval_accumulation_steps: int | None = None  # evaluation/prediction: move gathered outputs to the CPU every N batches
    # -- optimisation
    learning_rate: float | None = None
    weight_decay: float | None = None
    lr_scheduler: str | Callable = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    max_grad_norm: float | None = None
    adam_beta1: float | None = None  # Adam-family optimizers by name (adam, adamw, HF's `optim`): None their default
    adam_beta2: float | None = None
    adam_epsilon: float | None = None
    label_smoothing_factor: float = 0.0  # HF's LabelSmoother over a loss=None module's logits and `labels` (-100 ignored)
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
    metric_for_best_model: str | None = "val_loss"  # None: no best model tracked (HF's None)
    greater_is_better: bool | None = None
    resume_from_checkpoint: bool | str | None = None
    ignore_data_skip: bool = False  # a resume starts its epoch over instead of skipping the batches trained (HF)
    save_on_sigterm: bool | None = None  # None: on when a save_strategy is set
    save_async: bool = False  # True: the loop waits only for a host copy of the state; written in the background
    skip_memory_metrics: bool = True  # False: train_mem_* figures in the closing record
    log_level: str = "passive"  # the "fitkit" logger's level on the main process ("passive": leave it)
    log_level_replica: str = "warning"  # ... on the other processes
    log_on_each_node: bool = True  # False: only the main node's main process uses `log_level`
    report_to: str | list[str] = "none"
    verbose: int | str = "auto"
    seed: int | None = 42
    data_seed: int | None = None  # the seed of the training order (None: `seed`), HF's name
    # "trainer" (set by args=transformers.TrainingArguments): the batches of each process and the draws from torch's
    # global generator that transformers.Trainer makes (fitkit.engine.data.trainer_order); "fitkit": Keras' way
    data_order: str = "fitkit"
    # -- devices (Lightning Fabric)
    accelerator: str = "auto"
    devices: int | str | list[int] = "auto"
    strategy: Any = "auto"
    precision: str | int | None = None
    num_nodes: int = 1
    fsdp_wrap: Any = None  # strategy="fsdp": module classes (or a predicate) to shard as units
    fsdp_full_checkpoint: bool = False  # strategy="fsdp": one full checkpoint file instead of shards
    fsdp_sharding: str = "full"  # strategy="fsdp": "full" over every process, "hybrid" within a node, replicated across
    fsdp_load_once: bool = False  # strategy="fsdp": model_init runs in rank 0 only; the others get its values by shard
    fsdp_reshard_after_forward: bool = True  # strategy="fsdp": False keeps each unit gathered from forward to backward
    fsdp_cpu_offload: bool = False  # strategy="fsdp": parameters, gradients and optimizer state kept in host memory
    fsdp_activation_checkpointing: bool = False  # strategy="fsdp": each unit's activations recomputed in backward
    jit_compile: bool | str | dict = "auto"  # torch.compile the module: True, a mode, a dict of its keywords ("auto": off)
    # -- Hugging Face fields (fitkit.config.hf_arguments maps `fp16`, `bf16`, `disable_tqdm`, `use_cpu` too)
    run_name: str | None = None  # the trackers' run name (None: the output_dir's name)
    logging_dir: str | None = None  # TensorBoard's directory (None: output_dir/runs)
    optim: str | None = None  # an HF optimizer name ("adamw_torch", "sgd", ...): replaces compile's optimizer
    dataloader_num_workers: int = 0  # worker processes of the DataLoader fitkit builds over a Dataset
    dataloader_pin_memory: bool = False  # pinned batches from the DataLoader fitkit builds over a Dataset
    tune_cpu_allocator: bool = True  # on a CPU: keep glibc malloc from returning freed tensors every step (host_allocator)
    prefetch: bool = True  # a thread reads the next batches of a map-style Dataset during each step (num_workers=0)
    label_names: list[str] | None = None  # the keys of a dict batch that hold the target (None: "labels", "label", ...)
    gradient_checkpointing: bool | None = False  # call module.gradient_checkpointing_enable() at fit
    compute_metrics: Callable | None = None  # HF's compute_metrics(EvalPrediction) -> dict, over each evaluation
    data_collator: Callable | None = None  # list of samples -> batch, for the DataLoader fitkit builds
    predict_with_generate: bool = False  # evaluation: compute_metrics gets the module's generate() ids (HF Seq2Seq)
    generation_max_length: int | None = None  # generate's max_length (None: the model's generation_config)
    generation_num_beams: int | None = None  # generate's num_beams (None: the model's generation_config)
    generation_config: Any = None  # a transformers GenerationConfig for generate (None: the model's)
    preprocess_logits_for_metrics: Callable | None = None  # HF's (logits, labels) -> what compute_metrics keeps, per batch
    # run_qa.py's QuestionAnsweringTrainer step: predictions -> EvalPrediction, then compute_metrics on it, labels or not
    post_process_function: Callable | None = None
    # -- HF Trainer habits (checked by fitkit.config.hf_processing.check_habit_fields)
    remove_unused_columns: bool = True  # drop sample keys the module's forward does not name (labels kept)
    processing_class: Any = None  # an HF tokenizer/processor: its padding collator by default, saved beside the model
    exclude_from_weight_decay: Any = None  # None: HF's groups with HF arguments; "hf"; regexes of names; [] or "none"
    # True (set by `args=transformers.TrainingArguments(...)`): the log history is the HF Trainer's (the loss as
    # the mean of the steps' losses since the last log, across epochs; `grad_norm`; `epoch` unrounded; evaluation
    # records under `eval_` names with their speed); `verbose=0` then prints each log as the Trainer's printer
    hf_trainer: bool = False
    # -- HF Trainer fields that change what a run computes (`tests/test_hf_fields.py` compares each with the Trainer)
    dataloader_drop_last: bool = False  # the DataLoaders fitkit builds over a Dataset drop an incomplete last batch
    logging_nan_inf_filter: bool = False  # a nan/inf step loss is logged as the mean of the others since the last log
    eval_on_start: bool = False  # evaluate once before the first step
    prediction_loss_only: bool = False  # evaluation computes the loss alone (no compute_metrics, no predictions)
    include_num_input_tokens_seen: str | bool = "no"  # "all" / True, "non_padding": num_input_tokens_seen logged (HF)
    include_for_metrics: list[str] | None = None  # HF's: "inputs" and / or "loss" also given to compute_metrics
    torch_empty_cache_steps: int | None = None  # the accelerator's cached memory emptied every N steps (HF)
    neftune_noise_alpha: float | None = None  # NEFTune: noise on a transformers model's input embeddings in training
    save_only_model: bool = False  # checkpoints hold the weights alone: no optimizer or scheduler state (HF)
    full_determinism: bool = False  # torch's deterministic algorithms for the process (HF's enable_full_determinism)
    gradient_checkpointing_kwargs: dict | None = None  # given to gradient_checkpointing_enable() (use_reentrant, ...)
    use_cache: bool | None = None  # set as the module's `config.use_cache` at fit (HF); None: left as it is
    # DataLoader options of the loaders fitkit builds over a Dataset (HF's; the first two need workers)
    dataloader_persistent_workers: bool = False
    dataloader_prefetch_factor: int | None = None
    dataloader_multiprocessing_context: str | None = None
    dataloader_in_order: bool = True
    # DDP (strategy "ddp", "ddp_spawn", ...): the process group's backend and timeout (seconds), and
    # DistributedDataParallel's own options; None: Fabric's and torch's defaults
    ddp_backend: str | None = None
    ddp_timeout: int | None = None
    ddp_find_unused_parameters: bool | None = None
    ddp_bucket_cap_mb: int | None = None
    ddp_broadcast_buffers: bool | None = None
    ddp_static_graph: bool | None = None
    # Evaluation (HF's): outside training, the module cast to bf16 / fp16 in place (it stays so) before evaluating
    bf16_full_eval: bool = False
    fp16_full_eval: bool = False
    eval_do_concat_batches: bool = True  # False: compute_metrics and hf_predict get lists of per-batch arrays
    batch_eval_metrics: bool = False  # compute_metrics(eval_pred, compute_result=...) per batch; the last call's dict
    eval_use_gather_object: bool = False  # several processes: non-tensor outputs gathered as objects (pickled)
    restore_callback_states_from_checkpoint: bool = True  # a resume gives callbacks their states (HF's default: False)
    # the training order (HF's): "random", "sequential", or "group_by_length" (batches of samples of about one length,
    # evaluation too; the lengths from a datasets.Dataset's `length_column_name` column, else each sample's input_ids),
    # or "batch_rebalance" (training micro-batches of varying size, of about even padded cost: fitkit.engine.data.rebalance)
    train_sampling_strategy: str = "random"
    length_column_name: str = "length"
    optim_args: str | None = None  # "key=value,...": HF's options of the `optim` named sgd, adagrad or rmsprop
    debug: str = ""  # "underflow_overflow": transformers' DebugUnderflowOverflow on the module while training (HF)
    # the Trainer face: a `**kwargs` model's loss over the window's label tokens of every process (False: this one's)
    average_tokens_across_devices: bool = True
    auto_find_batch_size: bool = False  # an out-of-memory error restarts training with 0.9 x the batch size (HF)
    save_on_each_node: bool = False  # checkpoints written by each node's local rank 0, not only global rank 0 (HF)
    # HF's `accelerator_config` entries, as Accelerate's prepared training loader and the Trainer's loop follow them:
    split_batches: bool = False  # several processes: each batch of per_device_train_batch_size split among them
    even_batches: bool = True  # several processes: the last round of batches completed with the epoch's first samples
    use_seedable_sampler: bool = True  # False: each epoch's order drawn from torch's global generator (RandomSampler)
    sync_each_batch: bool = False  # gradients synced between processes at every micro-batch, not only the last

    def __post_init__(self) -> None:
        check_and_convert(self)

    def __getstate__(self) -> dict[str, Any]:
        # The memo of `replace` is not pickled: its keys hold the options' types (a function's type
        # cannot be pickled), and a child process (ddp_spawn) starts its own.
        state = dict(self.__dict__)
        state.pop("_replaced", None)
        return state

    # -- derived values -----------------------------------------------------------------
    @property
    def epochs(self) -> int | float:
        return self.num_train_epochs

    @property
    def batch_size(self) -> int:
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size or self.per_device_train_batch_size

    def eval_batch_size_or(self, default: int) -> int:
        """`per_device_eval_batch_size` when set, else `default` (Keras' evaluate and predict: 32)."""
        return self.per_device_eval_batch_size or default

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
        return list(_field_names(cls))

    @classmethod
    def from_options(cls, **options: Any) -> TrainingArguments:
        """Build from keyword options, accepting the Keras/HF aliases (`epochs`, `batch_size`, ...).

        An unknown option raises `TypeError` naming it, the closest valid name and the valid
        ones; a bad value raises `ValueError` naming the option as it was given.
        """
        return named_as_given(options, lambda: cls(**options))  # the constructor resolves the names

    def replace(self, **options: Any) -> TrainingArguments:
        """A copy with some options changed (aliases accepted), validated again.

        The arguments are frozen, so the same change gives the same result: it is remembered
        (for hashable values), and a fit called again with the same options validates nothing again."""
        key = _memo_key(options)
        memo = self.__dict__.get("_replaced")
        if key is not None and memo is not None and key in memo:
            return memo[key]
        new = named_as_given(options, lambda: self._copy_with(canonical(options, _field_names(type(self)))))
        from fitkit.config.hf_names import (
            HF_ONLY_TARGETS,  # the fields set, for fitkit.config.option_merge's args= rule
        )

        given = self.__dict__.get("_given", frozenset()) | {HF_ONLY_TARGETS.get(k, ALIASES.get(k, k)) for k in options}
        object.__setattr__(new, "_given", frozenset(given))
        if key is not None:
            if memo is None:
                memo = {}
                object.__setattr__(self, "_replaced", memo)  # not a field: equality and JSON ignore it
            if len(memo) < _MEMO_SIZE:
                memo[key] = new
        return new

    def settled(self, **values: Any) -> TrainingArguments:
        """A copy with fields the engine settled itself (field names, values it chose among the
        valid ones, e.g. `eval_strategy="epoch"` for a run with validation data): not checked
        again, as `replace` checks what a user gives."""
        new = self._copy_with(values, check=False)
        object.__setattr__(new, "_given", frozenset(self.__dict__.get("_given", frozenset()) | set(values)))
        return new

    def _fields_dict(self) -> dict[str, Any]:
        """The fields' values (a copy of the instance dict less the memo and the given names)."""
        values = self.__dict__.copy()
        values.pop("_replaced", None)
        values.pop("_given", None)
        fields = _field_names(type(self))
        return values if len(values) == len(fields) else {name: self.__dict__[name] for name in fields}

    def _copy_with(self, changes: dict[str, Any], check: bool = True) -> TrainingArguments:
        """What `dataclasses.replace` gives (`changes` over this one's fields, every field checked
        again), without passing every field through the constructor again: a fit makes a
        changed copy or two, and a search's trials make theirs at every trial. `check=False`:
        `changes` are the engine's own (`settled`), not checked."""
        new = object.__new__(type(self))
        new.__dict__.update(self._fields_dict(), **changes)
        if not check:
            return new
        if changes.keys() <= ALONE and type(self).__post_init__ is TrainingArguments.__post_init__:
            check_fields(new, list(changes))  # the others were checked when this one was built
        else:
            new.__post_init__()
        return new

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (callables and objects by name)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """Values a tracker accepts as hyperparameters (bool, int, float, str)."""
        return {k: (v if isinstance(v, (bool, int, float, str)) else str(v)) for k, v in self.to_dict().items()}
