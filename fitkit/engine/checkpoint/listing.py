"""Finding the complete checkpoints of a directory: the manifest read and checked for shape, and
every file it lists present with its size (no file's content is read: `verify` does that).

Usage::

    list_checkpoints("out")                     # the complete ones, oldest first
    is_complete("out/checkpoint-40")            # True once committed (renamed, manifest last)

A manifest names files relative to its directory; a name that leaves it (`..`, an absolute
path, a symbolic link pointing out) is refused before anything outside is opened or sized.
"""

from __future__ import annotations

import json
import os
from typing import Any

from fitkit.engine.checkpoint import store
from fitkit.engine.checkpoint.layout import CHECKPOINT_NAME, FIX_DAMAGED, FORMAT_VERSION, MANIFEST, CheckpointError


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at `path`, checked for shape; CheckpointError otherwise."""
    where = os.path.join(path, MANIFEST)
    try:
        with open(where, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path!r} has no readable manifest {MANIFEST} ({err}): it is incomplete "
                              f"or not a fitkit checkpoint; {FIX_DAMAGED}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "fitkit-checkpoint" or not isinstance(
            manifest.get("files"), dict):
        raise CheckpointError(f"{where!r} is not a fitkit checkpoint manifest; {FIX_DAMAGED}")
    version = manifest.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format version {version!r}, newer than this fitkit reads "
                              f"({FORMAT_VERSION}): upgrade fitkit to resume it")
    return manifest


def confined(path: str, name: Any) -> str:
    """The full path of the manifest entry `name` inside the checkpoint `path`: a relative name
    without `..` whose real location (symbolic links followed) stays inside `path`. Anything
    else raises CheckpointError; the file itself is neither opened nor sized here."""
    parts = name.split("/") if isinstance(name, str) else [""]
    if not isinstance(name, str) or name.startswith("/") or os.path.isabs(name) or any(
            p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"checkpoint {path!r} lists the file {name!r} in its manifest, a path outside the "
                              f"checkpoint directory: refused (the manifest was edited); {FIX_DAMAGED}")
    full = os.path.join(path, *parts)
    root = os.path.realpath(path)
    if os.path.commonpath([root, os.path.realpath(full)]) != root:
        raise CheckpointError(f"checkpoint {path!r}: {name!r} is a symbolic link that leads outside the checkpoint "
                              f"directory: refused; {FIX_DAMAGED}")
    return full


def is_complete(path: str) -> bool:
    """True when `path` holds a manifest whose files all exist, inside it, with their recorded
    sizes: cheap (no file is read), for listing; `verified` checks the content before a load."""
    if store.is_url(path):
        parent, name = store.split(path)
        where = store.Store.open(parent, check=False)
        return where.complete(name, where.checkpoints().get(name, {}))
    try:
        manifest = read_manifest(path)
        return all(isinstance(size, int) and os.path.getsize(confined(path, name)) == size
                   for name, size in manifest["files"].items())
    except (OSError, CheckpointError):
        return False


def list_checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoints in `output_dir`, oldest first (in a store: found with one listing)."""
    if store.is_url(output_dir):
        where = store.Store.open(output_dir, check=False)
        held = where.checkpoints()
        done = [name for name, files in held.items() if where.complete(name, files)]
        return [store.join(output_dir, name) for name in sorted(done, key=lambda n: int(n.split("-")[1]))]
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = CHECKPOINT_NAME.match(name)
        if m and is_complete(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), os.path.join(output_dir, name)))
    return [path for _, path in sorted(found)]
