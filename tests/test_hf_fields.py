"""Every field of the installed transformers' `TrainingArguments` and `Seq2SeqTrainingArguments`
is honoured by `fit(args=...)` or named in its warning (issue 35): the test goes through
`dataclasses.fields`, so a field a new transformers adds fails here until fitkit handles it."""

import dataclasses
import enum
import os
import re
import typing
import warnings

import pytest

from fitkit.config.hf_arguments import APPLIED_BY_TRANSFORMERS, NOT_TRAINER_FIELDS, from_hf

transformers = pytest.importorskip("transformers")

#: Values other than the default for fields whose values are names from a set.
CHOSEN = {"eval_strategy": "epoch", "logging_strategy": "epoch", "save_strategy": "epoch",
          "lr_scheduler_type": "cosine", "optim": "sgd", "report_to": ["tensorboard"], "hub_strategy": "end",
          "log_level": "info", "log_level_replica": "info", "fsdp": "full_shard", "debug": "underflow_overflow",
          "include_for_metrics": ["inputs"], "output_dir": "elsewhere", "torch_compile_mode": "reduce-overhead",
          "torch_compile_backend": "eager"}


DECLARED = typing.get_type_hints(transformers.Seq2SeqTrainingArguments)


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
    # the declared type: HfArgumentParser (the example ports use it) rewrites `field.type` of the
    # dataclass in place, `dict | str | None` becoming `str`, so a test after it would see another type
    kind = str(DECLARED.get(field.name, field.type))
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
        if field.name in NOT_TRAINER_FIELDS or field.name in APPLIED_BY_TRANSFORMERS:
            continue  # read by the example scripts (the Trainer does not act on them either), or by transformers
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


DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "migrating-from-hf.md")
TESTS = os.path.dirname(os.path.abspath(__file__))


def listed_fields():
    """The fields of docs/migrating-from-hf.md's table of the fields fitkit does not honour, each
    with its reason: {field: reason}."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    table = text.split("### The fields fitkit does not honour", 1)[1].split("\n## ", 1)[0]
    listed = {}
    for line in table.splitlines():
        if line.startswith("| `"):
            names, reason = line.strip("|").split(" | ", 1)
            for name in re.findall(r"`([a-z0-9_]+)`", names):
                listed[name] = reason.strip(" |")
    return listed


def named_in_a_test(name):
    """True when a test other than this file names the field (in quotes or as a keyword)."""
    pattern = re.compile(rf"[\"']{name}[\"']|\b{name}=")
    for file in os.listdir(TESTS):
        if file.endswith(".py") and file != os.path.basename(__file__):
            with open(os.path.join(TESTS, file), encoding="utf-8") as f:
                if pattern.search(f.read()):
                    return True
    return False


def test_every_field_is_honoured_and_tested_or_listed_with_its_reason():
    listed = listed_fields()
    assert all(listed.values()), "a listed field without its reason"
    defaults = transformers.Seq2SeqTrainingArguments(output_dir="out", report_to="none")
    honoured, warned, untested = [], [], []
    for field in dataclasses.fields(defaults):
        if field.name in NOT_TRAINER_FIELDS:
            assert field.name in listed
            continue
        try:
            _, messages = build(**{field.name: other_value(field, getattr(defaults, field.name))})
        except ValueError:  # refused by fitkit's checks, naming it: acted on
            messages = []
        if any(field.name in m for m in messages):
            warned.append(field.name)
        else:
            honoured.append(field.name)
            if not named_in_a_test(field.name):
                untested.append(field.name)
    assert sorted(set(warned) - set(listed)) == [], "warned about but not listed in the doc with a reason"
    assert sorted(set(listed) & set(honoured)) == [], "listed in the doc, yet honoured"
    assert untested == [], f"honoured, but no test names them: {untested}"
    print(f"\nTrainingArguments fields: {len(honoured)} honoured, {len(listed)} listed "
          f"({len(NOT_TRAINER_FIELDS)} of them the scripts' own)")
