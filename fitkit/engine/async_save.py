"""Asynchronous checkpoints: a consistent host copy of the state, then a background writer.

With `save_async=True` the training loop blocks only while `HostCopy` copies the state to host
memory (a memory copy on CPU; device to pinned host memory on a GPU, one synchronisation at the
end); tensors are copied, never referenced, so the next optimizer step cannot leak into a
checkpoint being written. `BackgroundWriter` then runs the write, the digests and the commit
(manifest, atomic rename, rotation) on one thread, one checkpoint at a time::

    copy = HostCopy()
    writer = BackgroundWriter()
    payload = copy.of({"model": module.state_dict(), "optimizer": optimizer.state_dict()})
    writer.submit(lambda: write_and_commit(payload))   # waits for the write before it first
    writer.done()      # True once the write in flight (if any) has ended
    writer.wait()      # the last write's error raised here (None when it committed)

The copy's buffers are kept and reused by the next save when the state has the same shapes
(the previous write has ended by then): the host memory cost is one copy of the state.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch


class HostCopy:
    """Copies of state trees (dicts, lists, tuples of tensors and plain values) in host memory,
    into buffers kept from the previous copy when the tensors' shapes and dtypes match."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []
        self._used: list[torch.Tensor] = []
        self._cuda = False

    def of(self, tree: Any) -> Any:
        """`tree` with every tensor copied to host memory (containers copied, plain values kept)."""
        self._used, self._cuda = [], False
        copied = self._copy(tree)
        if self._cuda:  # the device-to-host copies were queued without waiting: wait once, here
            torch.cuda.synchronize()
        self._buffers = self._used
        return copied

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
            buffer = t.to("cpu", copy=True)
            self._used.append(buffer)
            return buffer
        else:
            buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda and torch.cuda.is_available())
        if t.is_cuda:
            self._cuda = True
            buffer.copy_(t, non_blocking=True)
        else:
            buffer.copy_(t)
        self._used.append(buffer)
        return buffer


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

    def busy(self) -> bool:
        """True while a job runs."""
        return self._thread is not None and self._thread.is_alive()

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
