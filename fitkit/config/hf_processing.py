"""`processing_class=` (HF's tokenizer or processor, also given as the older `tokenizer=`): the
default collator becomes HF's padding collator for it, and it is saved beside the model::

    model.fit(train_ds, validation_data=eval_ds, processing_class=tokenizer, epochs=3)
    # batches padded by DataCollatorWithPadding(tokenizer); checkpoints hold the tokenizer files

`check_habit_fields` checks the `TrainingArguments` fields of these HF habits
(`remove_unused_columns`, `processing_class`, `exclude_from_weight_decay`) once, when the
arguments are built. transformers is imported only when a collator is built for a tokenizer.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, NoReturn


def check_habit_fields(args: Any, fail: Callable[[str, str], NoReturn]) -> None:
    """The checks of `remove_unused_columns`, `processing_class` and `exclude_from_weight_decay`."""
    if not isinstance(args.remove_unused_columns, bool):
        fail("remove_unused_columns", "pass True (drop the columns forward() does not take) or False")
    pc = args.processing_class
    if pc is not None and not (callable(getattr(pc, "save_pretrained", None)) or callable(getattr(pc, "pad", None))):
        fail("processing_class", "pass a Hugging Face tokenizer, feature extractor or processor (it has "
             "save_pretrained()), or None")
    if args.batch_eval_metrics and not _takes_compute_result(args.compute_metrics):
        fail("batch_eval_metrics", "`compute_metrics` must then take a `compute_result` argument, True at the last "
             "batch, when it returns the metrics: `def compute_metrics(eval_pred, compute_result=False)`")
    problem = check_exclusions(args.exclude_from_weight_decay)
    if problem:
        fail("exclude_from_weight_decay", problem)


def _takes_compute_result(compute_metrics: Any) -> bool:
    """Whether `compute_metrics` (None passes) names a `compute_result` parameter, as the Trainer
    requires under `batch_eval_metrics` (one whose signature cannot be read passes)."""
    try:
        return compute_metrics is None or "compute_result" in inspect.signature(compute_metrics).parameters
    except (TypeError, ValueError):
        return True


def check_exclusions(value: Any) -> str | None:
    """What is wrong with an `exclude_from_weight_decay` value, or None when it is valid."""
    if value is None or value in ("hf", "none"):
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as err:
                return f"{pattern!r} is not a regular expression ({err})"
        return None
    return "pass 'hf' (HF's groups), a list of regular expressions of parameter names, [] or 'none', or None"


def is_tokenizer_like(processing_class: Any) -> bool:
    """True for what HF's Trainer pads with `DataCollatorWithPadding`: a tokenizer or a feature
    extractor (anything with a `pad` method); a processor gets the plain collation."""
    return callable(getattr(processing_class, "pad", None))


@functools.lru_cache(maxsize=8)
def _padding_collator(processing_class: Any) -> Callable:
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(processing_class)


def default_collator(args: Any) -> Callable | None:
    """The collator of a loader fitkit builds: `data_collator` when given, else HF's
    `DataCollatorWithPadding(processing_class)` for a tokenizer, else None (fitkit's default)."""
    collator = getattr(args, "data_collator", None)
    if collator is not None:
        return collator
    pc = getattr(args, "processing_class", None)
    if pc is not None and is_tokenizer_like(pc):
        try:
            return _padding_collator(pc)
        except TypeError:  # an unhashable processing class: built each time
            from transformers import DataCollatorWithPadding

            return DataCollatorWithPadding(pc)
    return None


def save_processing_class(args: Any, directory: str) -> None:
    """Save `args.processing_class` into `directory` as HF does (`save_pretrained`), when given."""
    pc = getattr(args, "processing_class", None)
    save = getattr(pc, "save_pretrained", None)
    if callable(save):
        save(directory)
