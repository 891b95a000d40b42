"""Verifying a checkpoint before it is loaded, and choosing the one a run resumes from.

Usage::

    verified("out/checkpoint-40")              # every file's size and digest, the JSON, the listing
    path = resolve(True, "out")                # the newest one that verifies

Every manifest records a digest of each file (format 2; no released version wrote another). A checkpoint
of the Hugging Face Trainer (no manifest) is checked for its files (`trainer_checkpoints.checked`).
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from fitkit.common.options import error_line
from fitkit.engine.checkpoint import store, trainer_checkpoints
from fitkit.engine.checkpoint.layout import (
    CHECKPOINT_NAME,
    FIX_DAMAGED,
    MANIFEST,
    READABLE_DIGESTS,
    REQUIRED,
    STATE_FILE,
    TMP_PREFIX,
    WEIGHTS,
    CheckpointError,
)
from fitkit.engine.checkpoint.listing import confined, is_complete, list_checkpoints, read_manifest
from fitkit.engine.checkpoint.loading import saved_state
from fitkit.engine.checkpoint.writing import file_digest

logger = logging.getLogger("fitkit")


def verified(path: str) -> str:
    """`path`, after checking every file of the checkpoint against its manifest (sizes, digests,
    JSON, paths inside it: `verify`); a CheckpointError naming the file otherwise. A checkpoint
    in a store is downloaded into the local staging folder first, and that copy (verified) is
    returned: what a resume loads is what was checked."""
    if store.is_url(path):
        return _fetched(path)
    try:
        verify(path, REQUIRED)
    except OSError as err:
        raise CheckpointError(f"checkpoint {path!r} cannot be read ({error_line(err)}); resume from an earlier "
                              "checkpoint or check the file permissions") from None
    return path


def verify(path: str, required: tuple[str, ...] = (), remote: dict[str, int] | None = None) -> dict[str, Any]:
    """Check the checkpoint at `path` before it is loaded and return its manifest: every file
    inside it listed, with its size and digest, every JSON file
    parsing, and each of `required` (a file, or a directory of files) present. Raises a
    CheckpointError naming the first file that differs and the fix. `remote`: the sizes in a
    store of the files a local copy does not hold yet (each process's shards, checked when
    downloaded: `shards.fetch_missing`)."""
    manifest = read_manifest(path)
    files, digests, algorithm = manifest["files"], manifest.get("digests"), manifest.get("digest")
    if not isinstance(digests, dict) or algorithm not in READABLE_DIGESTS:
        raise CheckpointError(f"checkpoint {path!r}: its manifest records no digests it can check; {FIX_DAMAGED}")
    targets = {name: confined(path, name) for name in files}
    _check_listing(path, files, required)
    later = {name for name in files if remote is not None and _later(name) and not os.path.isfile(targets[name])}
    for name, size in files.items():
        if name in later:
            actual = remote.get(name) if remote is not None else None
        else:
            actual = os.path.getsize(targets[name]) if os.path.isfile(targets[name]) else None
        if actual != size:
            state = "is missing" if actual is None else f"has {actual} bytes where {size!r} were written"
            raise CheckpointError(f"checkpoint {path!r} is damaged: {name} {state} (truncated or replaced); {FIX_DAMAGED}")
    names = [name for name in files if name not in later]
    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1, 8))) as pool:
        found = pool.map(lambda n: file_digest(targets[n], cast(str, algorithm)), names)  # in READABLE_DIGESTS
        for name, digest in zip(names, found):
            if digest != digests.get(name):
                raise CheckpointError(
                    f"checkpoint {path!r} is corrupted: the {algorithm} digest of {name} differs from the one "
                    f"recorded when it was written (a changed byte or an edit); {FIX_DAMAGED}")
    _check_json(path, targets)
    return manifest


def _later(name: str) -> bool:
    """A shard of a sharded (DCP) checkpoint: downloaded by each process that reads it, not with
    the rest (`shards.fetch_missing`)."""
    return name.startswith(WEIGHTS + "/") and name.endswith(".distcp")


def _fetched(url: str, folder: str = "download") -> str:
    """The checkpoint at `url` downloaded into `folder` of its staging folder and verified (errors
    name `url`, not the local copy). A sharded checkpoint's shards are not downloaded here (their
    sizes are checked in the listing): each process downloads and verifies the ones its load
    reads (`shards.fetch_missing`)."""
    parent, name = store.split(url)
    where = store.Store.open(parent, "`resume_from_checkpoint`")
    files = where.checkpoints().get(name, {})
    local = where.fetch(name, os.path.join(store.staging(parent), folder, name), files, later=_later)
    try:
        verify(local, REQUIRED, remote=files)
    except OSError as err:
        raise CheckpointError(f"checkpoint {url!r} cannot be read ({error_line(err)}); resume from an earlier "
                              "checkpoint or check the endpoint") from None
    except CheckpointError as err:
        raise CheckpointError(str(err).replace(local, url)) from None
    return local


def own_copy(url: str, rank: int) -> str:
    """A process's own verified copy of the checkpoint at `url`, for one that cannot see the
    global-zero process's copy (on another machine)."""
    return _fetched(url, f"download-rank{rank}")


def _check_listing(path: str, files: dict, required: tuple[str, ...]) -> None:
    """Every file in the directory is listed (none added later) and every required one is there."""
    for root, _, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel != MANIFEST and rel not in files:
                raise CheckpointError(f"checkpoint {path!r} holds {rel}, which its manifest does not list (added after "
                                      f"the checkpoint was written); remove it, or {FIX_DAMAGED}")
    for name in required:
        if name not in files and not any(n.startswith(name + "/") for n in files):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: its manifest does not list {name}; {FIX_DAMAGED}")


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
                                      f"(truncated or edited); {FIX_DAMAGED}")


def resolve(resume: bool | str | None, output_dir: str) -> str | None:
    """The checkpoint to resume from, verified (`verified`): for `True` the newest one in
    `output_dir` that verifies, else the path given, which must verify. A checkpoint of the
    Hugging Face Trainer counts too (checked by `trainer_checkpoints.checked`): with `True` the one of the
    highest step is taken, fitkit's or the Trainer's.

    With `True`, incomplete checkpoint directories are skipped with a warning, and so is each
    newer checkpoint that fails verification (named, with what differs); when checkpoints exist
    but none verifies, CheckpointError. Listing reads no file's content (`is_complete`); only
    the checkpoint picked (and, falling back, the next one) is read in full.
    """
    if not resume:
        return None
    if resume is True:
        return _newest_verified(output_dir)
    path = os.fspath(resume)
    if store.is_url(path):
        return _resolve_url(path)
    if not os.path.exists(path):
        raise CheckpointError(
            f"`resume_from_checkpoint`={path!r} does not exist: pass a checkpoint directory "
            "(output_dir/checkpoint-N) or True for the newest one in `output_dir`"
        )
    if trainer_checkpoints.is_trainer_checkpoint(path):
        return trainer_checkpoints.checked(path)
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        raise CheckpointError(
            f"`resume_from_checkpoint`={path!r} is not a complete fitkit checkpoint: expected a directory "
            f"holding {MANIFEST} with the files it lists ({WEIGHTS}, {STATE_FILE}), or a checkpoint of the "
            f"Hugging Face Trainer ({STATE_FILE}, {trainer_checkpoints.WEIGHT_FILES[0]}, {trainer_checkpoints.OPTIMIZER_FILE}, ...)"
        )
    return verified(path)


def _resolve_url(url: str) -> str:
    """A checkpoint in a store given by its URL: it must exist and be complete, then verify."""
    parent, name = store.split(url)
    files = store.Store.open(parent, "`resume_from_checkpoint`").checkpoints().get(name)
    if not files:
        raise CheckpointError(f"`resume_from_checkpoint`={url!r} does not exist: pass a checkpoint's URL "
                              "(output_dir/checkpoint-N) or True for the newest one in `output_dir`")
    if MANIFEST not in files:
        raise CheckpointError(f"`resume_from_checkpoint`={url!r} is not a complete fitkit checkpoint: it has no "
                              f"{MANIFEST} (an upload cut short, or not a fitkit checkpoint); {FIX_DAMAGED}")
    return verified(url)


def _complete(output_dir: str, theirs: list[str]) -> list[str]:
    """The complete checkpoints in `output_dir`, oldest first, each incomplete one named in a
    warning (in a store: from one listing of the prefix)."""
    if store.is_url(output_dir):
        where = store.Store.open(output_dir, "`output_dir`")
        done = []
        for name, files in where.checkpoints().items():
            if where.complete(name, files):
                done.append(store.join(output_dir, name))
            else:
                logger.warning("ignoring incomplete checkpoint %s (no valid manifest)", store.join(output_dir, name))
        return sorted(done, key=trainer_checkpoints.checkpoint_step)
    if os.path.isdir(output_dir):
        for name in sorted(os.listdir(output_dir)):
            full = os.path.join(output_dir, name)
            if (CHECKPOINT_NAME.match(name) and not is_complete(full) and full not in theirs) or name.startswith(
                    TMP_PREFIX):
                logger.warning("ignoring incomplete checkpoint %s (no valid manifest)", full)
    return list_checkpoints(output_dir)


def _newest_verified(output_dir: str) -> str | None:
    theirs = trainer_checkpoints.trainer_checkpoints(output_dir)
    found = sorted(_complete(output_dir, theirs) + theirs, key=trainer_checkpoints.checkpoint_step)
    if not found:
        logger.warning("resume_from_checkpoint=True but %r holds no complete checkpoint; starting fresh", output_dir)
        return None
    for path in reversed(found):
        try:
            return trainer_checkpoints.checked(path) if path in theirs else verified(path)
        except CheckpointError as err:
            logger.warning("skipping checkpoint %s, which fails verification (%s); trying the one before it",
                           path, err)
    raise CheckpointError(
        f"`resume_from_checkpoint`=True but none of the {len(found)} checkpoints in {output_dir!r} verifies (each "
        "one is named in a warning above): restore them from a copy, or move them away and pass "
        "resume_from_checkpoint=False to start fresh")


def resumed_batch_size(fabric: Any, args: Any) -> int | None:
    """With `auto_find_batch_size` and `resume_from_checkpoint`, the per-device batch size the
    checkpoint's `trainer_state.json` recorded (`train_batch_size`), as the Trainer takes it back so
    a size the search shrank to is kept; None otherwise. Read on the global-zero process and shared::

        size = resumed_batch_size(fabric, args) or args.batch_size
    """
    if not (getattr(args, "auto_find_batch_size", False) and getattr(args, "resume_from_checkpoint", None)):
        return None
    size = None
    if fabric.is_global_zero:  # an error here is raised again, on every process, by the checkpointer's resume
        try:
            path = resolve(args.resume_from_checkpoint, args.output_dir)
            size = saved_state(path).train_batch_size if path is not None else None
        except CheckpointError:
            size = None
    if fabric.world_size > 1:
        size = fabric.broadcast(size)
    return size
