"""Checkpoint I/O: atomic writes of `output_dir/checkpoint-{global_step}/` through `fabric.save`.

A checkpoint is written under a temporary name and renamed when complete, with a manifest
written last; a directory without a valid manifest is never treated as a checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import Any

FORMAT_VERSION = 1
MANIFEST = "fitkit_checkpoint.json"
STATE_FILE = "trainer_state.json"
ARGS_FILE = "training_args.json"
WEIGHTS = "state.pt"
_NAME = re.compile(r"^checkpoint-(\d+)$")
logger = logging.getLogger("fitkit")


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
        manifest = {"format": "fitkit-checkpoint", "version": FORMAT_VERSION,
                    "global_step": state.global_step, "files": _files(tmp)}
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
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
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
    """A checkpoint path that does not exist, is incomplete, or is not a fitkit checkpoint."""


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

    Loading is weights-only: a file carrying pickled code is refused before anything runs.
    """
    weights = os.path.join(path, WEIGHTS)
    try:
        targets = {"model": module} if optimizer is None else {"model": module, "optimizer": optimizer}
        remainder = fabric.load(weights, targets, strict=optimizer is not None, weights_only=True)
    except Exception as err:  # noqa: BLE001 - every failure here means "refuse this file"
        if "weights_only" in str(err) or "Unsupported global" in str(err) or "pickle" in str(err).lower():
            raise CheckpointError(
                f"refusing to load {weights!r}: it holds pickled objects that are not plain tensors or "
                f"primitive values (weights-only loading). Details: {str(err).splitlines()[0]}"
            ) from None
        raise
    return remainder


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states in weights-only-loadable form."""
    import random

    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
