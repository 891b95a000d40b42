"""Background checkpoint writes (`save_async=True`): the `CheckpointWriter` whose loop waits only
for a host copy of the state, while the file, its digest, the commit and the rotation run on a
thread of the global-zero process, one checkpoint at a time.

Its `write` takes the copy (`async_save.HostCopy`; on a CPU the weights and optimizer state are
copied by the thread during the next forward and backward, and `wait_copied` comes before the
next optimizer step), `poll_committed` / `wait_committed` report the commit with the
`TrainerState` the checkpoint recorded (a copy: the live state moves on meanwhile), and `close`
lets a write in flight end (see `writing.CheckpointWriter` for the order)::

    writer = BackgroundCheckpointWriter(fabric, args, state, module=m, optimizer=o)
    writer.write(job)                  # the host copy taken; the write starts on the thread
    writer.wait_copied()               # before optimizer.step()
    done = writer.poll_committed()     # [] until the write has committed
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

from fitkit.common.options import error_line
from fitkit.common.wrappers import torch_optimizer
from fitkit.engine.checkpoint import writing
from fitkit.engine.checkpoint.async_save import BackgroundWriter, HostCopy, PendingCopy
from fitkit.engine.checkpoint.elastic import full_payload
from fitkit.engine.checkpoint.layout import WEIGHTS, CheckpointError, CheckpointWriteError
from fitkit.engine.checkpoint.state_file import BLOCK, DirectFile, HashingFile, save_state
from fitkit.engine.checkpoint.write_errors import is_write_error, storage_error, unwritten
from fitkit.engine.checkpoint.writing import Committed, SaveJob, WriterBase
from fitkit.engine.devices.local import strategy_name

logger = logging.getLogger("fitkit")


def write_in_background(output_dir: str, global_step: int, token: str, payload: dict[str, Any],
                        files: dict[str, str], fields: dict[str, Any], in_place: Iterable[int] = ()) -> str:
    """Write a checkpoint from `payload`, a host copy of the state (model and optimizer state
    dicts and the rest, as one process saves them), with `files` (`texts`) and the manifest
    `fields`; commit it (rename) and return its path. Runs on the writer thread of an
    asynchronous save: until the rename nothing of it is a checkpoint. When a write fails the
    temporary directory is removed and `CheckpointWriteError` (the storage) is raised."""
    final = writing.checkpoint_path(output_dir, global_step)
    tmp = writing.temporary_path(output_dir, global_step, token)
    try:
        writing.prepare(output_dir, tmp)
        with DirectFile(os.path.join(tmp, WEIGHTS), in_place=in_place) as f:  # a full disk: an OSError
            digest = HashingFile(f)
            save_state(payload, digest, alignment=BLOCK if f.direct and in_place else None)
        writing.commit(tmp, final, files, fields, known={WEIGHTS: digest.hexdigest()})
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_write_error(err):
            root = storage_error(err)
            raise CheckpointWriteError(unwritten(final, root, payload.get("model"), payload.get("optimizer"))) from root
        raise
    return final


class BackgroundCheckpointWriter(WriterBase):
    """A `CheckpointWriter` that writes on a thread (see the module's docstring). Every process
    calls it alike; only the global-zero process copies and writes."""

    def __init__(self, *args: Any, defer_copy: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._thread: BackgroundWriter | None = None  # from the first write (or reservation)
        self._copy = HostCopy()  # the host copy of the state the writes are made from
        self._pending: list[Committed] = []  # handed to the thread, not settled yet
        self._done: list[Committed] = []  # settled, not reported yet
        # On a CPU the weights and optimizer state are copied on the thread during the next forward
        # and backward; False where an overridden `train_step` steps the optimizer itself.
        self._defer_copy = defer_copy
        self.copying: PendingCopy | None = None  # that copy, until `wait_copied`
        # After the first step the thread allocates the host copy's buffers (`_reserve`): fresh
        # memory is slow to fault in, and the first save's copy would otherwise make the loop wait.
        self._reserve_due = self.args.save_strategy != "no"

    @property
    def in_flight(self) -> bool:
        return bool(self._pending) or self._reserve_due

    def write(self, job: SaveJob) -> str:
        """Take the host copy (the loop's only wait) and start the write on the thread; a write
        still in flight commits first (reported by the next `poll_committed`)."""
        if self._pending:
            self._settle()
        payload = full_payload(self.fabric, self.module, self.optimizer, self.scheduler, job.extra)
        path = writing.checkpoint_path(job.directory, job.state.global_step)
        # the state as this checkpoint records it, for its `on_save`: the live one moves on meanwhile
        self._pending.append(Committed(path, job.own, copy.deepcopy(job.state)))
        if not self.fabric.is_global_zero:
            return path
        pending = self._copy.take(payload, self._settled_storages())
        files = writing.texts(job.state, self.run_files)  # rendered now, written later
        fields = writing.manifest_fields(job.state.global_step, self.run_files)

        def run() -> None:
            write_in_background(job.directory, job.state.global_step, job.token, pending.finish(), files, fields,
                                pending.aligned)
            self.rotate_after(job)

        if self._thread is None:
            self._thread = BackgroundWriter()
        self._thread.submit(run)
        if pending.deferred:
            self.copying = pending
        return path

    def _settled_storages(self) -> set[int] | None:
        """The storages only the optimizer step changes (the parameters, the optimizer's state),
        whose copy may wait for the thread; None where every tensor is copied at once (a GPU: the
        device-to-host copy is queued; an overridden `train_step`; FSDP, whose saved tensors are
        gathered copies already)."""
        if not self._defer_copy or self.fabric.device.type != "cpu" \
                or "FSDP" in strategy_name(self.fabric):
            return None
        optimizer = torch_optimizer(self.optimizer)
        tensors = [*self.module.parameters(), *(v for values in getattr(optimizer, "state", {}).values()
                                                for v in values.values() if isinstance(v, torch.Tensor))]
        found = set()
        for t in tensors:
            try:
                found.add(t.untyped_storage().data_ptr())
            except RuntimeError:  # a storage freed or swapped by a wrapper: copied at once, as unknown
                continue
        return found

    def wait_copied(self) -> None:
        """Wait until the copy of the weights and optimizer state is complete: the loop calls it
        before the optimizer step, the handler before any callback runs."""
        pending, self.copying = self.copying, None
        if pending is not None:
            pending.wait()

    def poll_committed(self) -> list[Committed]:
        """Between steps: on one process a write that has ended is settled at once (its error
        raised here); under several processes only by `wait_committed`. Also the moment, after
        the first step, to reserve the host copy's buffers."""
        if self._pending and self.fabric.world_size == 1 and self._thread is not None and self._thread.done():
            self._settle()
        if self._reserve_due:
            self._reserve()
        done, self._done = self._done, []
        return done

    def wait_committed(self) -> list[Committed]:
        """Wait for the write in flight (if any) to commit; its error is raised here, on every
        process (a `CheckpointWriteError` for the storage). A collective under several processes.
        With nothing pending, waits for the buffers' reservation if that still runs."""
        if self._pending:
            self._settle()
        elif self._thread is not None:
            self._thread.wait()
        done, self._done = self._done, []
        return done

    def _settle(self) -> None:
        self.wait_copied()
        failure = None
        if self._thread is not None:
            try:
                self._thread.wait()
            except Exception as err:  # noqa: BLE001 - agreed on by every process, then raised
                failure = err
        if self.fabric.world_size > 1:
            failure = writing.agree(self.fabric, failure)
        pending, self._pending = self._pending, []
        if failure is None:
            self._done.extend(pending)
        elif isinstance(failure, CheckpointError):
            raise failure
        elif isinstance(failure, OSError):
            raise CheckpointWriteError(f"could not write the checkpoint {pending[-1].path!r} in the background "
                                       f"({error_line(failure)}); free space or make the directory writable, "
                                       "then resume") from failure
        else:
            raise failure

    def _reserve(self) -> None:
        """Have the thread allocate and touch the host copy's buffers, shaped as the state is now
        (after the first optimizer step: the optimizer's state exists), so the first save copies
        into memory already faulted in. On a CPU, on the global-zero process, once; a save that
        comes first waits for it (it would have faulted the memory in itself)."""
        self._reserve_due = False
        if not self.fabric.is_global_zero or self._thread is not None or self._settled_storages() is None:
            return
        payload = full_payload(self.fabric, self.module, self.optimizer, self.scheduler, {})
        self._thread = BackgroundWriter()
        self._thread.submit(lambda: self._copy.reserve(payload))

    def close(self) -> None:
        """Let a write in flight end (an error that ends the run early leaves it to commit, or to
        clean up after itself); its error is logged, the run is ending on another one."""
        if self._thread is not None:
            try:
                self._thread.wait()
            except Exception as err:  # noqa: BLE001 - the run is ending on another error
                logger.warning("the checkpoint written in the background failed: %s", error_line(err))
