"""Where checkpoints live: a local folder, or an object store named by a URL.

A local path (`"runs/a"`, `"/data/runs/a"`) is the fast path: the other checkpoint modules use
`os` and `shutil` on it and nothing here is imported for it but `is_url`. A URL with a protocol
(`s3://`, `gs://`, `az://`, `file://`, `memory://`) goes through `fsspec.filesystem(protocol)`,
with its credentials and endpoint from the usual places (for S3: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `~/.aws`; fsspec's `FSSPEC_S3_*` variables). A store
has no rename, so a checkpoint is written into a local staging folder (`staging`) as on disk,
then published: its objects first, the manifest last (`publish`); it is removed manifest first
(`remove`). A checkpoint in a store is complete once its manifest is there::

    if is_url(output_dir):                                 # "s3://ckpts/run1"
        store = Store.open(output_dir, "`output_dir`")     # a clear error: missing package, bucket, endpoint
        store.publish("/tmp/fitkit-staging/.../.tmp-checkpoint-8-ab12", "checkpoint-8")
        store.checkpoints()                                # {"checkpoint-8": {"state.pt": 1234, ...}}
        store.remove("checkpoint-8")                       # its manifest first
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fitkit.common.urls import StorageUnavailableError, filesystem, is_url, protocol
from fitkit.engine.checkpoint.layout import CHECKPOINT_NAME, MANIFEST, CheckpointError, CheckpointWriteError

__all__ = ["Store", "StoreError", "is_url", "join", "protocol", "retried", "split", "staging"]

#: How often, and after how long, a failed upload or removal is tried again (an endpoint that
#: restarts, a throttled request) before the save fails.
RETRY_DELAYS = (1.0, 2.0, 4.0)
T = TypeVar("T")


class StoreError(CheckpointError, StorageUnavailableError):
    """A URL that cannot be used: its protocol's package is missing, its bucket does not exist,
    the credentials are refused or the endpoint does not answer."""


def join(base: str, *names: str) -> str:
    """`base/name/...` for a URL or a local path."""
    return "/".join([base.rstrip("/"), *names]) if is_url(base) else os.path.join(base, *names)


def staging(url: str) -> str:
    """The local folder where checkpoints bound for `url` are written before they are published
    (`FITKIT_STAGING_DIR`, default the system's temporary folder; one sub-folder per URL)."""
    return os.path.join(_staging_root(), hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16])


def is_staged(path: str) -> bool:
    """True for a local copy `fetch` made (under a staging folder)."""
    return not is_url(path) and os.path.abspath(path).startswith(os.path.abspath(_staging_root()) + os.sep)


def _staging_root() -> str:
    return os.environ.get("FITKIT_STAGING_DIR") or os.path.join(tempfile.gettempdir(), "fitkit-staging")


def retried(what: str, url: str, action: Callable[[], T]) -> T:
    """`action()`, tried again after `RETRY_DELAYS` when the store fails; then a
    `CheckpointWriteError` naming `url` (the save is not counted, earlier checkpoints stand)."""
    for delay in (*RETRY_DELAYS, None):
        try:
            return action()
        except (CheckpointError, FileNotFoundError, FileExistsError, PermissionError):
            raise
        except Exception as err:  # botocore's and aiohttp's errors are not OSErrors
            if delay is None:
                raise CheckpointWriteError(
                    f"could not {what} {url!r} after {len(RETRY_DELAYS) + 1} tries ({type(err).__name__}: "
                    f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}); the earlier checkpoints in the "
                    "store are intact: check the endpoint and credentials, then run again with "
                    "resume_from_checkpoint=True") from err
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


class Store:
    """One URL prefix of an object store (a run's `output_dir`, or where one checkpoint is)."""

    def __init__(self, url: str, fs: Any) -> None:
        self.url, self.fs = url.rstrip("/"), fs
        self.root = fs._strip_protocol(self.url).rstrip("/")

    @classmethod
    def open(cls, url: str, argument: str = "`output_dir`", check: bool = True) -> Store:
        """The store of `url`; with `check`, its bucket must answer (listed once): a `StoreError`
        naming `argument`, the URL and the fix otherwise (never a local stand-in folder)."""
        try:
            fs, _ = filesystem(url, argument)
        except StorageUnavailableError as err:
            raise StoreError(str(err)) from None
        store = cls(url, fs)
        if check:
            store.check(argument)
        return store

    def check(self, argument: str) -> None:
        """List the bucket once: a bucket that does not exist, refused credentials or an endpoint
        that does not answer is a `StoreError` before anything is written."""
        if self._folders:  # a file system (file://, memory://): nothing to reach, folders are made as needed
            return
        bucket = self.root.split("/", 1)[0]
        try:
            self.fs.invalidate_cache()
            self.fs.ls(bucket, detail=False)
        except FileNotFoundError:
            raise StoreError(f"{argument}={self.url!r}: the bucket {bucket!r} does not exist (or this endpoint "
                             "does not have it): create it first, or fix the URL") from None
        except Exception as err:  # noqa: BLE001 - credentials, endpoint: the library's own error types
            raise StoreError(
                f"{argument}={self.url!r} cannot be reached ({type(err).__name__}: "
                f"{str(err).strip().splitlines()[0] if str(err).strip() else 'no message'}): check the credentials "
                "(for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws) and the endpoint "
                "(AWS_ENDPOINT_URL for an S3-compatible server)") from None

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    @property
    def _folders(self) -> bool:
        """True for a store with folders rather than buckets (`file://`, `memory://`)."""
        return protocol(self.url) in ("file", "local", "memory")

    def _parent(self, key: str) -> None:
        """Make the folder of `key` where the store has folders (an object store has none)."""
        if self._folders:
            self.fs.makedirs(key.rsplit("/", 1)[0], exist_ok=True)

    # -- listing ---------------------------------------------------------------------------------
    def objects(self) -> dict[str, int]:
        """Every object under the prefix, by name relative to it, with its size: one listing."""
        self.fs.invalidate_cache(self.root)
        try:
            found = retried("list", self.url, lambda: self.fs.find(self.root, detail=True))
        except FileNotFoundError:
            return {}
        cut = len(self.root) + 1
        return {key[cut:]: int(info.get("size") or 0) for key, info in found.items()
                if key.startswith(self.root + "/") and info.get("type") != "directory"}

    def checkpoints(self, objects: dict[str, int] | None = None) -> dict[str, dict[str, int]]:
        """The `checkpoint-N` prefixes under this one, each with its objects (relative names and
        sizes), complete or not."""
        objects = self.objects() if objects is None else objects
        found: dict[str, dict[str, int]] = {}
        for name, size in objects.items():
            head, _, rest = name.partition("/")
            if rest and CHECKPOINT_NAME.match(head):
                found.setdefault(head, {})[rest] = size
        return found

    def read_text(self, name: str) -> str:
        return retried("read", self._key(name), lambda: self.fs.cat_file(self._key(name))).decode("utf-8")

    def exists(self, name: str = "") -> bool:
        self.fs.invalidate_cache(self.root)
        return bool(self.fs.exists(self._key(name)))

    def complete(self, name: str, files: dict[str, int]) -> bool:
        """True when the checkpoint `name` (its objects `files`) has a manifest listing exactly
        objects of the sizes present: cheap, for listing (the digests are checked on load)."""
        if MANIFEST not in files:
            return False
        try:
            manifest = json.loads(self.read_text(f"{name}/{MANIFEST}"))
            listed = manifest["files"]
            return isinstance(listed, dict) and all(files.get(n) == s for n, s in listed.items())
        except (OSError, ValueError, KeyError, TypeError):
            return False

    # -- writing -----------------------------------------------------------------------------------
    def put_bytes(self, name: str, data: bytes, exclusive: bool = False) -> None:
        """Write one object (one request: it appears whole or not at all). `exclusive`: only
        when no object of that name exists (`If-None-Match: *` on S3): FileExistsError otherwise."""
        key = self._key(name)
        self._parent(key)
        if exclusive and protocol(self.url) in ("s3", "s3a"):
            self.fs.pipe_file(key, data, IfNoneMatch="*")
        elif exclusive:
            if self.fs.exists(key):  # no conditional write here: checked first (a narrow race)
                raise FileExistsError(key)
            self.fs.pipe_file(key, data)
        else:
            self.fs.pipe_file(key, data)

    def remove(self, name: str) -> None:
        """Remove the checkpoint (or any prefix) `name`: its manifest first, so what a kill
        leaves half removed is never taken for complete."""
        objects = [n for n in self.objects() if n.startswith(name + "/")]
        manifest = f"{name}/{MANIFEST}"
        retried("remove", self._key(name), lambda: self._rm([manifest] if manifest in objects else []))
        retried("remove", self._key(name), lambda: self._rm([n for n in objects if n != manifest]))

    def _rm(self, names: list[str]) -> None:
        if names:
            self.fs.rm([self._key(n) for n in names])

    def publish(self, local: str, name: str) -> None:
        """Upload the checkpoint written at the local folder `local` as `name`: an existing one of
        that name is removed first (manifest first), then every object, the manifest last. A
        store that keeps failing is a `CheckpointWriteError` naming the checkpoint (not counted
        as written: without its manifest it is no checkpoint)."""
        try:
            self._publish(local, name)
        except CheckpointWriteError as err:
            raise CheckpointWriteError(f"the checkpoint {self._key(name)!r} was not written: {err}") from err

    def _publish(self, local: str, name: str) -> None:
        if any(n.startswith(name + "/") for n in self.objects()):
            self.remove(name)
        files = sorted(os.path.relpath(os.path.join(root, f), local).replace(os.sep, "/")
                       for root, _, names in os.walk(local) for f in names)
        for rel in [f for f in files if f != MANIFEST] + [MANIFEST]:
            source, key = os.path.join(local, *rel.split("/")), self._key(f"{name}/{rel}")
            self._parent(key)
            retried("upload", key, functools.partial(self.fs.put_file, source, key))

    def fetch(self, name: str, local: str, files: dict[str, int] | None = None,
              later: Callable[[str], bool] = lambda rel: False) -> str:
        """Download the checkpoint `name` (its objects `files`, default: listed now) into the local
        folder `local` (replacing it), but those for which `later(rel)` holds (a sharded
        checkpoint's shards: each process downloads the ones it reads, `download`); its path.
        Its URL is kept beside it (`origin`), for processes on other machines to download their own."""
        shutil.rmtree(local, ignore_errors=True)
        os.makedirs(local)
        for rel in self.checkpoints().get(name, {}) if files is None else files:
            if not later(rel):
                self.download(f"{name}/{rel}", os.path.join(local, *rel.split("/")))
        with open(local + ORIGIN, "w", encoding="utf-8") as f:
            f.write(join(self.url, name))
        return local

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """`length` bytes of the object `name` from `start` (one ranged request)."""
        key = self._key(name)
        return retried("read", key, lambda: self.fs.cat_file(key, start=start, end=start + length))

    def download(self, name: str, target: str) -> None:
        """Download the object `name` into the local file `target` (its folder made)."""
        os.makedirs(os.path.dirname(target), exist_ok=True)
        key = self._key(name)
        retried("download", key, functools.partial(self.fs.get_file, key, target))


#: Beside a downloaded checkpoint `download/checkpoint-N`: the file `checkpoint-N.origin`, its URL.
ORIGIN = ".origin"


def origin(local: str) -> str | None:
    """The URL the local copy `local` was downloaded from (`Store.fetch`), None for another path."""
    if not is_staged(local):
        return None
    try:
        with open(local.rstrip(os.sep) + ORIGIN, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def discard(copies: list[str], zero: bool) -> None:
    """Remove the local copies `fetch` made for this process (the global-zero process's own
    folder by it alone: the other processes on its machine may read it until the run ends)."""
    for path in copies:
        if zero or f"{os.sep}download-rank" in path:
            shutil.rmtree(path, ignore_errors=True)
            try:
                os.remove(path + ORIGIN)
            except OSError:
                pass


def manifest_digest(local: str) -> str | None:
    """A digest of the manifest at the local checkpoint `local` (None without one): two copies of
    one checkpoint have the same."""
    try:
        with open(os.path.join(local, MANIFEST), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def check_sharded_save(args: Any, fabric: Any, strategy: str) -> None:
    """Refuse what would lose shards: a sharded FSDP save has every process write its shards into
    the global-zero process's staging folder, so across machines, with a bucket as `output_dir`,
    that folder must be one every node sees, or the checkpoint is saved whole by the global-zero
    process (`fsdp_full_checkpoint=True`, `save_async=True`)."""
    if (not is_url(args.output_dir) or fabric.world_size == 1 or args.save_async
            or getattr(args, "fsdp_full_checkpoint", False) or os.environ.get("FITKIT_STAGING_DIR")
            or "FSDP" not in strategy):
        return
    if getattr(getattr(fabric, "strategy", None), "num_nodes", 1) > 1:
        raise StoreError(
            f"`output_dir`={args.output_dir!r} with sharded FSDP checkpoints on several machines: each process "
            "writes its shards into a local staging folder before the upload, which the other machines do not "
            "see. Pass fsdp_full_checkpoint=True or save_async=True (the global-zero process saves the "
            "gathered checkpoint alone), or set FITKIT_STAGING_DIR to a folder every machine shares")


def split(url: str) -> tuple[str, str]:
    """`(prefix, last name)` of a URL: `("s3://b/run", "checkpoint-8")`."""
    head, _, tail = url.rstrip("/").rpartition("/")
    return head, tail
