"""Every field of the installed transformers' `TrainingArguments` and `Seq2SeqTrainingArguments`
is honoured by `fit(args=...)` or named in its warning (issue 35): the test goes through
`dataclasses.fields`, so a field a new transformers adds fails here until fitkit handles it."""

import dataclasses
import enum
import warnings

import pytest

from fitkit.config.hf_arguments import NOT_TRAINER_FIELDS, from_hf

transformers = pytest.importorskip("transformers")

#: Values other than the default for fields whose values are names from a set.
CHOSEN = {"eval_strategy": "epoch", "logging_strategy": "epoch", "save_strategy": "epoch",
          "lr_scheduler_type": "cosine", "optim": "sgd", "report_to": ["tensorboard"], "hub_strategy": "end",
          "log_level": "info", "log_level_replica": "info", "fsdp": "full_shard", "debug": "underflow_overflow",
          "include_for_metrics": ["inputs"], "output_dir": "elsewhere"}


def other_value(field, default):
    """A value of the field's type that differs from its default."""
    if field.name in CHOSEN:
        return CHOSEN[field.name]
    default = default.value if isinstance(default, enum.Enum) else default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return default + 0.25 if default < 0.5 else default / 2
    if isinstance(default, str):
        return default + "_x" if default else "custom"
    if isinstance(default, (dict, list)):
        return {"k": 1} if isinstance(default, dict) else ["x"]
    kind = str(field.type)
    for word, value in (("bool", True), ("int", 3), ("float", 0.5), ("dict", {"k": 1})):
        if word in kind:
            return value
    return "custom"


def build(**values):
    args = transformers.Seq2SeqTrainingArguments(output_dir="out", report_to="none")
    for name, value in values.items():
        object.__setattr__(args, name, value)  # past HF's own checks: only fitkit's reading is tested
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = from_hf(args)
    return ours, [str(w.message) for w in caught]


def test_default_arguments_warn_about_nothing():
    _, messages = build()
    assert messages == []


def test_every_field_is_honoured_or_named_in_one_warning():
    reference, _ = build()
    defaults = transformers.Seq2SeqTrainingArguments(output_dir="out", report_to="none")
    silent, several = [], []
    for field in dataclasses.fields(defaults):
        if field.name in NOT_TRAINER_FIELDS:  # read by the example scripts; the Trainer does not act on them either
            continue
        try:
            ours, messages = build(**{field.name: other_value(field, getattr(defaults, field.name))})
        except ValueError as err:  # refused by fitkit's checks, naming it: acted on
            assert field.name in str(err)
            continue
        if len(messages) > 1:
            several.append(field.name)
        if ours == reference and not any(field.name in m for m in messages):
            silent.append(field.name)
    assert silent == [], f"neither honoured nor warned about: {silent}"
    assert several == [], f"more than one warning: {several}"
