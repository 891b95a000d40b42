"""Writing checkpoints: the atomic directory write, its manifest, rotation, and the writer interface.

A checkpoint is written under a temporary name and renamed when complete, with its manifest
(every file's size and digest) written last, so a directory without a valid manifest is never
a checkpoint. How the files get there is a `CheckpointWriter`: `SyncCheckpointWriter` (here)
writes and commits before it returns; `BackgroundCheckpointWriter`
(`fitkit.engine.checkpoint.background`, `save_async=True`) takes a host copy and commits on a
thread. The checkpointer uses either through the same calls, in the order the
`CheckpointWriter` docstring gives::

    writer = SyncCheckpointWriter(fabric, args, state, module=m, optimizer=o)
    writer.write(SaveJob("out", own=True, limit=2, state=state, extra=extra, token=token))
    for done in writer.poll_committed():       # committed: `done.path`, `done.state` (as written)
        ...                                    # fire on_save
    writer.close()

    path = save_checkpoint(fabric, "out", state=state, args=args, run=run, module=m, optimizer=o)  # one call
    rotate("out", limit=2, keep=best)          # never the newest nor the best
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from fitkit.adapters.optimizers import implementation
from fitkit.common.wrappers import torch_optimizer, unwrapped
from fitkit.engine.checkpoint import run_lock, store
from fitkit.engine.checkpoint.hf_export import export_pretrained, is_pretrained
from fitkit.engine.checkpoint.layout import (
    ARGS_FILE,
    FORMAT_VERSION,
    MANIFEST,
    STATE_FILE,
    TMP_PREFIX,
    WEIGHTS,
    CheckpointError,
    CheckpointWriteError,
)
from fitkit.engine.checkpoint.listing import is_complete, list_checkpoints
from fitkit.engine.checkpoint.node_writers import save_payload, writes_checkpoints
from fitkit.engine.checkpoint.state_file import ALGORITHM
from fitkit.engine.checkpoint.write_errors import is_write_error, unwritten
from fitkit.events.state import TrainerState

logger = logging.getLogger("fitkit")


def checkpoint_path(output_dir: str, global_step: int) -> str:
    """Where the checkpoint of `global_step` is once committed: `output_dir/checkpoint-{global_step}`."""
    return os.path.join(output_dir, f"checkpoint-{global_step}")


def temporary_path(output_dir: str, global_step: int, token: str) -> str:
    """Where the checkpoint of `global_step` is written before its rename (for a store: in the
    local staging folder, before it is published)."""
    if store.is_url(output_dir):
        return os.path.join(store.staging(output_dir), f"{TMP_PREFIX}{global_step}-{token or os.getpid()}")
    return os.path.join(output_dir, f"{TMP_PREFIX}{global_step}-{token or os.getpid()}")


def optimizer_class(optimizer: Any) -> str | None:
    """The class name of the torch optimizer inside Fabric's wrapper (None without one)."""
    if optimizer is None:
        return None
    return type(torch_optimizer(optimizer)).__name__


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


def save_checkpoint(fabric, output_dir: str, *, state, args, run: RunFiles, module, optimizer, scheduler=None,
                    extra: dict[str, Any] | None = None, token: str = "") -> str:
    """Write a complete checkpoint for `state.global_step` and return its final path.

    It is written under `.tmp-checkpoint-{step}-{token}` (`token`: the same on every process,
    unique to the run) and renamed when complete. When a write fails (disk full, read-only,
    quota) the temporary directory is removed and every process raises `CheckpointWriteError`
    naming the checkpoint, the space it needs and the earlier checkpoint that is intact."""
    final = checkpoint_path(output_dir, state.global_step)
    tmp = temporary_path(output_dir, state.global_step, token)
    zero = writes_checkpoints(fabric, args)  # global rank 0, or each node's local rank 0 (`save_on_each_node`)
    failure = agree(fabric, _attempt(lambda: prepare(output_dir, tmp)) if zero else None)
    if failure is None:
        payload: dict[str, Any] = {"model": module}
        if optimizer is not None:
            payload["optimizer"] = optimizer
        if scheduler is not None:
            payload["scheduler"] = scheduler.state_dict()
        if extra:
            payload.update(extra)
        failure = _attempt(lambda: save_payload(fabric, os.path.join(tmp, WEIGHTS), payload, args))
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
    if is_write_error(failure):
        raise CheckpointWriteError(unwritten(final, failure, module, optimizer)) from failure
    raise failure


def prepare(output_dir: str, tmp: str) -> None:
    """Create `output_dir` and an empty `tmp` inside it (a leftover of that name is removed; for a
    store, `tmp` is in the local staging folder and nothing is created in the store)."""
    if not store.is_url(output_dir):
        os.makedirs(output_dir, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)


def commit(tmp: str, final: str, files: dict[str, str], fields: dict[str, Any],
           known: dict[str, str] | None = None) -> None:
    """Complete the checkpoint being written at `tmp`: write `files` (name -> text), the manifest
    (last, with every file's digest; `known` gives digests already taken while writing), then
    rename it to `final` (replacing one of that name). A `final` in a store is published instead:
    every object, the manifest last (`store.Store.publish`), and `tmp` removed."""
    for name, text in files.items():
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
            f.write(text)
    write_manifest(tmp, fields, known)
    if store.is_url(final):
        parent, name = store.split(final)
        store.Store.open(parent, check=False).publish(tmp, name)
        shutil.rmtree(tmp, ignore_errors=True)
        return
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
    described = {"files": {n: os.path.getsize(p) for n, p in zip(names, full)}, "digest": ALGORITHM,
                 "digests": dict(zip(names, digests))}
    pieces = {}
    for name in names:
        if name.endswith("/.metadata"):
            pieces.update(small_pieces(directory, name.rsplit("/", 1)[0]))
    if pieces:
        described["pieces"] = pieces
    return described


#: A sharded checkpoint's records up to this size get digests of their own in the manifest.
PIECE_LIMIT = 1 << 16


def small_pieces(directory: str, shards: str) -> dict[str, dict[str, str]]:
    """The digest of each small record (`PIECE_LIMIT`) of the DCP folder `shards` (relative to
    `directory`), by shard file and `"offset+length"`: the values every process holds alike (the
    optimizer's settings and step counts), which DCP writes into one process's file. A process
    that reads its own shards from a store reads these from the other's file by their byte range,
    each checked against its digest (`shards.fetch_missing`)."""
    from fitkit.engine.checkpoint.elastic import safe_reader

    folder = os.path.join(directory, *shards.split("/"))
    by_file: dict[str, list[tuple[int, int]]] = {}
    for info in safe_reader(folder).read_metadata().storage_data.values():
        if info.length <= PIECE_LIMIT:
            by_file.setdefault(info.relative_path, []).append((info.offset, info.length))
    found: dict[str, dict[str, str]] = {}
    for name, spans in by_file.items():
        with open(os.path.join(folder, name), "rb") as f:
            for offset, length in sorted(spans):
                f.seek(offset)
                found.setdefault(f"{shards}/{name}", {})[f"{offset}+{length}"] = hashlib.new(
                    ALGORITHM, f.read(length)).hexdigest()
    return found


def write_manifest(directory: str, content: dict[str, Any], known: dict[str, str] | None = None) -> None:
    """Write `content` plus `describe(directory, known)` as the manifest, synced to disk (write it last)."""
    manifest = {**content, **describe(directory, known)}
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())


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
    said = fabric.broadcast(None if failure is None else (str(failure).strip(), is_write_error(failure)))
    if failure is not None:
        return failure
    if said is None:
        return OSError("another process could not write its part of the checkpoint")
    text = f"on the global-zero process: {said[0]}"
    return OSError(text) if said[1] else CheckpointError(f"writing the checkpoint failed {text}")


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
        remove_checkpoint(path)
    return removed


#: A checkpoint being removed on disk: renamed to this prefix first, so a removal cut short never
#: leaves a `checkpoint-N` that is half deleted (the next run's `recover` sweeps it).
REMOVING_PREFIX = ".removing-"


def remove_checkpoint(path: str) -> None:
    """Remove the committed checkpoint at `path`. On disk it is renamed out of the checkpoints'
    names first, then deleted; in a store its manifest goes first. Either way a removal killed
    midway leaves nothing a resume or a listing takes for a checkpoint."""
    if store.is_url(path):
        parent, name = store.split(path)
        store.Store.open(parent, check=False).remove(name)
        return
    aside = os.path.join(os.path.dirname(path), f"{REMOVING_PREFIX}{os.path.basename(path)}")
    try:
        os.replace(path, aside)
    except OSError:
        if os.path.exists(path):
            raise
        return
    shutil.rmtree(aside, ignore_errors=True)


def hold(directory: str, argument: str) -> Any:
    """`directory`'s lock, taken; then what an interrupted run left there is tidied (see `recover`).
    A store's URL is checked first (`store.Store.open`: a clear error for a missing package or
    bucket, refused credentials, an endpoint that does not answer) and locked with an object."""
    if store.is_url(directory):
        from fitkit.engine.checkpoint import bucket_lock

        held = bucket_lock.acquire(directory, argument)
        recover_store(held.store)
        return held
    lock = run_lock.acquire(directory, argument)
    recover(directory)
    return lock


def recover_store(where: store.Store) -> None:
    """Tidy what an interrupted run left in a store: `checkpoint-N` prefixes without a manifest
    (an upload or a removal cut short) are removed, and so is the local staging folder."""
    for name, files in where.checkpoints().items():
        if MANIFEST not in files:
            logger.warning("removing %s: an incomplete checkpoint an interrupted run left behind",
                           store.join(where.url, name))
            where.remove(name)
    shutil.rmtree(store.staging(where.url), ignore_errors=True)


def recover(directory: str) -> None:
    """Tidy the temporary checkpoints an interrupted run left in `directory` (call it only while
    holding the directory): one that is complete and whose `checkpoint-N` is missing (the run died
    while replacing it) becomes `checkpoint-N`; any other is removed, with a warning."""
    for name in os.listdir(directory):
        if name.startswith(REMOVING_PREFIX):  # a rotation cut short: it was on its way out
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
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


# -- the writer interface ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SaveJob:
    """One checkpoint to write: into `directory` (`own`: the run's `output_dir`, whose commits fire
    `on_save`), then keep `limit` checkpoints there; `state` is the run's `TrainerState` now,
    `extra` the rest of the payload (RNG, loop position), `token` this run's part of temporary names."""

    directory: str
    own: bool
    limit: int | None
    state: TrainerState
    extra: dict[str, Any]
    token: str


@dataclasses.dataclass(frozen=True)
class Committed:
    """A checkpoint complete on disk: its path, whether it is in `output_dir`, and the
    `TrainerState` its `trainer_state.json` records (what its `on_save` receives)."""

    path: str
    own: bool
    state: TrainerState


class CheckpointWriter(Protocol):
    """How checkpoints get to disk. The life of one checkpoint, in this order:

    1. `write(job)`: the checkpoint is handed over (a synchronous writer has committed it when
       this returns; a background one has taken a host copy and writes it on a thread);
    2. `wait_copied()`: before the optimizer next changes the weights, the copy is complete
       (`copying` is not None until then; never for a synchronous writer);
    3. `poll_committed()` between steps (never blocks) or `wait_committed()` (blocks until the
       write in flight commits; a collective under several processes: before the next write and
       at the end of training): the checkpoints committed since the last call, oldest first;
    4. the checkpointer then announces them (`on_save`, `Checkpointer.announce`);
    5. `close()` when the run ends, also on an error: a write in flight ends first.

    `in_flight` is True while step 3 has something to report (or, for a background writer, work
    to do between steps)."""

    copying: Any

    @property
    def in_flight(self) -> bool: ...
    def write(self, job: SaveJob) -> str: ...
    def wait_copied(self) -> None: ...
    def poll_committed(self) -> list[Committed]: ...
    def wait_committed(self) -> list[Committed]: ...
    def close(self) -> None: ...


class WriterBase:
    """What both writers hold: the run's parts, what every checkpoint of it writes alike
    (`run_files`) and the rotation after a commit."""

    copying: Any = None

    def __init__(self, fabric: Any, args: Any, live: TrainerState, *, module: Any, optimizer: Any,
                 scheduler: Any = None) -> None:
        self.fabric, self.args, self.live = fabric, args, live
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler

    @functools.cached_property
    def run_files(self) -> RunFiles:
        """What every checkpoint of this run writes alike (worked out at its first save)."""
        return RunFiles.of(self.args, self.module, self.optimizer)

    def rotate_after(self, job: SaveJob) -> None:
        """Keep `job.limit` checkpoints in its directory; in `output_dir` never the best one (read
        now: while a background write ran, an evaluation may have named it)."""
        rotate(job.directory, job.limit, keep=self.live.best_model_checkpoint if job.own else None)


class SyncCheckpointWriter(WriterBase):
    """Writes and commits each checkpoint before `write` returns (every process takes part)."""

    in_flight = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._done: list[Committed] = []

    def write(self, job: SaveJob) -> str:
        path = save_checkpoint(self.fabric, job.directory, state=job.state, args=self.args, run=self.run_files,
                               module=self.module, optimizer=self.optimizer, scheduler=self.scheduler,
                               extra=job.extra, token=job.token)
        if writes_checkpoints(self.fabric, self.args):
            self.rotate_after(job)
        self._done.append(Committed(path, job.own, job.state))  # the live state: on_save follows at once
        return path

    def wait_copied(self) -> None:
        return None

    def poll_committed(self) -> list[Committed]:
        done, self._done = self._done, []
        return done

    def wait_committed(self) -> list[Committed]:
        return self.poll_committed()

    def close(self) -> None:
        return None
