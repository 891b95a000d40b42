"""Writing a background checkpoint's `state.pt` quickly: digested while written, past the page
cache, from where the host copy lies, without torch's per-record CRC-32.

    with DirectFile(path, in_place=pending.aligned) as raw:   # O_DIRECT where the filesystem allows it
        out = HashingFile(raw)
        save_state(payload, out, alignment=BLOCK)   # torch.save's format, CRC-32 fields left at 0
    digest = out.hexdigest()                        # the manifest's SHA-256 of the file

Why each part (a 200 MB state, a 2-core virtual machine, a background write beside a training
step):
- `HashingFile`: the manifest needs the file's digest; taking it while writing saves reading
  the file back.
- `DirectFile`: a buffered write copies the state into the page cache and leaves the kernel
  to write it back later, on the cores the training step uses; a write into pages the virtual
  machine has not touched yet took 0.6 s instead of 0.1 s. Written with `O_DIRECT`, the device
  reads the memory itself: 0.2 s every time, no later writeback. Where the filesystem refuses
  `O_DIRECT` (tmpfs, some network filesystems), the file is written buffered, as `open()` would.
- In place: with every record's data at a multiple of 4096 bytes in the file
  (`alignment=BLOCK`), the host copy's page-aligned buffers (`async_save.HostCopy`, from
  1 MiB) go to the device from where they lie, while the digest reads them; the rest (headers,
  small tensors) is gathered in two aligned buffers, one written by an I/O thread while the
  other fills. The copies into those buffers go through numpy, which releases the GIL: a slice
  assignment holds it for the whole copy, and the training thread, which takes the GIL back
  after every torch operation, waited for it (a training step took 40-60% longer while a
  thread copied that way, against 0-15% for a copy without the GIL).
- `save_state`: torch computes a CRC-32 of every record (50 ms of CPU per 200 MB); the
  manifest's SHA-256 already covers the whole file, and `torch.load` does not check the
  CRC-32. Only this call skips it: torch's process-wide setting is left as the user set it.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import mmap
import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: The digest new manifests record (with SHA-NI, on most x86 and ARM servers, faster than
#: BLAKE2b: see docs/checkpoints.md). Files can be checked by hand with `sha256sum`.
ALGORITHM = "sha256"
_COPY_WITHOUT_GIL = 64 << 10  # bytes from which a copy into the buffer goes through numpy
BLOCK = 4096  # O_DIRECT's alignment of offsets, lengths and buffers (a page; 512 suffices on most disks)


class HashingFile:
    """A binary file being written that digests what goes through it, so the manifest need not
    read the file back (an asynchronous save: a few hundred MB less to read per checkpoint)."""

    def __init__(self, file: Any, algorithm: str = ALGORITHM) -> None:
        self.file, self._hash = file, hashlib.new(algorithm)

    def write(self, data: Any) -> int:
        written = self.file.write(data)  # first: a write from where the data lies overlaps the digest
        self._hash.update(data)  # releases the GIL for large blocks, as the write does
        return written

    def flush(self) -> None:
        self.file.flush()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


class DirectFile:
    """A new file written with `O_DIRECT` through page-aligned buffers of `buffer_size` bytes;
    the last block is padded, then the file is cut to its length. Falls back to buffered writes
    where the filesystem refuses `O_DIRECT`. A context manager; `close()` completes the file.

    `in_place`: the addresses of memory that stays unchanged until the file is closed (the host
    copy's page-aligned buffers). A write of such memory at a block-aligned offset of the file
    (`save_state(..., alignment=BLOCK)`) goes to the device from where it lies, not copied first.
    """

    def __init__(self, path: str, buffer_size: int = 8 << 20, in_place: Iterable[int] = ()) -> None:
        direct = getattr(os, "O_DIRECT", 0)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        try:
            self._fd = os.open(path, flags | direct, 0o666)
            self.direct = bool(direct)
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            self._fd, self.direct = os.open(path, flags, 0o666), False
        import numpy  # a dependency of fitkit; imported here, where the copies need it

        self._numpy = numpy
        self._in_place = set(in_place)
        # Two buffers: one filled while the other is written on the I/O thread, which mostly
        # waits for the device; anonymous maps are page-aligned and outside malloc's heap.
        self._buffers = [mmap.mmap(-1, buffer_size) for _ in range(2)]
        self._views = [memoryview(b) for b in self._buffers]
        self._arrays = [numpy.frombuffer(v, numpy.uint8) for v in self._views]
        self._current = 0  # the buffer being filled
        self._used = 0  # bytes waiting in it
        self._buffer_writes: list[Future | None] = [None, None]  # each buffer's write in flight
        self._writes: collections.deque[Future] = collections.deque()  # all writes, in file order
        self._io: ThreadPoolExecutor | None = None
        self._failed = False
        self.size = 0  # bytes written through `write`
        self.written_in_place = 0  # of which sent to the device from the caller's memory

    def write(self, data: Any) -> int:
        data = memoryview(data).cast("B")
        n = len(data)
        if self._in_place and self.direct and n >= BLOCK and self.size % BLOCK == 0:
            address = self._numpy.frombuffer(data, self._numpy.uint8).ctypes.data
            if address in self._in_place and address % BLOCK == 0:
                whole = n - n % BLOCK
                if self._used:  # whole blocks, as the file's offset is aligned
                    self._hand_over()
                self._submit(data[:whole])
                self.written_in_place += whole
                data = data[whole:]
        self._fill(data)
        self.size += n
        return n

    def _fill(self, data: memoryview) -> None:
        done, n, room = 0, len(data), len(self._views[0])
        while done < n:
            take = min(n - done, room - self._used)
            if take >= _COPY_WITHOUT_GIL:
                # numpy's copy releases the GIL, a slice assignment does not: held for the copy of a
                # whole buffer, it stalls the training thread at each of its Python-level steps.
                self._numpy.copyto(self._arrays[self._current][self._used:self._used + take],
                                   self._numpy.frombuffer(data[done:done + take], self._numpy.uint8))
            else:
                self._views[self._current][self._used:self._used + take] = data[done:done + take]
            self._used += take
            done += take
            if self._used == room:
                self._hand_over()

    def _hand_over(self) -> None:
        """Queue the filled part of the current buffer for the I/O thread and go on in the other
        one, once its own write (whose error is raised here) has ended."""
        self._buffer_writes[self._current] = self._submit(self._views[self._current][:self._used])
        self._current, self._used = 1 - self._current, 0
        pending, self._buffer_writes[self._current] = self._buffer_writes[self._current], None
        if pending is not None:
            pending.result()

    def _submit(self, view: memoryview) -> Future:
        """Queue a write (the I/O thread writes in queue order); raise the error of any write
        that ended with one."""
        while self._writes and self._writes[0].done():
            self._writes.popleft().result()
        if self._io is None:
            self._io = ThreadPoolExecutor(1, thread_name_prefix="fitkit-state-io")
        future = self._io.submit(self._write, view)
        self._writes.append(future)
        return future

    def flush(self) -> None:
        """Nothing to do: the buffer holds less than a block-aligned write until `close`."""

    def close(self, complete: bool = True) -> None:
        """Write what the buffer holds and close; `complete=False` (after a failed write) only
        closes: the caller removes the file."""
        if self._fd < 0:
            return
        try:
            if complete:
                while self._writes:
                    self._writes.popleft().result()
            if complete and self._used:
                tail = self._used
                if self.direct:  # whole blocks only: pad, write, then cut the file to its length
                    tail = -(-tail // BLOCK) * BLOCK
                    self._views[self._current][self._used:tail] = bytes(tail - self._used)
                self._write(self._views[self._current][:tail])
                if self.direct:
                    os.ftruncate(self._fd, self.size)
        finally:
            self._failed = True  # writes still queued (after an error) are skipped
            if self._io is not None:  # a write still running ends before the close
                self._io.shutdown(wait=True, cancel_futures=True)
            self._writes.clear()
            self._buffer_writes = [None, None]
            fd, self._fd = self._fd, -1
            os.close(fd)
            self._arrays = []  # numpy's exports of the views end before the views
            with contextlib.suppress(BufferError):  # views still held by a traceback: freed with them
                for view, buffer in zip(self._views, self._buffers):
                    view.release()
                    buffer.close()

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.close(complete=kind is None)

    def _write(self, view: memoryview) -> None:
        if self._failed:
            return
        try:
            while len(view):
                try:
                    written = os.write(self._fd, view)
                except OSError as err:
                    if err.errno != errno.EINVAL or not self.direct:
                        raise
                    # The open accepted O_DIRECT but the filesystem refuses the write: buffered from here.
                    import fcntl  # POSIX only, as O_DIRECT is

                    fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                    self.direct = False
                    continue
                view = view[written:]
        except BaseException:
            self._failed = True  # the writes queued after this one would land at the wrong offsets
            raise


def save_state(payload: Any, file: Any, alignment: int | None = None) -> None:
    """`torch.save(payload, file)` without the records' CRC-32 (see the module's text), each
    record's data starting at a multiple of `alignment` bytes (torch's setting by default); plain
    `torch.save` where this torch build's writer takes other arguments."""
    import torch
    from torch import serialization

    try:
        writer = torch._C.PyTorchFileWriter(file, False, alignment or serialization._get_storage_alignment())
    except (AttributeError, TypeError):
        torch.save(payload, file)
        return
    try:
        serialization._save(payload, writer, serialization.pickle, serialization.DEFAULT_PROTOCOL, False)
    except BaseException:
        # Marks the writer finished, as torch.save's own exit does: otherwise its destructor
        # writes the end of the file again and aborts the process on the inconsistent position.
        with contextlib.suppress(Exception):
            writer.write_end_of_file()
        raise
    writer.write_end_of_file()
    file.flush()
