"""Checkpoint manifests: the list of a checkpoint's files with their sizes and SHA-256 digests,
written last, checked cheaply when listing checkpoints and fully before one is loaded.

    write_manifest(tmp, {"format": "fitkit-checkpoint", "version": 2, "global_step": 18})
    sizes_match("runs/a/checkpoint-18")   # cheap: every listed file exists with its size
    verify("runs/a/checkpoint-18")        # every file's digest; CheckpointError naming the one that differs

A manifest names files relative to its directory; a name that leaves it (`..`, an absolute
path, a symbolic link pointing out) is refused before anything outside is opened or sized.
Manifests of format 1 (written before digests existed) are checked by size only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

FORMAT_VERSION = 2
MANIFEST = "fitkit_checkpoint.json"
#: The digest new manifests record (with SHA-NI, on most x86 and ARM servers, faster than
#: BLAKE2b: see docs/checkpoints.md). Files can be checked by hand with `sha256sum`.
ALGORITHM = "sha256"
_READABLE = frozenset({"sha256", "blake2b"})
_FIX = ("resume from an earlier checkpoint (resume_from_checkpoint=True takes the newest one that verifies) "
        "or delete this checkpoint directory")
logger = logging.getLogger("fitkit")


class CheckpointError(ValueError):
    """A checkpoint path that does not exist, is incomplete or corrupted, is not a fitkit
    checkpoint, or was written for another model or optimizer."""


def file_digest(path: str, algorithm: str = ALGORITHM) -> str:
    """The hex digest of the file at `path` (read in blocks; the hashing releases the GIL)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def describe(directory: str) -> dict[str, Any]:
    """What a manifest records of `directory`: every file's size and digest, by relative name.
    Several files (a sharded checkpoint) are hashed on several threads."""
    names = sorted(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
                   for root, _, files in os.walk(directory) for name in files if name != MANIFEST or root != directory)
    full = [os.path.join(directory, name) for name in names]
    with ThreadPoolExecutor(max_workers=max(1, min(len(full), os.cpu_count() or 1, 8))) as pool:
        digests = list(pool.map(file_digest, full))
    return {"files": {n: os.path.getsize(p) for n, p in zip(names, full)}, "digest": ALGORITHM,
            "digests": dict(zip(names, digests))}


def write_manifest(directory: str, content: dict[str, Any]) -> None:
    """Write `content` plus `describe(directory)` as the manifest, synced to disk (write it last)."""
    manifest = {**content, **describe(directory)}
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(path: str) -> dict[str, Any]:
    """The manifest of the checkpoint at `path`, checked for shape; CheckpointError otherwise."""
    where = os.path.join(path, MANIFEST)
    try:
        with open(where, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path!r} has no readable manifest {MANIFEST} ({err}): it is incomplete "
                              f"or not a fitkit checkpoint; {_FIX}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "fitkit-checkpoint" or not isinstance(
            manifest.get("files"), dict):
        raise CheckpointError(f"{where!r} is not a fitkit checkpoint manifest; {_FIX}")
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
                              f"checkpoint directory: refused (the manifest was edited); {_FIX}")
    full = os.path.join(path, *parts)
    root = os.path.realpath(path)
    if os.path.commonpath([root, os.path.realpath(full)]) != root:
        raise CheckpointError(f"checkpoint {path!r}: {name!r} is a symbolic link that leads outside the checkpoint "
                              f"directory: refused; {_FIX}")
    return full


def sizes_match(path: str) -> bool:
    """True when `path` holds a manifest whose files all exist, inside it, with their recorded
    sizes: a cheap test of completeness (no file is read)."""
    try:
        manifest = read_manifest(path)
        return all(isinstance(size, int) and os.path.getsize(confined(path, name)) == size
                   for name, size in manifest["files"].items())
    except (OSError, CheckpointError):
        return False


def verify(path: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Check the checkpoint at `path` before it is loaded and return its manifest: every file
    inside it listed, with its size and digest (size only for format 1), every JSON file
    parsing, and each of `required` (a file, or a directory of files) present. Raises a
    CheckpointError naming the first file that differs and the fix."""
    manifest = read_manifest(path)
    files, digests, algorithm = manifest["files"], manifest.get("digests"), manifest.get("digest")
    if manifest["version"] >= 2 and (not isinstance(digests, dict) or algorithm not in _READABLE):
        raise CheckpointError(f"checkpoint {path!r}: its manifest records no digests it can check; {_FIX}")
    targets = {name: confined(path, name) for name in files}
    _check_listing(path, files, required)
    for name, size in files.items():
        actual = os.path.getsize(targets[name]) if os.path.isfile(targets[name]) else None
        if actual != size:
            state = "is missing" if actual is None else f"has {actual} bytes where {size!r} were written"
            raise CheckpointError(f"checkpoint {path!r} is damaged: {name} {state} (truncated or replaced); {_FIX}")
    if digests is None:
        logger.info("checkpoint %s was written before digests existed (format 1): sizes checked only", path)
    else:
        names = list(files)
        with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1, 8))) as pool:
            found = pool.map(lambda n: file_digest(targets[n], algorithm), names)
            for name, digest in zip(names, found):
                if digest != digests.get(name):
                    raise CheckpointError(
                        f"checkpoint {path!r} is corrupted: the {algorithm} digest of {name} differs from the one "
                        f"recorded when it was written (a changed byte or an edit); {_FIX}")
    _check_json(path, targets)
    return manifest


def _check_listing(path: str, files: dict, required: tuple[str, ...]) -> None:
    """Every file in the directory is listed (none added later) and every required one is there."""
    for root, _, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel != MANIFEST and rel not in files:
                raise CheckpointError(f"checkpoint {path!r} holds {rel}, which its manifest does not list (added after "
                                      f"the checkpoint was written); remove it, or {_FIX}")
    for name in required:
        if name not in files and not any(n.startswith(name + "/") for n in files):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: its manifest does not list {name}; {_FIX}")


def _check_json(path: str, targets: dict[str, str]) -> None:
    for name, full in targets.items():
        if name.endswith(".json") and "/" not in name:
            try:
                with open(full, encoding="utf-8") as f:
                    ok = isinstance(json.load(f), dict)
            except (OSError, ValueError):
                ok = False
            if not ok:
                raise CheckpointError(f"checkpoint {path!r} is damaged: {name} is not a valid JSON object "
                                      f"(truncated or edited); {_FIX}")
