"""URLs of object stores (`s3://bucket/run`, `gs://`, `az://`, `file://`, `memory://`) beside
local paths: telling them apart, and the fsspec filesystem of one, with a clear error when its
package is missing. A local path never imports fsspec::

    is_url("runs/a")                     # False: os and shutil, as always
    fs, key = filesystem("s3://ckpts/run1/model.pt", "`path`")   # s3fs's filesystem, "ckpts/run1/model.pt"
    write_bytes("s3://ckpts/model.pt", data, "`path`")           # one object, whole or not at all
"""

from __future__ import annotations

import re
from typing import Any

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
#: protocol -> (the package fsspec needs for it, fitkit's extra that installs it)
PACKAGES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
            "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure")}


class StorageUnavailableError(ValueError):
    """A URL that cannot be used: its protocol's package is missing, its bucket does not exist,
    the credentials are refused or the endpoint does not answer."""


def is_url(path: Any) -> bool:
    """True for a URL with a protocol (`s3://bucket/run`), False for a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def protocol(url: str) -> str:
    """The protocol of `url` (`"s3"` for `s3://bucket/run`)."""
    match = _URL.match(url)
    return match.group(1).lower() if match else "file"


def filesystem(url: str, argument: str) -> tuple[Any, str]:
    """`(fsspec filesystem, path inside it)` of `url`; a `StorageUnavailableError` naming
    `argument`, the URL and the package to install when its protocol cannot be loaded."""
    proto = protocol(url)
    try:
        import fsspec

        fs = fsspec.filesystem(proto)
    except (ImportError, ValueError) as err:
        package, extra = PACKAGES.get(proto, (None, None))
        fix = (f'run `pip install "fitkit[{extra}]"` (or `pip install {package}`)' if package else
               "use a protocol fsspec knows (s3://, gs://, az://, file://, memory://) or a local path")
        raise StorageUnavailableError(f"{argument}={url!r} needs the filesystem for {proto}://, which cannot be "
                                      f"loaded ({type(err).__name__}: {err}): {fix}") from None
    return fs, fs._strip_protocol(url)


def write_bytes(url: str, data: bytes, argument: str) -> None:
    """Write `data` as the object `url` in one request (it appears whole or not at all)."""
    fs, key = filesystem(url, argument)
    fs.pipe_file(key, data)


def read_bytes(url: str, argument: str) -> bytes:
    """The object at `url`; FileNotFoundError naming `argument` when there is none."""
    fs, key = filesystem(url, argument)
    try:
        return fs.cat_file(key)
    except FileNotFoundError:
        raise FileNotFoundError(f"no object at {argument}={url!r}") from None


def local_dir(path: str) -> str:
    """Where a run's own local files go (TensorBoard's event files, the CSV log, MLflow's file
    store, codecarbon's, wandb's and Comet's folders): `path` itself when it is local; for a URL
    the folder `fitkit_output/<protocol>/<bucket>/<prefix>` under the working directory
    (`FITKIT_LOCAL_DIR` replaces `fitkit_output`). Those files are appended to while the run goes
    on, which an object (written whole, once) cannot be::

        local_dir("runs/a")                # "runs/a"
        local_dir("s3://ckpts/run1")       # "fitkit_output/s3/ckpts/run1"
    """
    if not is_url(path):
        return path
    import os

    rest = [part for part in path.split("://", 1)[1].split("/") if part not in ("", ".", "..")]
    return os.path.join(os.environ.get("FITKIT_LOCAL_DIR") or "fitkit_output", protocol(path), *rest)
