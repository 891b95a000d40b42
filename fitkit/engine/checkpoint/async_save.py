"""Asynchronous checkpoints: a consistent host copy of the state, then a background writer.

With `save_async=True` the training loop blocks only while `HostCopy` copies the state to host
memory (a memory copy on CPU; device to pinned host memory on a GPU, one synchronisation at the
end); tensors are copied, never referenced, so the next optimizer step cannot leak into a
checkpoint being written. `BackgroundWriter` then runs the write, the digests and the commit
(manifest, atomic rename, rotation) on one thread, one checkpoint at a time::

    copy = HostCopy()
    writer = BackgroundWriter()
    payload = copy.take({"model": module.state_dict(), "optimizer": optimizer.state_dict()}).finish()
    writer.submit(lambda: write_and_commit(payload))   # waits for the write before it first
    writer.done()      # True once the write in flight (if any) has ended
    writer.wait()      # the last write's error raised here (None when it committed)

The copy's buffers are kept and reused by the next save when the state has the same shapes
(the previous write has ended by then): the host memory cost is one copy of the state. On a
CPU, buffers of 1 MiB and more are anonymous maps of their own, page-aligned: the writer sends
them to the device from where they lie (`PendingCopy.aligned`, `state_file.DirectFile`).

On a CPU the tensors only the optimizer step changes (parameters, optimizer state) need not be
copied while the loop waits: `take(tree, defer)` copies the rest at once and leaves those to
the writer thread (`PendingCopy.finish`), which copies them during the next forward and
backward; the loop waits for that copy before the next optimizer step, or before a callback
could run (`PendingCopy.wait`)::

    pending = copy.take(payload, defer=storages_of(parameters, optimizer_state))
    writer.submit(lambda: write_and_commit(pending.finish()))
    ...                    # the next forward and backward
    pending.wait()         # then optimizer.step()
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from typing import Any

import torch


class HostCopy:
    """Copies of state trees (dicts, lists, tuples of tensors and plain values) in host memory,
    into buffers kept from the previous copy when the tensors' shapes and dtypes match."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._used: list[torch.Tensor] = []
        self._cuda = False
        self._later: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._defer: set[int] = set()
        self._reserving = False

    def take(self, tree: Any, defer: set[int] | None = None) -> PendingCopy:
        """Start copying `tree` to host memory (containers copied, plain values kept): every
        tensor now, except the CPU tensors whose storage (`untyped_storage().data_ptr()`) is in
        `defer`, which `PendingCopy.finish` copies (from another thread, while nothing changes
        them)."""
        self._used, self._cuda, self._later, self._defer = [], False, [], defer or set()
        copied = self._copy(tree)
        if self._cuda:  # the device-to-host copies were queued without waiting: wait once, here
            torch.cuda.synchronize()
        self._buffers = self._used
        later, self._later, self._defer = self._later, [], set()
        # only the large buffers (maps of their own): a small one may start on a page by chance
        aligned = {b.data_ptr() for b in self._used
                   if b.numel() * b.element_size() >= _PAGE_ALIGNED_FROM and b.data_ptr() % PAGE == 0}
        return PendingCopy(copied, later, aligned)

    def reserve(self, tree: Any) -> None:
        """Allocate and touch (zero) buffers for `tree`'s CPU tensors, for the next `take` to copy
        into (a thread of its own may run this, as long as no `take` runs meanwhile). An error
        leaves the buffers as they were: the next `take` allocates its own."""
        self._used, self._reserving = [], True
        try:
            self._copy(tree)
        except Exception:  # noqa: BLE001 - only an optimisation: `take` allocates what is missing
            return
        finally:
            self._reserving = False
        self._buffers = self._used

    def _copy(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, dict):
            return type(value)((k, self._copy(v)) for k, v in value.items()) if type(value) is not dict \
                else {k: self._copy(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._copy(v) for v in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self._copy(v) for v in value)
        return value

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        index = len(self._used)
        old = self._buffers[index] if index < len(self._buffers) else None
        if old is not None and old.shape == t.shape and old.dtype == t.dtype and old.layout == t.layout \
                and t.layout == torch.strided:
            buffer = old
        elif t.layout != torch.strided:  # sparse and other layouts: a fresh copy
            buffer = torch.empty(0) if self._reserving else t.to("cpu", copy=True)
            self._used.append(buffer)
            return buffer
        else:
            buffer = _empty(t, pinned=t.is_cuda and torch.cuda.is_available())
        if self._reserving:
            buffer.zero_()  # faults the pages in, without reading `t`, which training changes meanwhile
        elif t.is_cuda:
            self._cuda = True
            buffer.copy_(t, non_blocking=True)
        elif self._defer and type(t) is torch.Tensor and t.untyped_storage().data_ptr() in self._defer:
            self._later.append((buffer, t))
        else:
            buffer.copy_(t)
        self._used.append(buffer)
        return buffer


PAGE = mmap.PAGESIZE
_PAGE_ALIGNED_FROM = 1 << 20  # bytes from which a CPU buffer gets pages of its own


def _empty(like: torch.Tensor, pinned: bool) -> torch.Tensor:
    """An uninitialised host buffer shaped as `like`: pinned for a GPU's copies; from 1 MiB,
    an anonymous map of its own (page-aligned, so `state_file.DirectFile` can write it to the
    device without copying it again; unmapped with the tensor)."""
    nbytes = like.numel() * like.element_size()
    if not pinned and nbytes >= _PAGE_ALIGNED_FROM:
        memory = mmap.mmap(-1, nbytes)
        try:
            return torch.frombuffer(memory, dtype=like.dtype, count=like.numel()).view(like.shape)
        except (TypeError, ValueError, RuntimeError):  # a dtype frombuffer does not take
            memory.close()
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pinned)


class PendingCopy:
    """A host copy whose deferred tensors are copied by `finish()` (the writer thread); `wait()`
    blocks another thread until they are, and must come before anything changes them (the
    next optimizer step)."""

    def __init__(self, tree: Any, later: list[tuple[torch.Tensor, torch.Tensor]],
                 aligned: set[int] | None = None) -> None:
        self.tree, self._later = tree, later
        #: the page-aligned buffers' addresses: a direct write may send them from where they lie
        self.aligned = aligned or set()
        self._done = threading.Event()
        if not later:
            self._done.set()

    @property
    def deferred(self) -> bool:
        """True while some tensors are still to be copied."""
        return not self._done.is_set()

    def finish(self) -> Any:
        """Copy the deferred tensors (also after an error: `wait` never blocks for ever); the tree."""
        try:
            for buffer, source in self._later:
                buffer.copy_(source)
        finally:
            self._later = []
            self._done.set()
        return self.tree

    def wait(self) -> None:
        self._done.wait()


class BackgroundWriter:
    """Runs one job at a time on its own thread: a job submitted while another runs waits for
    it first. The job's error is kept and raised by the next `wait()` (or `submit`)."""

    def __init__(self, name: str = "fitkit-checkpoint-writer") -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, job: Callable[[], Any]) -> None:
        """Start `job` in the background once the job in flight (if any) has ended; that job's
        error is raised here instead (and `job` does not start)."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(job,), name=self.name, daemon=False)
        self._thread.start()

    def _run(self, job: Callable[[], Any]) -> None:
        try:
            job()
        except BaseException as err:  # noqa: BLE001 - handed to the training thread by `wait`
            self._error = err

    def done(self) -> bool:
        """True when a job was submitted and has ended (committed or failed), not yet waited for."""
        return self._thread is not None and not self._thread.is_alive()

    def wait(self) -> None:
        """Block until the job in flight (if any) has ended; raise its error, once."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
