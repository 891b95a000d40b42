"""The `jit_compile` option (Keras' name): whether, and how, the module is `torch.compile`d.

    jit_problem("max-autotune")                 # None: a valid value
    jit_problem("fast")                         # "use 'auto' (...), ...": the fix the error gives
    jit_kwargs("auto"), jit_kwargs(False)       # None, None: run eagerly
    jit_kwargs(True)                            # {}: torch.compile(module)
    jit_kwargs("max-autotune")                  # {"mode": "max-autotune"}
    jit_kwargs({"mode": "default", "fullgraph": True})  # the dict, as torch.compile keywords
    jit_label({"mode": "max-autotune"})         # "torch.compile(mode='max-autotune')"
    jit_note(True)                              # ("jit_compile: torch.compile()",): summary's line

`"auto"` (the default) resolves to no compilation, as in Keras 3's torch backend: on CPU,
compiling a small model made its steps slower (610 vs 540 us measured here), and the first
steps of every compiled run pay the compilation. torch is imported only to list the keywords
`torch.compile` takes, when a dict is checked.
"""

from __future__ import annotations

import inspect
from typing import Any

from fitkit.common.options import did_you_mean

#: The `mode` strings torch.compile takes.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
VALID = "'auto' (default: no compilation), False, True, a mode string, or a dict of torch.compile keywords"


def compile_keywords() -> list[str]:
    """The keyword arguments `torch.compile(module, ...)` takes (read off its signature)."""
    import torch

    params = list(inspect.signature(torch.compile).parameters.values())
    return [p.name for p in params[1:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def jit_problem(value: Any) -> str | None:
    """What to pass instead of an invalid `jit_compile` value (the fix of the error), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if value == "auto" or value in MODES:
            return None
        return f"{did_you_mean(value, ('auto', *MODES))}use {VALID}; the modes are {list(MODES)}"
    if isinstance(value, dict):
        valid = compile_keywords()
        unknown = [k for k in value if k not in valid]
        if unknown:
            return (f"{did_you_mean(unknown, valid)}unknown torch.compile keyword(s) {unknown}; "
                    f"valid keys are: {', '.join(valid)}")
        mode = value.get("mode")
        if mode is not None and mode not in MODES:
            return f"{did_you_mean(mode, MODES)}the dict's 'mode' {mode!r} is not one of {list(MODES)}"
        return None
    return f"use {VALID}"


def jit_kwargs(value: Any) -> dict[str, Any] | None:
    """The keywords of `torch.compile(module, **kwargs)` for a valid `jit_compile`, or None to
    run the module as it is ("auto" and False)."""
    if value is False or (isinstance(value, str) and value == "auto"):
        return None
    if value is True:
        return {}
    if isinstance(value, str):
        return {"mode": value}
    return dict(value)


def jit_label(value: Any) -> str | None:
    """How a summary shows the setting, e.g. "torch.compile(mode='max-autotune')"; None when off."""
    kwargs = jit_kwargs(value)
    if kwargs is None:
        return None
    shown = ", ".join(f"{k}={getattr(v, '__qualname__', None) or v!r}" if callable(v) else f"{k}={v!r}"
                      for k, v in kwargs.items())
    return f"torch.compile({shown})"


def jit_note(value: Any) -> tuple[str, ...]:
    """The summary's line for the setting, e.g. ("jit_compile: torch.compile(mode='max-autotune')",);
    () when off, so the summary is unchanged."""
    label = jit_label(value)
    return () if label is None else (f"jit_compile: {label}",)
