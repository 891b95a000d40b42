"""One writer per prefix of an object store: the lock object `prefix/.fitkit.lock`, which a run
that writes there creates (global-zero process) and removes at its end.

    lock = acquire("s3://ckpts/run1", "`output_dir`")   # DirectoryInUseError naming the holder
    ...                                                  # write checkpoints
    lock.release()                                       # the object is removed

A store has no advisory locks and no process that the kernel cleans up after, so the object
records the run's id, pid, host and start, and the holder rewrites it every `HEARTBEAT_S`
seconds. A lock is taken over when its holder is gone: on the same host a pid that no longer
runs, elsewhere a lock not rewritten for `stale_after()` seconds (`FITKIT_LOCK_STALE_S`, default
120; a preempted node's run is resumed elsewhere after that long). The object is created with a
conditional write where the store has one (S3's `If-None-Match: *`): two runs starting at once
cannot both win. Elsewhere (`gs://`, `az://` through fsspec here) the check and the write are two
requests, and two runs starting within one request's time of each other may both proceed.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import secrets
import socket
import threading
import time
from typing import Any

from fitkit.engine.checkpoint import store
from fitkit.engine.checkpoint.run_lock import LOCK_FILE, DirectoryInUseError, _alive

logger = logging.getLogger("fitkit")
HEARTBEAT_S = 30.0


def stale_after() -> float:
    """Seconds after which a lock no one rewrote is taken over (`FITKIT_LOCK_STALE_S`)."""
    return float(os.environ.get("FITKIT_LOCK_STALE_S", "120"))


class BucketLock:
    """A held lock object; `release()` stops its heartbeat and removes it (when still ours)."""

    def __init__(self, where: store.Store, record: dict[str, Any]) -> None:
        self.store, self.record = where, record
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="fitkit-lock-heartbeat", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                held = _read(self.store)
                if held and held.get("run") != self.record["run"]:  # taken over while this run was silent
                    logger.warning("the lock %s was taken over by another run (%s): two runs may now write "
                                   "there", store.join(self.store.url, LOCK_FILE), held)
                    return
                self.store.put_bytes(LOCK_FILE, _encode(self.record))
            except Exception as err:  # noqa: BLE001 - a missed beat; the next one tries again
                logger.debug("lock heartbeat for %s failed: %s", self.store.url, err)

    def release(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            if _read(self.store).get("run") == self.record["run"]:
                self.store.fs.rm(self.store._key(LOCK_FILE))
        except Exception as err:  # noqa: BLE001 - the run is over; a stale lock is taken over later
            logger.warning("could not remove the lock %s: %s", store.join(self.store.url, LOCK_FILE), err)


def _encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record) + "\n").encode()


def _read(where: store.Store) -> dict[str, Any]:
    try:
        record = json.loads(where.read_text(LOCK_FILE) or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _age(where: store.Store) -> float:
    """Seconds since the lock object was last written (the store's clock)."""
    try:
        info = where.fs.info(where._key(LOCK_FILE))
    except OSError:
        return 0.0
    modified = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
    if isinstance(modified, datetime.datetime):
        return time.time() - modified.timestamp()
    return time.time() - float(modified) if isinstance(modified, (int, float)) else 0.0


def _gone(where: store.Store, record: dict[str, Any]) -> bool:
    pid = record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
        return not _alive(pid)
    return _age(where) > stale_after()


def acquire(url: str, argument: str = "`output_dir`") -> BucketLock:
    """Check `url` (`store.Store.open`) and take its lock, or raise DirectoryInUseError naming the
    holder and the fix."""
    where = store.Store.open(url, argument)
    record = {"run": secrets.token_hex(8), "pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    for attempt in range(2):
        try:
            store.retried("write the lock", store.join(url, LOCK_FILE),
                          lambda: where.put_bytes(LOCK_FILE, _encode(record), exclusive=True))
            return BucketLock(where, record)
        except FileExistsError:
            held = _read(where)
            if attempt or not _gone(where, held):
                raise DirectoryInUseError(_in_use(url, argument, held)) from None
            logger.warning("taking over %s, left by a run that is gone (pid %s on host %s)",
                           store.join(url, LOCK_FILE), held.get("pid"), held.get("host"))
            where.fs.rm(where._key(LOCK_FILE))
        except PermissionError as err:
            raise store.StoreError(f"{argument}={url!r}: writing is refused ({err}): use credentials that may "
                                   "write to this bucket") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _in_use(url: str, argument: str, held: dict[str, Any]) -> str:
    holder = (f"run {held.get('run')}, pid {held.get('pid')} on host {held.get('host')}, started "
              f"{held.get('started')}") if held else "a run that has not written its name yet"
    return (f"{argument} {url!r} is in use by another fitkit run ({holder}): two runs writing into one prefix "
            f"would overwrite each other's checkpoints. Pass another {argument}, or wait for that run to finish "
            f"(it holds {store.join(url, LOCK_FILE)}; a lock not renewed for {stale_after():.0f} s is taken over)")
