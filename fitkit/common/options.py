"""Checking what users pass: close-match suggestions for unknown names, numbers given as text,
and the file-system check of `output_dir` made before a run writes anything.

    did_you_mean("epoch", ["epochs", "seed"])        # "did you mean 'epochs'? "
    did_you_mean("xyz", ["epochs", "seed"])          # ""
    parse_number("1e-3", float)                      # 0.001
    parse_number("3", int), parse_number(True, int)  # 3, None

Messages lead with the suggestion, then say what was wrong and list the valid names, e.g.
"did you mean 'epochs'? unknown option 'epoch'; valid options are: ...". This module imports
nothing from fitkit, so every layer may use it.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Iterable
from typing import Any

#: What `fit` documents as "not given" with None: its own parameters, whose defaults are
#: compile's options (else the `TrainingArguments` defaults). Any other option set to None is
#: the value None.
FIT_DEFAULTS = ("batch_size", "epochs", "shuffle", "max_steps")


def closest(value: Any, choices: Iterable[Any]) -> str | None:
    """The choice closest to `value` (case-insensitive, difflib's ratio >= 0.6), or None."""
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(str(choice).lower(), str(choice))
    text = str(value).lower()
    if text in by_lower:
        return by_lower[text]
    found = difflib.get_close_matches(text, list(by_lower), n=1, cutoff=0.6)
    return by_lower[found[0]] if found else None


def did_you_mean(value: Any, choices: Iterable[Any]) -> str:
    """"did you mean 'x'? " for the closest choice, or "" when none is close; for several
    unknown values, "did you mean 'x' for 'a', 'y' for 'b'? "."""
    choices = list(choices)
    if isinstance(value, (list, tuple, set)):
        pairs = [(v, closest(v, choices)) for v in value]
        pairs = [(v, m) for v, m in pairs if m is not None]
        if len(value) == 1 and pairs:
            return f"did you mean {pairs[0][1]!r}? "
        return ("did you mean " + ", ".join(f"{m!r} for {v!r}" for v, m in pairs) + "? ") if pairs else ""
    match = closest(value, choices)
    return f"did you mean {match!r}? " if match is not None else ""


def unknown_name(what: str, value: Any, argument: str, valid: Iterable[Any], extra: str = "") -> str:
    """The message for a name that is not one of `valid`, e.g. "did you mean 'ddp'? unknown
    strategy 'ddpp' for `strategy`; valid names are: auto, ddp, ..." (`extra` is appended)."""
    valid = [str(v) for v in valid]
    return (f"{did_you_mean(value, valid)}unknown {what} {value!r} for `{argument}`; "
            f"valid names are: {', '.join(valid)}{extra}")


def parse_number(value: Any, kind: type) -> int | float | None:
    """`value` as an int (`kind=int`) or a finite float (`kind=float`) when it is one without
    doubt: a number of that kind (NumPy's included; a bool is not a number here; a float is not
    an int), or a string that spells one ("3", "1e-3", as HF's command line gives them).
    Anything else gives None."""
    exact = type(value)  # the common cases first: every field of TrainingArguments passes here
    if exact is int and kind is int:
        return value
    if exact is float and kind is float:
        return value if math.isfinite(value) else None
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = kind(value.strip())
        except ValueError:
            return None
    if kind is int:
        return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def writes_to_output_dir(args: Any) -> bool:
    """True when a run with these `TrainingArguments` writes under `output_dir`: checkpoints
    (`save_strategy`, `save_on_sigterm`), a resume that looks there, or trackers (`report_to`)."""
    report_to = args.report_to
    names = [report_to] if isinstance(report_to, str) else list(report_to or ())
    trackers = any(str(n).strip().lower() != "none" for n in names)
    return args.save_strategy != "no" or bool(args.save_on_sigterm) or args.resume_from_checkpoint is True or trackers


def check_output_dir(args: Any) -> None:
    """`output_dir` must be a folder, or not exist yet, when the run will write there: raised
    before anything is trained or written."""
    path = args.output_dir
    if writes_to_output_dir(args) and os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"`output_dir`={path!r} is an existing file, not a folder, and this run writes checkpoints or logs "
            "there: pass the path of a folder (it is created when missing), or save_strategy='no' and "
            "report_to='none' to write nothing"
        )


def error_line(err: BaseException) -> str:
    """An exception in one line for a message that wraps it: "RuntimeError: <its first line>"."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__

#: The keys a dict batch's target may be under (HF's "labels" first).
LABEL_KEYS = ("labels", "label", "y", "targets", "target")
