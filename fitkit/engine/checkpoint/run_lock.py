"""One writer per directory: an advisory lock (`fcntl.flock`) on `directory/.fitkit.lock`,
taken by the global-zero process of a run that writes there and held until the run ends.

    lock = acquire("runs/a", "`output_dir`")  # DirectoryInUseError naming the holder (pid, host)
    ...                                        # write checkpoints
    lock.release()                             # the lock file is removed

The kernel drops the lock when its process dies (kill -9 included), so a lock left by a dead
run is simply taken over; the file records the holder's pid, host and start time for the
error a refused run shows. The lock is advisory: it keeps fitkit runs apart, nothing else.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, runs are not kept apart
    fcntl = None  # type: ignore[assignment]  # an optional module: None where the platform lacks it

LOCK_FILE = ".fitkit.lock"
logger = logging.getLogger("fitkit")


class DirectoryInUseError(RuntimeError):
    """Another fitkit run writes into this directory (it holds `directory/.fitkit.lock`)."""


class DirectoryLock:
    """A held lock; `release()` gives it back (and removes the file)."""

    def __init__(self, path: str, fd: int | None):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.unlink(self.path)  # while still held: a run waiting to open it then finds the new file
        except OSError:
            pass
        os.close(fd)  # closing releases the lock


def acquire(directory: str, argument: str = "`output_dir`") -> DirectoryLock:
    """Take `directory`'s lock (creating the directory) or raise DirectoryInUseError naming the
    holder and the fix (`argument` names the setting to change)."""
    path = os.path.join(directory, LOCK_FILE)
    if fcntl is None:  # pragma: no cover
        return DirectoryLock(path, None)
    while True:
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:  # read-only: nothing can be written there, by this run or another
            logger.warning("cannot create %s (%s): running without the one-writer lock", path, err.strerror)
            return DirectoryLock(path, None)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise DirectoryInUseError(_in_use(directory, argument, path)) from None
            logger.warning("cannot lock %s (%s): this file system has no advisory locks, so fitkit cannot keep a "
                           "second run from writing into %s", path, err.strerror, directory)
            return DirectoryLock(path, None)
        if _same_file(fd, path):  # not removed by a releasing holder between our open and lock
            break
        os.close(fd)
    previous = _holder(path)
    if previous:
        logger.info("taking over %s, left by a run that ended without releasing it (%s)", path, previous)
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return DirectoryLock(path, fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        held, now = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def _record(path: str) -> dict:
    """What the lock file says of its holder ({} when it says nothing readable)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and "pid" in record else {}


def _holder(path: str) -> str:
    """Who the lock file names, said briefly ("" when it names no one)."""
    record = _record(path)
    return f"pid {record['pid']} on host {record.get('host')}, started {record.get('started')}" if record else ""


def _in_use(directory: str, argument: str, path: str) -> str:
    record = _record(path)
    holder = _holder(path) or "a process that has not written its name yet"
    note, pid = "", record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int):
        if pid == os.getpid():
            note = " (this very process: a fit inside another fit on the same directory)"
        elif not _alive(pid):
            note = f" (pid {pid} has exited: a process it started still holds the lock; end that one)"
    return (f"{argument} {directory!r} is in use by another fitkit run ({holder}){note}: two runs writing into one "
            f"directory would overwrite each other's checkpoints. Pass another {argument}, or wait for that run "
            f"to finish (it holds {path})")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True

