"""Checkpoint files: everything `Checkpointer` (`fitkit.engine.checkpoint.checkpointer`) asks of the disk.

`output_dir/checkpoint-{global_step}/` is written under a temporary name and renamed when
complete, with a manifest (every file's size and SHA-256) written last; a directory without a
valid manifest is never treated as a checkpoint, and one is verified before it is loaded::

    path = save_checkpoint(fabric, "out", state=state, args=args, module=m, optimizer=o)  # atomic
    list_checkpoints("out")                    # the complete ones, oldest first (sizes only)
    rotate("out", limit=2, keep=best)          # never the newest nor the best
    path = resolve(True, "out")                # the newest one that verifies (every digest)
    rest = load_checkpoint(fabric, path, module=m, optimizer=o)   # refused when it does not fit
    warn_on_resume(args, state, saved_state(path))                # HF's warnings on a resume

A manifest names files relative to its directory; a name that leaves it (`..`, an absolute
path, a symbolic link pointing out) is refused before anything outside is opened or sized.
Manifests of format 1 (written before digests existed) are checked by size only. Loading a
checkpoint whatever number of processes wrote it is `fitkit.engine.checkpoint.elastic`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from fitkit.adapters.optimizers import implementation
from fitkit.common.options import error_line
from fitkit.common.wrappers import unwrapped
from fitkit.engine.checkpoint import run_lock
from fitkit.engine.checkpoint.elastic import load_state, saved_layout
from fitkit.engine.checkpoint.hf_export import export_pretrained, is_pretrained
from fitkit.engine.checkpoint.state_file import ALGORITHM, BLOCK, DirectFile, HashingFile, save_state
from fitkit.events.state import TrainerState

STATE_FILE = "trainer_state.json"
ARGS_FILE = "training_args.json"
WEIGHTS = "state.pt"
#: What every checkpoint's manifest must list (`state.pt` is a file, or a directory when sharded).
REQUIRED = (WEIGHTS, STATE_FILE)
#: A checkpoint being written: `.tmp-checkpoint-{step}-{token}`, the token unique to the run.
TMP_PREFIX = ".tmp-checkpoint-"
FORMAT_VERSION = 2
MANIFEST = "fitkit_checkpoint.json"
#: The digests a manifest may name (new ones record `state_file.ALGORITHM`).
_READABLE = frozenset({"sha256", "blake2b"})
_NAME = re.compile(r"^checkpoint-(\d+)$")
_FIX_DAMAGED = ("resume from an earlier checkpoint (resume_from_checkpoint=True takes the newest one that verifies) "
                "or delete this checkpoint directory")
logger = logging.getLogger("fitkit")


class CheckpointError(ValueError):
    """A checkpoint path that does not exist, is incomplete or corrupted, is not a fitkit
    checkpoint, or was written for another model or optimizer."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (disk full, read-only, quota): nothing half-written is
    left, the earlier checkpoints are intact and the run can be resumed once space is freed."""



# -- writing ---------------------------------------------------------------------------------
def checkpoint_path(output_dir: str, global_step: int) -> str:
    return os.path.join(output_dir, f"checkpoint-{global_step}")


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """What every checkpoint of one run writes alike, worked out once (the arguments are frozen,
    the module and optimizer stay for the run): the arguments' JSON, the manifest's optimizer
    fields, and whether `save_pretrained`'s files go beside fitkit's (a Hugging Face model)."""

    args_json: str
    optimizer: str | None = None
    optimizer_implementation: str | None = None
    pretrained: bool = False

    @classmethod
    def of(cls, args: Any, module: Any, optimizer: Any) -> RunFiles:
        return cls(args.to_json_string(), optimizer_class(optimizer),
                   None if optimizer is None else implementation(optimizer), is_pretrained(unwrapped(module)))


def save_checkpoint(fabric, output_dir: str, *, state, args, run: RunFiles, module, optimizer, scheduler=None,
                    extra: dict[str, Any] | None = None, token: str = "") -> str:
    """Write a complete checkpoint for `state.global_step` and return its final path.

    It is written under `.tmp-checkpoint-{step}-{token}` (`token`: the same on every process,
    unique to the run) and renamed when complete. When a write fails (disk full, read-only,
    quota) the temporary directory is removed and every process raises `CheckpointWriteError`
    naming the checkpoint, the space it needs and the earlier checkpoint that is intact."""
    final = checkpoint_path(output_dir, state.global_step)
    tmp = os.path.join(output_dir, f"{TMP_PREFIX}{state.global_step}-{token or os.getpid()}")
    zero = fabric.is_global_zero
    failure = agree(fabric, _attempt(lambda: _prepare(output_dir, tmp)) if zero else None)
    if failure is None:
        payload: dict[str, Any] = {"model": module}
        if optimizer is not None:
            payload["optimizer"] = optimizer
        if scheduler is not None:
            payload["scheduler"] = scheduler.state_dict()
        if extra:
            payload.update(extra)
        failure = _attempt(lambda: fabric.save(os.path.join(tmp, WEIGHTS), payload))
        if failure is not None and fabric.world_size > 1 and type(failure).__name__ != "CheckpointException":
            # `fabric.save` ends with a barrier, which the others have reached and this process skipped
            # (DCP's own error is raised on every process: then all skipped it)
            fabric.barrier()
        if failure is None and zero and run.pretrained:  # what from_pretrained reads, before the manifest
            failure = _attempt(lambda: export_pretrained(tmp, module, args))
        if failure is None and zero:
            failure = _attempt(lambda: commit(tmp, final, texts(state, run), manifest_fields(state.global_step, run)))
        failure = agree(fabric, failure)
    if failure is None:
        return final
    if zero:
        shutil.rmtree(tmp, ignore_errors=True)
    if _is_write_error(failure):
        raise CheckpointWriteError(_unwritten(final, failure, module, optimizer)) from failure
    raise failure


def _prepare(output_dir: str, tmp: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)


def texts(state: TrainerState, run: RunFiles) -> dict[str, str]:
    """The checkpoint's JSON files as text, rendered now (an asynchronous save renders them
    before the loop moves on, and writes them later)."""
    return {STATE_FILE: json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True) + "\n",
            ARGS_FILE: run.args_json}


def manifest_fields(global_step: int, run: RunFiles | None) -> dict[str, Any]:
    """What a manifest records besides the files: format, step, optimizer class and implementation."""
    return {"format": "fitkit-checkpoint", "version": FORMAT_VERSION, "global_step": global_step,
            "optimizer": run.optimizer if run else None,
            "optimizer_implementation": run.optimizer_implementation if run else None}


def commit(tmp: str, final: str, files: dict[str, str], fields: dict[str, Any],
           known: dict[str, str] | None = None) -> None:
    """Complete the checkpoint being written at `tmp`: write `files` (name -> text), the manifest
    (last, with every file's digest; `known` gives digests already taken while writing), then
    rename it to `final` (replacing one of that name)."""
    for name, text in files.items():
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            f.write(text)
    write_manifest(tmp, fields, known)
    replaced = f"{tmp}-replaced" if os.path.exists(final) else None  # a temporary name: swept when left
    if replaced:
        os.replace(final, replaced)
    try:
        os.replace(tmp, final)
    except OSError:
        if replaced:
            os.replace(replaced, final)
        raise
    if replaced:
        shutil.rmtree(replaced, ignore_errors=True)
    _sync_directory(os.path.dirname(final))


# -- asynchronous saves: the global-zero process's parts -------------------------------------------
def temporary_path(output_dir: str, global_step: int, token: str) -> str:
    """Where the checkpoint of `global_step` is written before its rename."""
    return os.path.join(output_dir, f"{TMP_PREFIX}{global_step}-{token or os.getpid()}")


def write_in_background(output_dir: str, global_step: int, token: str, payload: dict[str, Any],
                        files: dict[str, str], fields: dict[str, Any], in_place: Iterable[int] = ()) -> str:
    """Write a checkpoint from `payload`, a host copy of the state (model and optimizer state
    dicts and the rest, as one process saves them), with `files` (`texts`) and the manifest
    `fields`; commit it (rename) and return its path. Runs on the writer thread of an
    asynchronous save: until the rename nothing of it is a checkpoint. When a write fails the
    temporary directory is removed and `CheckpointWriteError` (the storage) is raised."""
    final = checkpoint_path(output_dir, global_step)
    tmp = temporary_path(output_dir, global_step, token)
    try:
        _prepare(output_dir, tmp)
        with DirectFile(os.path.join(tmp, WEIGHTS), in_place=in_place) as f:  # a full disk: an OSError
            digest = HashingFile(f)
            save_state(payload, digest, alignment=BLOCK if f.direct and in_place else None)
        commit(tmp, final, files, fields, known={WEIGHTS: digest.hexdigest()})
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_write_error(err):
            root = _storage_error(err)
            raise CheckpointWriteError(_unwritten(final, root, payload.get("model"), payload.get("optimizer"))) from root
        raise
    return final


def _sync_directory(path: str) -> None:
    """Make a rename in `path` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _attempt(write: Callable[[], Any]) -> Exception | None:
    try:
        write()
    except Exception as err:  # noqa: BLE001 - agreed on by every process, then raised
        return err
    return None


def agree(fabric: Any, failure: Exception | None) -> Exception | None:
    """Whether a write failed on any process (a collective, standing for a barrier): this
    process's error, else one saying what the global-zero process met."""
    if fabric.world_size == 1:
        return failure
    import torch

    flags = fabric.all_reduce(torch.tensor(float(failure is not None), device=fabric.device), reduce_op="sum")
    if not flags.item():
        return None
    said = fabric.broadcast(None if failure is None else (str(failure).strip(), _is_write_error(failure)))
    if failure is not None:
        return failure
    if said is None:
        return OSError("another process could not write its part of the checkpoint")
    text = f"on the global-zero process: {said[0]}"
    return OSError(text) if said[1] else CheckpointError(f"writing the checkpoint failed {text}")



def _storage_error(err: BaseException) -> BaseException:
    """The OSError behind `err` when there is one (torch's writer may raise its own error after it)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return err


def _is_write_error(err: BaseException) -> bool:
    """A failure of the storage (disk full, read-only, quota, ...), as the writers raise it: an
    OSError, torch's zip writer's error or DCP's gathered one (which may wrap another rank's)."""
    cause = err.__cause__ or err.__context__
    if cause is not None and cause is not err and _is_write_error(cause):
        return True  # torch's zip writer may report its own state after the OSError it met
    text = str(err)
    return isinstance(err, OSError) or "PytorchStreamWriter failed" in text or "file write failed" in text or (
        type(err).__name__ == "CheckpointException" and ("Errno" in text or "OSError" in text))


def _unwritten(final: str, failure: BaseException, module: Any, optimizer: Any) -> str:
    directory = os.path.dirname(final)
    earlier = list_checkpoints(directory)
    need, basis = _space_needed(earlier[-1] if earlier else None, module, optimizer)
    try:
        free = f"{_size(shutil.disk_usage(directory).free)} are free there now"
    except OSError:
        free = "the free space there is unknown"
    intact = (f"The newest complete checkpoint, {earlier[-1]!r}, is intact" if earlier
              else f"No earlier checkpoint exists in {directory!r}")
    return (f"could not write the checkpoint {final!r} ({error_line(failure)}); its incomplete files were removed. "
            f"It needs about {_size(need)} ({basis}) and {free}. {intact}, and the model, optimizer and training "
            f"state of this run were not changed by the failed save: free space (or make {directory!r} writable, or "
            "pass another `output_dir`) and run again with resume_from_checkpoint=True to continue"
            + (" from it" if earlier else ""))


def _space_needed(previous: str | None, module: Any, optimizer: Any) -> tuple[int, str]:
    """Bytes a checkpoint takes: the previous one's files, else the model's and optimizer's tensors."""
    if previous is not None:
        try:
            with open(os.path.join(previous, MANIFEST), encoding="utf-8") as f:
                return sum(json.load(f)["files"].values()), f"the size of {os.path.basename(previous)}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    total = 0
    try:
        def state_of(obj: Any) -> Any:  # a module / optimizer, or already its state dict (an asynchronous save)
            return obj if isinstance(obj, dict) else obj.state_dict()

        states = [state_of(module)] + ([state_of(optimizer).get("state", {})] if optimizer is not None else [])
        for tree in states:
            total += sum(_bytes(v) for v in _leaves(tree))
    except Exception:  # noqa: BLE001 - an estimate only
        return 0, "unknown: the model's tensors could not be measured"
    return total, "the model's and optimizer's tensors"


def _leaves(tree: Any) -> Iterator[Any]:
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _leaves(value)
    else:
        yield tree


def _bytes(value: Any) -> int:
    return value.numel() * value.element_size() if hasattr(value, "element_size") else 0


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- the manifest ----------------------------------------------------------------------------
def file_digest(path: str, algorithm: str = ALGORITHM) -> str:
    """The hex digest of the file at `path` (read in blocks; the hashing releases the GIL)."""
    with open(path, "rb") as f:
        if sys.version_info >= (3, 11):
            return hashlib.file_digest(f, algorithm).hexdigest()
        digest = hashlib.new(algorithm)  # Python 3.10 has no hashlib.file_digest: its loop by hand
        for block in iter(lambda: f.read(1 << 18), b""):
            digest.update(block)
        return digest.hexdigest()


def describe(directory: str, known: dict[str, str] | None = None) -> dict[str, Any]:
    """What a manifest records of `directory`: every file's size and digest, by relative name
    (`known`: digests taken while writing, by name). Several files (a sharded checkpoint) are
    hashed on several threads."""
    known = known or {}
    names = sorted(os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
                   for root, _, files in os.walk(directory) for name in files if name != MANIFEST or root != directory)
    full = [os.path.join(directory, name) for name in names]
    unknown = [path for name, path in zip(names, full) if name not in known]
    with ThreadPoolExecutor(max_workers=max(1, min(len(unknown), os.cpu_count() or 1, 8))) as pool:
        hashed = dict(zip(unknown, pool.map(file_digest, unknown)))
    digests = [known[name] if name in known else hashed[path] for name, path in zip(names, full)]
    return {"files": {n: os.path.getsize(p) for n, p in zip(names, full)}, "digest": ALGORITHM,
            "digests": dict(zip(names, digests))}


def write_manifest(directory: str, content: dict[str, Any], known: dict[str, str] | None = None) -> None:
    """Write `content` plus `describe(directory, known)` as the manifest, synced to disk (write it last)."""
    manifest = {**content, **describe(directory, known)}
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
                              f"or not a fitkit checkpoint; {_FIX_DAMAGED}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "fitkit-checkpoint" or not isinstance(
            manifest.get("files"), dict):
        raise CheckpointError(f"{where!r} is not a fitkit checkpoint manifest; {_FIX_DAMAGED}")
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
                              f"checkpoint directory: refused (the manifest was edited); {_FIX_DAMAGED}")
    full = os.path.join(path, *parts)
    root = os.path.realpath(path)
    if os.path.commonpath([root, os.path.realpath(full)]) != root:
        raise CheckpointError(f"checkpoint {path!r}: {name!r} is a symbolic link that leads outside the checkpoint "
                              f"directory: refused; {_FIX_DAMAGED}")
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
    # Digests recorded (format 2 always) must be checkable: a format-1 manifest given some is refused too.
    if (manifest["version"] >= 2 or digests is not None) and (
            not isinstance(digests, dict) or algorithm not in _READABLE):
        raise CheckpointError(f"checkpoint {path!r}: its manifest records no digests it can check; {_FIX_DAMAGED}")
    targets = {name: confined(path, name) for name in files}
    _check_listing(path, files, required)
    for name, size in files.items():
        actual = os.path.getsize(targets[name]) if os.path.isfile(targets[name]) else None
        if actual != size:
            state = "is missing" if actual is None else f"has {actual} bytes where {size!r} were written"
            raise CheckpointError(f"checkpoint {path!r} is damaged: {name} {state} (truncated or replaced); {_FIX_DAMAGED}")
    if digests is None:
        logger.info("checkpoint %s was written before digests existed (format 1): sizes checked only", path)
    else:
        names = list(files)
        with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1, 8))) as pool:
            found = pool.map(lambda n: file_digest(targets[n], cast(str, algorithm)), names)  # in _READABLE
            for name, digest in zip(names, found):
                if digest != digests.get(name):
                    raise CheckpointError(
                        f"checkpoint {path!r} is corrupted: the {algorithm} digest of {name} differs from the one "
                        f"recorded when it was written (a changed byte or an edit); {_FIX_DAMAGED}")
    _check_json(path, targets)
    return manifest


def _check_listing(path: str, files: dict, required: tuple[str, ...]) -> None:
    """Every file in the directory is listed (none added later) and every required one is there."""
    for root, _, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel != MANIFEST and rel not in files:
                raise CheckpointError(f"checkpoint {path!r} holds {rel}, which its manifest does not list (added after "
                                      f"the checkpoint was written); remove it, or {_FIX_DAMAGED}")
    for name in required:
        if name not in files and not any(n.startswith(name + "/") for n in files):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: its manifest does not list {name}; {_FIX_DAMAGED}")


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
                                      f"(truncated or edited); {_FIX_DAMAGED}")


# -- listing, rotating, tidying --------------------------------------------------------------
def hold(directory: str, argument: str) -> Any:
    """`directory`'s lock, taken; then what an interrupted run left there is tidied (see `recover`)."""
    lock = run_lock.acquire(directory, argument)
    recover(directory)
    return lock


def recover(directory: str) -> None:
    """Tidy the temporary checkpoints an interrupted run left in `directory` (call it only while
    holding the directory): one that is complete and whose `checkpoint-N` is missing (the run died
    while replacing it) becomes `checkpoint-N`; any other is removed, with a warning."""
    leftovers = sorted((n for n in os.listdir(directory) if n.startswith(TMP_PREFIX)),
                       key=lambda n: n.endswith("-replaced"))  # the newer content first
    for name in leftovers:
        path = os.path.join(directory, name)
        step = name[len(TMP_PREFIX):].split("-", 1)[0]
        final = checkpoint_path(directory, int(step)) if step.isdigit() else None
        if final and not os.path.exists(final) and is_complete(path):
            logger.warning("recovering %s from %s, a complete checkpoint an interrupted run had not renamed yet",
                           final, path)
            os.replace(path, final)
        else:
            logger.warning("removing %s: an incomplete checkpoint an interrupted run left behind", path)
            shutil.rmtree(path, ignore_errors=True)


def is_complete(path: str) -> bool:
    """True when `path` holds a manifest whose files all exist, inside it, with their recorded
    sizes: cheap (no file is read), for listing; `verified` checks the content before a load."""
    return sizes_match(path)


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


def rotate(output_dir: str, limit: int | None, keep: str | Iterable[str | None] | None = None) -> list[str]:
    """Delete the oldest complete checkpoints beyond `limit`. Never the newest (resume needs it)
    nor `keep` (the best one, or several paths), so the directory may hold `limit + 1` while they
    differ. A checkpoint still being written is not complete, so neither listed nor counted."""
    if not limit:
        return []
    paths = list_checkpoints(output_dir)
    kept = [keep] if isinstance(keep, str) else list(keep or ())
    keep_abs = {os.path.abspath(k) for k in kept if k}
    removable = [p for p in paths[:-1] if os.path.abspath(p) not in keep_abs]
    removed = removable[: max(len(paths) - limit, 0)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


# -- reading ---------------------------------------------------------------------------------
_FIX_MISMATCH = (
    "resume with the same model and optimizer, or start a fresh `output_dir` (or `resume_from_checkpoint=False`)")


def resolve(resume: bool | str | None, output_dir: str) -> str | None:
    """The checkpoint to resume from, verified (`verified`): for `True` the newest one in
    `output_dir` that verifies, else the path given, which must verify.

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
    if not os.path.exists(path):
        raise CheckpointError(
            f"`resume_from_checkpoint`={path!r} does not exist: pass a checkpoint directory "
            "(output_dir/checkpoint-N) or True for the newest one in `output_dir`"
        )
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        raise CheckpointError(
            f"`resume_from_checkpoint`={path!r} is not a complete fitkit checkpoint: expected a directory "
            f"holding {MANIFEST} with the files it lists ({WEIGHTS}, {STATE_FILE})"
        )
    return verified(path)


def _newest_verified(output_dir: str) -> str | None:
    if os.path.isdir(output_dir):
        for name in sorted(os.listdir(output_dir)):
            full = os.path.join(output_dir, name)
            if (_NAME.match(name) and not is_complete(full)) or name.startswith(TMP_PREFIX):
                logger.warning("ignoring incomplete checkpoint %s (no valid manifest)", full)
    found = list_checkpoints(output_dir)
    if not found:
        logger.warning("resume_from_checkpoint=True but %r holds no complete checkpoint; starting fresh", output_dir)
        return None
    for path in reversed(found):
        try:
            return verified(path)
        except CheckpointError as err:
            logger.warning("skipping checkpoint %s, which fails verification (%s); trying the one before it",
                           path, err)
    raise CheckpointError(
        f"`resume_from_checkpoint`=True but none of the {len(found)} checkpoints in {output_dir!r} verifies (each "
        "one is named in a warning above): restore them from a copy, or move them away and pass "
        "resume_from_checkpoint=False to start fresh")


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


def verified(path: str) -> str:
    """`path`, after checking every file of the checkpoint against its manifest (sizes, digests,
    JSON, paths inside it: `verify`); a CheckpointError naming the file otherwise."""
    try:
        verify(path, REQUIRED)
    except OSError as err:
        raise CheckpointError(f"checkpoint {path!r} cannot be read ({error_line(err)}); resume from an earlier "
                              "checkpoint or check the file permissions") from None
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


def optimizer_class(optimizer: Any) -> str | None:
    """The class name of the torch optimizer inside Fabric's wrapper (None without one)."""
    if optimizer is None:
        return None
    return type(getattr(optimizer, "optimizer", optimizer)).__name__


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
