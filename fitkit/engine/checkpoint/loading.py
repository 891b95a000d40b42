"""Reading a checkpoint back: the weights and optimizer state (refused when written for another
model or optimizer), and the `TrainerState` it recorded.

Usage::

    rest = load_checkpoint(fabric, path, module=m, optimizer=o)   # refused when it does not fit
    warn_on_resume(args, state, saved_state(path))                # HF's warnings on a resume

A checkpoint is verified (`fitkit.engine.checkpoint.verify`) before it is loaded; loading one
whatever number of processes wrote it is `fitkit.engine.checkpoint.elastic`.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from fitkit.common.options import error_line
from fitkit.engine.checkpoint.elastic import load_state, saved_layout
from fitkit.engine.checkpoint.layout import MANIFEST, STATE_FILE, WEIGHTS, CheckpointError
from fitkit.engine.checkpoint.writing import optimizer_class
from fitkit.events.state import TrainerState

logger = logging.getLogger("fitkit")


_FIX_MISMATCH = (
    "resume with the same model and optimizer, or start a fresh `output_dir` (or `resume_from_checkpoint=False`)")


def load_checkpoint(fabric, path: str, *, module, optimizer) -> dict[str, Any]:
    """Restore module and optimizer in place; return the rest of the payload.

    Loading is weights-only: a file carrying pickled code is refused before anything runs. A
    checkpoint written for another model (parameter names or shapes) or another optimizer class
    is refused before anything is loaded, so the module keeps its weights; a CheckpointError names
    the checkpoint, what differs and the fix.
    """
    weights = os.path.join(path, WEIGHTS)
    try:
        check_fits(path, module=module, optimizer=optimizer)
        remainder = load_state(fabric, weights, module=module, optimizer=optimizer, strict=optimizer is not None)
    except CheckpointError:
        raise
    except Exception as err:
        if "weights_only" in str(err) or "Unsupported global" in str(err) or "pickle" in str(err).lower():
            raise CheckpointError(
                f"refusing to load {weights!r}: it holds pickled objects that are not plain tensors or "
                f"primitive values (weights-only loading). Details: {str(err).splitlines()[0]}"
            ) from None
        raise CheckpointError(f"cannot resume from {path!r}: loading it into this model and optimizer failed "
                              f"({error_line(err)}); {_FIX_MISMATCH}") from err
    return remainder


def check_fits(path: str, *, module, optimizer) -> None:
    """Raise CheckpointError when the checkpoint at `path` was written for another optimizer class
    or another set of parameter names and shapes (read from the file memory-mapped, or from the
    shards' metadata: the tensors' data is not read)."""
    saved_class = _manifest(path).get("optimizer")
    current = optimizer_class(optimizer)
    if optimizer is not None and saved_class and saved_class != current:
        raise CheckpointError(f"cannot resume from {path!r}: it was written with the optimizer {saved_class} and "
                              f"this run uses {current}; {_FIX_MISMATCH}")
    weights = os.path.join(path, WEIGHTS)
    try:
        payload = saved_layout(weights)  # one file or DCP shards: names and shapes, not the data
    except Exception as err:
        if "weights_only" in str(err) or "Unsupported global" in str(err) or "pickle" in str(err).lower():
            raise
        raise CheckpointError(f"cannot read {weights!r}: the file is truncated or corrupted ({error_line(err)}); "
                              "resume from an earlier checkpoint or delete this one") from None
    if payload is None:  # another layout (e.g. DeepSpeed's directory): checked by loading
        return
    if not isinstance(payload, dict):
        raise CheckpointError(f"cannot read {weights!r}: it does not hold a fitkit checkpoint's contents; "
                              "resume from an earlier checkpoint or delete this one")
    problems = _state_differences(payload.get("model") or {}, module.state_dict())
    if problems:
        raise CheckpointError(f"cannot resume from {path!r}: it holds the weights of another model ({problems}); "
                              f"{_FIX_MISMATCH}")
    if optimizer is not None and not saved_class and isinstance(payload.get("optimizer"), dict):
        problem = _optimizer_difference(payload["optimizer"], optimizer.state_dict())
        if problem:
            raise CheckpointError(f"cannot resume from {path!r}: {problem}; {_FIX_MISMATCH}")


def holds_optimizer(path: str) -> bool:
    """False for a fitkit checkpoint written without the optimizer's state (`save_only_model`: its
    manifest records the optimizer as null); a manifest that does not record it at all holds it."""
    manifest = _manifest(path)
    return "optimizer" not in manifest or manifest["optimizer"] is not None


def _manifest(path: str) -> dict:
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        return manifest if isinstance(manifest, dict) else {}
    except (OSError, ValueError):
        return {}


def _state_differences(saved: dict, current: dict, most: int = 6) -> str:
    """What differs between two state dicts' names and shapes, said briefly ("" for nothing)."""
    def shape(value: Any) -> tuple | None:
        return tuple(value.shape) if hasattr(value, "shape") else None

    missing = [k for k in current if k not in saved]
    unexpected = [k for k in saved if k not in current]
    reshaped = [k for k in current if k in saved and shape(current[k]) != shape(saved[k])]

    def listed(keys: list[str], show) -> str:
        more = f" and {len(keys) - most} more" if len(keys) > most else ""
        return ", ".join(show(k) for k in keys[:most]) + more

    parts = []
    if reshaped:
        parts.append("other shapes: " + listed(reshaped, lambda k: f"{k} {shape(saved[k])} in the checkpoint, "
                                                                     f"{shape(current[k])} in this model"))
    if missing:
        parts.append("not in the checkpoint: " + listed(missing, lambda k: f"{k} {shape(current[k])}"))
    if unexpected:
        parts.append("not in this model: " + listed(unexpected, lambda k: f"{k} {shape(saved[k])}"))
    return "; ".join(parts)


def _optimizer_difference(saved: dict, current: dict) -> str:
    """How a saved optimizer state differs from the current optimizer's ("" when it fits): the
    parameter groups and their sizes, and the settings (another class has other settings)."""
    old, new = saved.get("param_groups") or [], current.get("param_groups") or []
    if [len(g.get("params", ())) for g in old] != [len(g.get("params", ())) for g in new]:
        return (f"its optimizer has parameter groups of {[len(g.get('params', ())) for g in old]} parameters and this "
                f"one {[len(g.get('params', ())) for g in new]}")
    ignore = {"params", "initial_lr"}  # initial_lr: added by a scheduler
    for a, b in zip(old, new):
        if set(a) - ignore != set(b) - ignore:
            return (f"it was written by another optimizer class (settings {sorted(set(a) - ignore)}; this optimizer "
                    f"has {sorted(set(b) - ignore)})")
    return ""


def saved_state(path: str) -> TrainerState:
    """The `TrainerState` a checkpoint recorded (`trainer_state.json`); CheckpointError when unreadable."""
    try:
        return TrainerState.load_from_json(os.path.join(path, STATE_FILE))
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path!r} is damaged: {STATE_FILE} cannot be read ({error_line(err)}); "
                              "resume from an earlier checkpoint or delete this one") from None


def checkpoint_differences(args: Any, state: Any, saved: Any) -> list[str]:
    """What a resumed run plans otherwise than the checkpoint's `trainer_state.json` recorded
    (HF's `compare_trainer_and_checkpoint_args`): logging / eval / save steps and the
    per-device batch size, one line each (`state`: this run's plan, `saved`: the checkpoint's)."""
    lines = []
    for name in ("logging_steps", "eval_steps", "save_steps"):
        now, then = getattr(state, name, None), getattr(saved, name, None)
        if now is not None and then is not None and now != then:
            lines.append(f"{name}: {now} (from args) != {then} (from trainer_state.json)")
    now, then = getattr(args, "per_device_train_batch_size", None), getattr(saved, "train_batch_size", None)
    if now is not None and then is not None and now != then:
        lines.append(f"per_device_train_batch_size: {now} (from args) != {then} (from trainer_state.json)")
    return lines


def warn_on_resume(args: Any, state: Any, saved: Any) -> None:
    """Warn, as HF does, when the resumed run's step intervals or batch size differ from the
    checkpoint's, and forget a recorded best checkpoint that no longer exists."""
    lines = checkpoint_differences(args, state, saved)
    if lines:
        logger.warning("The following arguments do not match the ones in the `trainer_state.json` within the "
                       "checkpoint directory: \n\t%s", "\n\t".join(lines))
    best = getattr(state, "best_model_checkpoint", None)
    if best is not None and not os.path.isdir(best):
        logger.warning("The best checkpoint %s recorded in the resumed state does not exist anymore. Ignoring it "
                       "for this run.", best)
        state.best_model_checkpoint = None

