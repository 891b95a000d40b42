"""Atomic file writes: a reader never sees a half-written file."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def atomic_torch_save(obj: Any, path: str) -> None:
    """`torch.save` to a temporary file in the same folder, then rename it over `path`. A URL
    (`s3://bucket/model.pt`) is written as one object, which appears whole or not at all."""
    import torch

    from fitkit.common.urls import is_url, write_bytes

    if is_url(path):
        import io

        buffer = io.BytesIO()
        torch.save(obj, buffer)
        write_bytes(path, buffer.getvalue(), "`path`")
        return

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # torch's archive writer rejects names like ".tmp-abc" (a dot name without extension)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private; give it the usual mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
