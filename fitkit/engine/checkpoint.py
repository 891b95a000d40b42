"""Checkpoint I/O: atomic writes of `output_dir/checkpoint-{global_step}/` through `fabric.save`.

A checkpoint is written under a temporary name and renamed when complete, with a manifest
written last; a directory without a valid manifest is never treated as a checkpoint.
"""

from __future__ import annotations

import json
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


def _files(path: str) -> dict[str, int]:
    out = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = os.path.getsize(full)
    return out


def save_checkpoint(fabric, output_dir: str, *, state, args, module, optimizer, scheduler=None,
                    extra: dict[str, Any] | None = None) -> str:
    """Write a complete checkpoint for `state.global_step` and return its final path."""
    final = os.path.join(output_dir, f"checkpoint-{state.global_step}")
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
    """Delete the oldest complete checkpoints beyond `limit`, never `keep` (the best one)."""
    if not limit:
        return []
    paths = list_checkpoints(output_dir)
    removable = [p for p in paths if keep is None or os.path.abspath(p) != os.path.abspath(keep)]
    excess = len(paths) - limit
    removed = removable[: max(excess, 0)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
