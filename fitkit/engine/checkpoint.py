"""Checkpoints: `Checkpointer` (one run's save, rotation, best model and resume) over the I/O
below it (atomic writes of `output_dir/checkpoint-{global_step}/` through `fabric.save`).

A checkpoint is written under a temporary name and renamed when complete, with a manifest
written last; a directory without a valid manifest is never treated as a checkpoint.

    checkpointer = Checkpointer(fabric, args, state, handler, module=m, optimizer=o, scheduler=s)
    snapshot = checkpointer.resume(checkpointer.resume_path(callbacks))   # or None: a fresh run
    path = checkpointer.save(loop.snapshot(), control)                    # when control.should_save
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import fields
from typing import Any, Iterable

from fitkit.callbacks.base import TrainerControl, TrainerState
from fitkit.engine.rng import rng_state, set_rng_state  # noqa: F401 - set_rng_state: part of this module's API
from fitkit.engine.snapshot import LoopSnapshot
from fitkit.options import error_line

FORMAT_VERSION = 1
MANIFEST = "fitkit_checkpoint.json"
STATE_FILE = "trainer_state.json"
ARGS_FILE = "training_args.json"
WEIGHTS = "state.pt"
_NAME = re.compile(r"^checkpoint-(\d+)$")
logger = logging.getLogger("fitkit")

#: `TrainerState` fields a run sets from its own arguments and processes; a resume restores
#: every other field (the progress: step, epoch, logs, best model, callback states, ...).
PLAN_FIELDS = frozenset({
    "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
    "is_local_process_zero", "is_world_process_zero", "is_hyper_param_search", "trial_name", "trial_params",
})


class Checkpointer:
    """One run's checkpoints: writes them (into `output_dir`, or another directory for a
    callback such as `BackupAndRestore`), rotates them without losing the best one, resumes
    from one and loads the best model at the end when asked."""

    def __init__(self, fabric: Any, args: Any, state: TrainerState, handler: Any, *, module: Any, optimizer: Any,
                 scheduler: Any = None):
        self.fabric, self.args, self.state, self.handler = fabric, args, state, handler
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler
        self.last: str | None = None  # the newest checkpoint written into `output_dir`

    def save(self, snapshot: LoopSnapshot, control: TrainerControl, directory: str | None = None,
             limit: int | None = None) -> str:
        """Write a resumable checkpoint into `directory` (default `output_dir`) and rotate:
        `save_total_limit` in `output_dir` (never the best one), `limit` elsewhere."""
        own = directory is None
        directory = self.args.output_dir if own else directory
        state = self.state
        state.stateful_callbacks = self.handler.export_states(control)
        if own and state.best_global_step == state.global_step:  # this checkpoint holds the best model
            state.best_model_checkpoint = checkpoint_path(directory, state.global_step)
        extra = {"rng": rng_state(), "loop": snapshot.to_payload()}
        path = save_checkpoint(self.fabric, directory, state=state, args=self.args, module=self.module,
                               optimizer=self.optimizer, scheduler=self.scheduler, extra=extra)
        if self.fabric.is_global_zero:
            if own:
                rotate(directory, self.args.save_total_limit, keep=state.best_model_checkpoint)
            else:
                rotate(directory, limit)
        if own:
            self.last = path
        return path

    def resume_path(self, callbacks: Iterable[Any]) -> str | None:
        """`resume_from_checkpoint` resolved, else a checkpoint a callback offers through
        `checkpoint_to_resume(args)` (e.g. `BackupAndRestore`), else None."""
        if self.args.resume_from_checkpoint:
            return resolve(self.args.resume_from_checkpoint, self.args.output_dir)
        for cb in callbacks:
            offer = getattr(cb, "checkpoint_to_resume", None)
            path = offer(self.args) if callable(offer) else None
            if path:
                return path
        return None

    def resume(self, path: str | None) -> LoopSnapshot | None:
        """Load `path` into the module, optimizer, scheduler and state; return where the loop
        continues (None for no path: a fresh run)."""
        if path is None:
            return None
        payload = load_checkpoint(self.fabric, path, module=self.module, optimizer=self.optimizer)
        if self.scheduler is not None and "scheduler" in payload:
            self.scheduler.load_state_dict(payload["scheduler"])
        saved = TrainerState.load_from_json(os.path.join(path, STATE_FILE))
        for f in fields(TrainerState):
            if f.name not in PLAN_FIELDS:
                setattr(self.state, f.name, getattr(saved, f.name))
        logger.info("resuming from %s at step %d", path, self.state.global_step)
        return LoopSnapshot.from_payload(payload["loop"], rng=payload["rng"], callbacks=self.state.stateful_callbacks)

    def load_best(self) -> None:
        """With `load_best_model_at_end`, put the best checkpoint's weights back into the module."""
        if self.args.load_best_model_at_end and self.state.best_model_checkpoint:
            load_checkpoint(self.fabric, self.state.best_model_checkpoint, module=self.module, optimizer=None)


def _files(path: str) -> dict[str, int]:
    out = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = os.path.getsize(full)
    return out


def checkpoint_path(output_dir: str, global_step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{global_step}")


def save_checkpoint(fabric, output_dir: str, *, state, args, module, optimizer, scheduler=None,
                    extra: dict[str, Any] | None = None) -> str:
    """Write a complete checkpoint for `state.global_step` and return its final path."""
    final = checkpoint_path(output_dir, state.global_step)
    tmp = os.path.join(output_dir, f".tmp-checkpoint-{state.global_step}")
    if fabric.is_global_zero:
        os.makedirs(output_dir, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    fabric.barrier()
    payload: dict[str, Any] = {"model": module}
    if optimizer is not None:
        payload["optimizer"] = optimizer
    if scheduler is not None:
        payload["scheduler"] = scheduler.state_dict()
    if extra:
        payload.update(extra)
    fabric.save(os.path.join(tmp, WEIGHTS), payload)
    if fabric.is_global_zero:
        state.save_to_json(os.path.join(tmp, STATE_FILE))
        with open(os.path.join(tmp, ARGS_FILE), "w", encoding="utf-8") as f:
            f.write(args.to_json_string())
        manifest = {"format": "fitkit-checkpoint", "version": FORMAT_VERSION, "global_step": state.global_step,
                    "optimizer": optimizer_class(optimizer), "files": _files(tmp)}
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    fabric.barrier()
    return final


def is_complete(path: str) -> bool:
    """True when `path` holds a manifest whose files all exist with their recorded sizes."""
    manifest = _manifest(path)
    try:
        return manifest.get("format") == "fitkit-checkpoint" and all(
            os.path.getsize(os.path.join(path, name)) == size for name, size in manifest["files"].items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def list_checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoints in `output_dir`, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = _NAME.match(name)
        if m and is_complete(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), os.path.join(output_dir, name)))
    return [path for _, path in sorted(found)]


def rotate(output_dir: str, limit: int | None, keep: str | None = None) -> list[str]:
    """Delete the oldest complete checkpoints beyond `limit`. Never the newest (resume needs it)
    nor `keep` (the best one), so the directory may hold `limit + 1` while they differ."""
    if not limit:
        return []
    paths = list_checkpoints(output_dir)
    keep_abs = os.path.abspath(keep) if keep else None
    removable = [p for p in paths[:-1] if os.path.abspath(p) != keep_abs]
    removed = removable[: max(len(paths) - limit, 0)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


# -- reading ---------------------------------------------------------------------------------
class CheckpointError(ValueError):
    """A checkpoint path that does not exist, is incomplete, is not a fitkit checkpoint, or was
    written for another model or optimizer."""


_FIX = "resume with the same model and optimizer, or start a fresh `output_dir` (or `resume_from_checkpoint=False`)"


def resolve(resume: bool | str | None, output_dir: str) -> str | None:
    """The checkpoint to resume from: the newest complete one for `True`, else the path given.

    Incomplete or corrupted checkpoint directories are skipped with a warning, never picked.
    """
    if not resume:
        return None
    if resume is True:
        if os.path.isdir(output_dir):
            for name in sorted(os.listdir(output_dir)):
                full = os.path.join(output_dir, name)
                if (_NAME.match(name) and not is_complete(full)) or name.startswith(".tmp-checkpoint-"):
                    logger.warning("ignoring incomplete checkpoint %s (no valid manifest)", full)
        found = list_checkpoints(output_dir)
        if not found:
            logger.warning("resume_from_checkpoint=True but %r holds no complete checkpoint; starting fresh",
                           output_dir)
            return None
        return found[-1]
    path = os.fspath(resume)
    if not os.path.exists(path):
        raise CheckpointError(
            f"`resume_from_checkpoint`={path!r} does not exist: pass a checkpoint directory "
            "(output_dir/checkpoint-N) or True for the newest one in `output_dir`"
        )
    if not is_complete(path):
        raise CheckpointError(
            f"`resume_from_checkpoint`={path!r} is not a complete fitkit checkpoint: expected a directory "
            f"holding {MANIFEST} with the files it lists ({WEIGHTS}, {STATE_FILE})"
        )
    return path


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
        targets = {"model": module} if optimizer is None else {"model": module, "optimizer": optimizer}
        remainder = fabric.load(weights, targets, strict=optimizer is not None, weights_only=True)
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - every failure here means "refuse this file"
        if "weights_only" in str(err) or "Unsupported global" in str(err) or "pickle" in str(err).lower():
            raise CheckpointError(
                f"refusing to load {weights!r}: it holds pickled objects that are not plain tensors or "
                f"primitive values (weights-only loading). Details: {str(err).splitlines()[0]}"
            ) from None
        raise CheckpointError(f"cannot resume from {path!r}: loading it into this model and optimizer failed "
                              f"({error_line(err)}); {_FIX}") from err
    return remainder


def optimizer_class(optimizer: Any) -> str | None:
    """The class name of the torch optimizer inside Fabric's wrapper (None without one)."""
    if optimizer is None:
        return None
    return type(getattr(optimizer, "optimizer", optimizer)).__name__


def check_fits(path: str, *, module, optimizer) -> None:
    """Raise CheckpointError when the checkpoint at `path` was written for another optimizer class
    or, for a single-file checkpoint, another set of parameter names and shapes (read from the
    file memory-mapped: the tensors' data is not read). Sharded checkpoints are checked by loading."""
    saved_class = _manifest(path).get("optimizer")
    current = optimizer_class(optimizer)
    if optimizer is not None and saved_class and saved_class != current:
        raise CheckpointError(f"cannot resume from {path!r}: it was written with the optimizer {saved_class} and "
                              f"this run uses {current}; {_FIX}")
    weights = os.path.join(path, WEIGHTS)
    if not os.path.isfile(weights):
        return
    import torch

    payload = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    problems = _state_differences(payload.get("model") or {}, module.state_dict())
    if problems:
        raise CheckpointError(f"cannot resume from {path!r}: it holds the weights of another model ({problems}); "
                              f"{_FIX}")
    if optimizer is not None and not saved_class and isinstance(payload.get("optimizer"), dict):
        problem = _optimizer_difference(payload["optimizer"], optimizer.state_dict())
        if problem:
            raise CheckpointError(f"cannot resume from {path!r}: {problem}; {_FIX}")


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
