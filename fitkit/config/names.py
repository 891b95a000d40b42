"""The other names an option of `TrainingArguments` goes by, resolved in one place.

Keras and Hugging Face users reach for `epochs`, `batch_size`, `lr`, `evaluation_strategy`,
`fp16`, ...; `canonical` maps them to fitkit's field names (the constructor, `from_options`
and `replace` all go through it), and `named_as_given` words an error about a value in the name
the user wrote::

    canonical({"epochs": 3, "lr": 1e-3}, TrainingArguments.names())
    # {'num_train_epochs': 3, 'learning_rate': 0.001}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from fitkit.common.options import did_you_mean

T = TypeVar("T")

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

#: Keras `fit` and `compile` arguments with no fitkit equivalent, and the fitkit way to say what
#: they mean.
KERAS_ONLY = {
    "workers": "load data in parallel with a DataLoader's `num_workers` (fit(DataLoader(dataset, num_workers=4)))",
    "use_multiprocessing": "load data in worker processes with a DataLoader's `num_workers`",
    "max_queue_size": "a DataLoader's `prefetch_factor` (with `num_workers` > 0) sets how many batches wait",
    "steps_per_execution": "every step is its own call here (no compiled graph runs several steps at once) and "
                           "batch callbacks see every step: leave it out",
    "auto_scale_loss": "with `precision=\"16-mixed\"` the loss is scaled for you (a gradient scaler); bf16 and 32-bit "
                       "need none: leave it out",
}


def canonical(options: dict[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """`options` by field name (`known`: the field names): the aliases and Hugging Face's names
    resolved. An unknown option (even set to None) raises `TypeError` suggesting the closest
    valid name, then listing them all; a Keras option fitkit does not take says what to do instead."""
    known = set(known)
    values: dict[str, Any] = {}
    if not known >= options.keys():  # HF names: fp16 -> precision, ...; HF fields fitkit lacks: warned
        from fitkit.config.hf_names import hf_options, warn_unhonoured

        options, ignored = hf_options(options, known | set(ALIASES) | set(KERAS_ONLY))
        warn_unhonoured(ignored)
    for key, value in options.items():
        name = ALIASES.get(key, key)
        if name in KERAS_ONLY:
            raise TypeError(f"`{key}` is a Keras option fitkit does not take: {KERAS_ONLY[name]}")
        if name not in known:
            valid = sorted(known | set(ALIASES))
            raise TypeError(f"{did_you_mean(key, valid)}unknown option {key!r}; "
                            f"valid options are: {', '.join(valid)}")
        if name in values:
            other = next(k for k in options if ALIASES.get(k, k) == name and k != key)
            raise TypeError(f"`{other}` and `{key}` are the same option: pass only one of them")
        values[name] = value
    return values


def named_as_given(options: dict[str, Any], build: Callable[[], T]) -> T:
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
