"""Hugging Face `TrainingArguments` names fitkit reads, with no fitkit import: HF's field
defaults, the `optim` names torch can build, and `hf_options`, which rewrites HF-only option
names to fitkit's and sets aside the HF fields fitkit cannot honour::

    hf_options({"fp16": True, "disable_tqdm": True}, known={"precision", "verbose"})
    # ({"precision": "16-mixed", "verbose": 0}, [])

transformers is imported only when needed: `hf_defaults()` (a callback from transformers is in
the run, or `args=` is a transformers object), or an option fitkit does not know that may be an
HF field.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import warnings
from collections.abc import Collection
from typing import Any

#: HF `optim` names torch can build, as fitkit optimizer names ("adafactor": torch's class).
HF_OPTIMIZERS: dict[str, str] = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "sgd": "sgd",
    "adagrad": "adagrad", "rmsprop": "rmsprop", "adafactor": "adafactor", "adam": "adam",
}


@functools.lru_cache(maxsize=1)
def hf_defaults() -> dict[str, Any]:
    """HF's `TrainingArguments` field defaults (read off the dataclass, nothing run), or {} when
    transformers is not installed."""
    if importlib.util.find_spec("transformers") is None:
        return {}
    try:
        from transformers import TrainingArguments as HFTrainingArguments
    except ImportError:
        return {}
    defaults = {}
    for f in dataclasses.fields(HFTrainingArguments):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    return defaults


@functools.lru_cache(maxsize=4)
def built_defaults(cls: Any) -> dict[str, Any]:
    """The field values of `cls()` (a `transformers.TrainingArguments` class or subclass, such
    as `Seq2SeqTrainingArguments`), as HF's `__post_init__` leaves them: what a field that was
    not given holds."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = cls()
    return {f.name: getattr(built, f.name) for f in dataclasses.fields(built)}


@functools.lru_cache(maxsize=1)
def seq2seq_fields() -> frozenset[str]:
    """The fields `Seq2SeqTrainingArguments` adds to HF's `TrainingArguments` (empty without transformers)."""
    if not hf_defaults():
        return frozenset()
    from transformers import Seq2SeqTrainingArguments

    return frozenset(f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)) - frozenset(hf_defaults())


#: HF flags fitkit reads as one of its own fields (flag -> field), and the value when the flag is True.
_HF_ONLY = {"fp16": "precision", "bf16": "precision", "disable_tqdm": "verbose", "use_cpu": "accelerator"}
_WHEN_TRUE = {"fp16": "16-mixed", "bf16": "bf16-mixed", "disable_tqdm": 0, "use_cpu": "cpu"}
#: The fitkit field each HF-only flag sets (public: `TrainingArguments.replace` records it as set).
HF_ONLY_TARGETS = dict(_HF_ONLY)


def hf_options(options: dict[str, Any], known: Collection[str]) -> tuple[dict[str, Any], list[str]]:
    """`options` with HF-only names rewritten to fitkit's (`fp16=True` -> `precision="16-mixed"`,
    `bf16=True` -> `"bf16-mixed"`, `disable_tqdm=True` -> `verbose=0`, `use_cpu=True` ->
    `accelerator="cpu"`; False leaves fitkit's default), and the names of the HF fields outside
    `known` (the names fitkit takes), which are removed from the options. Names neither fitkit
    nor HF knows are left for the caller's error."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        target = _HF_ONLY.get(key)
        if target is None:
            out[key] = value
            continue
        if not isinstance(value, bool):
            raise ValueError(f"`{key}`={value!r} is invalid: pass True or False")
        if value:
            new = _WHEN_TRUE[key]
            if options.get(target) not in (None, new) or out.get(target) not in (None, new):
                raise ValueError(f"`{key}`=True and `{target}`={options.get(target, out.get(target))!r} disagree: "
                                 "pass only one of them")
            out[target] = new
    unknown = [k for k in out if k not in known]
    ignored = [k for k in unknown if k in hf_defaults() or k in seq2seq_fields()] if unknown else []
    for key in ignored:
        del out[key]
    return out, ignored


def warn_unhonoured(names: list[str], where: str = "options", stacklevel: int = 4) -> None:
    """One warning naming every HF field fitkit cannot honour."""
    if names:
        warnings.warn(
            f"fitkit cannot honour these Hugging Face {where}, which are ignored: {', '.join(sorted(names))} "
            "(see docs/migrating-from-hf.md for what fitkit does instead)",
            UserWarning, stacklevel=stacklevel,
        )
