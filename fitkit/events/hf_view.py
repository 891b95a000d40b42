"""What a callback from `transformers` sees: HF-shaped `args` and HF-named values.

`CallbackHandler` routes the events of a callback whose class comes from `transformers`
(`EarlyStoppingCallback`, `TensorBoardCallback`, `MLflowCallback`, a user's subclass of
`transformers.TrainerCallback`, ...) through `wrap`: the callback gets an `args` object with
every attribute of HF's `TrainingArguments` (fitkit's values under HF names, HF's defaults for
the rest) and `metrics` / `logs` with HF names (`val_loss` -> `eval_loss`). fitkit's own
callbacks are not wrapped: they keep Keras names and pay nothing::

    from transformers import EarlyStoppingCallback
    model.fit(x, y, validation_split=0.2, metric_for_best_model="val_loss",
              callbacks=[EarlyStoppingCallback(early_stopping_patience=2)])
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from fitkit.common.logs import greater_is_better
from fitkit.config.arguments import TrainingArguments
from fitkit.config.hf_names import hf_defaults

#: The HF name of a fitkit validation value's prefix.
_VAL, _EVAL = "val_", "eval_"


def from_transformers(callback: Any, event: str) -> bool:
    """True when `callback`'s class comes from `transformers`: its own module, or that of any
    class in its MRO defining `event` (a subclass of `transformers.TrainerCallback` included)."""
    return class_from_transformers(type(callback), event)


def class_from_transformers(owner: type, event: str) -> bool:
    """`from_transformers` for a class: its own module, or that of a class in its MRO defining `event`."""
    if owner.__module__.startswith("transformers"):
        return True
    return any(cls.__module__.startswith("transformers") and event in cls.__dict__ for cls in owner.__mro__)


def hf_name(key: str) -> str:
    """A logged name as HF spells it: `val_accuracy` -> `eval_accuracy`; others unchanged."""
    return _EVAL + key[len(_VAL):] if key.startswith(_VAL) else key


def hf_values(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A copy of `values` under HF names (`val_*` -> `eval_*`)."""
    if isinstance(values, TrainerMetrics):
        return dict(values.hf)
    return None if values is None else {hf_name(k): v for k, v in values.items()}


class TrainerMetrics(dict):
    """An evaluation's values under fitkit's names (`val_loss`) that also hold, as `hf`, the
    Trainer's record of the same evaluation (`eval_loss`, the speed, `epoch`): what a callback
    from transformers receives as `on_evaluate`'s metrics (`hf_values`)."""

    hf: dict[str, Any]


def evaluated_metrics(metrics: dict[str, Any], args: Any, state: Any,
                      record: dict[str, Any] | None = None) -> dict[str, Any]:
    """What `on_evaluate` receives: `metrics`, with the `epoch` reached under the Trainer face
    (`hf_trainer`), as the Trainer's `evaluate()` adds it before `on_evaluate`; `record`, the
    evaluation's logged record under HF's names, is what transformers' callbacks then see."""
    if not getattr(args, "hf_trainer", False) or state.epoch is None:
        return metrics
    out = TrainerMetrics(metrics, epoch=state.epoch)
    out.hf = dict(record) if record is not None else {**(hf_values(metrics) or {}), "epoch": state.epoch}
    return out


def speed_metrics(split: str, seconds: float, samples: int | None = None,
                  steps: int | None = None, tokens: int | None = None) -> dict[str, float]:
    """The Trainer's speed values (`transformers.trainer_utils.speed_metrics`) of a run that took
    `seconds`: `{split}_runtime` rounded to 4 places; unless it took no time, the rates of the
    counts given, rounded to 3::

        speed_metrics("eval", 2.0, samples=100, steps=4)
        # {"eval_runtime": 2.0, "eval_samples_per_second": 50.0, "eval_steps_per_second": 2.0}
    """
    out = {f"{split}_runtime": round(seconds, 4)}
    if seconds == 0:
        return out
    if samples is not None:
        out[f"{split}_samples_per_second"] = round(samples / seconds, 3)
    if steps is not None:
        out[f"{split}_steps_per_second"] = round(steps / seconds, 3)
    if tokens is not None:
        out[f"{split}_tokens_per_second"] = round(tokens / seconds, 3)
    return out


def evaluation_record(metrics: Mapping[str, Any], prefix: str, seconds: float | None = None,
                      samples: int | None = None, steps: int | None = None) -> dict[str, Any]:
    """An evaluation's values as the Trainer's `evaluate` / `predict` return and log them:
    `prefix_` before each name (kept where it is there already), then, given the `seconds` it
    took, the speed (`speed_metrics`)::

        evaluation_record({"loss": 0.3}, "eval", 2.0, samples=100, steps=4)
        # {"eval_loss": 0.3, "eval_runtime": 2.0, "eval_samples_per_second": 50.0, ...}
    """
    if not isinstance(prefix, str) or not prefix:
        raise ValueError(f"`metric_key_prefix`={prefix!r} is invalid: pass a word such as 'eval' or 'test'")
    head = prefix + "_"
    out = {k if k.startswith(head) else head + k: v for k, v in metrics.items()}
    if seconds is not None:
        out.update(speed_metrics(prefix, seconds, samples, steps))
    return out


class HFArguments:
    """HF's `TrainingArguments` attributes over fitkit's: every HF field, its HF properties
    (`train_batch_size`, `world_size`, `should_log`, ...) and `to_dict` / `to_json_string` /
    `to_sanitized_dict`; any other name falls through to fitkit's arguments."""

    def __init__(self, fields: dict[str, Any], source: Any) -> None:
        self.__dict__.update(fields)
        self.__dict__["_fields"] = list(fields)
        self.__dict__["_source"] = source

    def __getattr__(self, name: str) -> Any:  # only for names that are not HF fields
        source = self.__dict__.get("_source")
        if source is None or name.startswith("__"):  # while being copied or unpickled
            raise AttributeError(name)
        return getattr(source, name)

    @property
    def train_batch_size(self) -> int:
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size

    @property
    def n_gpu(self) -> int:
        return 1 if str(getattr(self._source, "accelerator", "")).startswith(("cuda", "gpu")) else 0

    @property
    def should_log(self) -> bool:
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    def get_process_log_level(self) -> Any:
        return self._source.get_process_log_level(self.process_index, self.local_process_index)

    def to_dict(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in self._fields}
        return {k: (f"<{k.upper()}>" if k.endswith("_token") else _plain(v)) for k, v in values.items()}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_sanitized_dict(self) -> dict[str, Any]:
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in d.items()}

    def __repr__(self) -> str:
        return f"HFArguments(output_dir={self.output_dir!r}, ...)"


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return getattr(value, "__qualname__", None) or repr(value)


def _report_to(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or ())
    return [n for n in names if n not in ("none", "")]


def _direction(args: Any, metric: str | None, directions: Mapping[str, str]) -> bool | None:
    return None if metric is None else greater_is_better(metric, directions, args.greater_is_better)


def hf_arguments(args: Any, directions: Mapping[str, str]) -> HFArguments:
    """fitkit's `TrainingArguments` as HF's: HF's defaults, overwritten by fitkit's values."""
    fields = dict(hf_defaults())
    get = functools.partial(getattr, args)
    metric = hf_name(args.metric_for_best_model) if args.metric_for_best_model else None
    fields.update(
        output_dir=args.output_dir, num_train_epochs=args.num_train_epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate if args.learning_rate is not None else fields.get("learning_rate", 5e-5),
        weight_decay=args.weight_decay or 0.0, max_grad_norm=args.max_grad_norm or 0.0,
        lr_scheduler_type=args.lr_scheduler_type, warmup_steps=args.warmup_steps or args.warmup_ratio,
        eval_strategy=args.eval_strategy or "no", eval_steps=args.eval_steps, logging_strategy=args.logging_strategy,
        logging_steps=args.logging_steps, logging_first_step=args.logging_first_step,
        save_strategy=args.save_strategy, save_steps=args.save_steps, save_total_limit=args.save_total_limit,
        load_best_model_at_end=args.load_best_model_at_end, metric_for_best_model=metric,
        greater_is_better=_direction(args, metric, directions), report_to=_report_to(args.report_to),
        seed=args.seed if args.seed is not None else fields.get("seed", 42), log_level=args.log_level,
        log_level_replica=args.log_level_replica, log_on_each_node=args.log_on_each_node,
        skip_memory_metrics=args.skip_memory_metrics, resume_from_checkpoint=args.resume_from_checkpoint,
        disable_tqdm=args.disable_tqdm, fp16=str(args.precision).startswith("16"),
        bf16=str(args.precision).startswith("bf16"), use_cpu=args.accelerator == "cpu",
        run_name=get("run_name", None), logging_dir=get("logging_dir", None) or os.path.join(args.output_dir, "runs"),
        dataloader_num_workers=get("dataloader_num_workers", 0),
        dataloader_pin_memory=get("dataloader_pin_memory", True), label_names=get("label_names", None),
        gradient_checkpointing=bool(get("gradient_checkpointing", False)),
        optim=get("optim", None) or fields.get("optim", "adamw_torch"),
        eval_delay=get("eval_delay", 0) or 0, eval_accumulation_steps=get("eval_accumulation_steps", None),
    )
    return HFArguments(fields, args)


class HFView:
    """The HF view of one handler's runs: the `args` view is built once per run (per arguments
    object, and again at `on_train_begin`, when the run's metric directions are known).
    `owner` is the handler: its `metric_directions` resolve `greater_is_better`."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self._source: Any = None
        self._view: HFArguments | None = None

    def args(self, args: Any, fresh: bool = False) -> Any:
        if not isinstance(args, TrainingArguments):  # already HF's (or a stand-in): as it is
            return args
        if fresh or args is not self._source or self._view is None:
            self._view, self._source = hf_arguments(args, self.owner.metric_directions), args
        return self._view

    def wrap(self, event: str, method: Callable) -> HFListener:
        """`method` called with the HF view of its arguments."""
        return HFListener(self, event, method)


class HFListener:
    """One transformers callback's handler of one event, called through the view (a plain
    object rather than a closure, so a handler holding it can be pickled for `ddp_spawn`)."""

    def __init__(self, view: HFView, event: str, method: Callable) -> None:
        self.view, self.fresh, self.__wrapped__ = view, event == "on_train_begin", method

    def __call__(self, args, state, control, **kwargs):
        for key in ("metrics", "logs"):
            if key in kwargs:
                kwargs[key] = hf_values(kwargs[key])
        return self.__wrapped__(self.view.args(args, self.fresh), state, control, **kwargs)
