"""What a failed checkpoint write says: whether the storage failed (disk full, read-only, quota),
the space a checkpoint needs and is free, and the earlier checkpoint that is intact.

Usage::

    if is_write_error(err):
        raise CheckpointWriteError(unwritten(final, err, module, optimizer)) from err
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import Any

from fitkit.common.options import error_line
from fitkit.common.urls import is_url
from fitkit.engine.checkpoint.layout import MANIFEST
from fitkit.engine.checkpoint.listing import list_checkpoints


def storage_error(err: BaseException) -> BaseException:
    """The OSError behind `err` when there is one (torch's writer may raise its own error after it)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return err


def is_write_error(err: BaseException) -> bool:
    """A failure of the storage (disk full, read-only, quota, ...), as the writers raise it: an
    OSError, torch's zip writer's error or DCP's gathered one (which may wrap another rank's)."""
    cause = err.__cause__ or err.__context__
    if cause is not None and cause is not err and is_write_error(cause):
        return True  # torch's zip writer may report its own state after the OSError it met
    text = str(err)
    return isinstance(err, OSError) or "PytorchStreamWriter failed" in text or "file write failed" in text or (
        type(err).__name__ == "CheckpointException" and ("Errno" in text or "OSError" in text))


def unwritten(final: str, failure: BaseException, module: Any, optimizer: Any) -> str:
    if is_url(final):  # a store that failed: asking it for its space or listing would fail again
        return (f"could not write the checkpoint {final!r} ({error_line(failure)}); without its manifest it is no "
                "checkpoint, and the earlier checkpoints in the store are intact: check the endpoint, the "
                "credentials and the bucket's quota, then run again with resume_from_checkpoint=True to continue")
    directory = os.path.dirname(final)
    earlier = list_checkpoints(directory)
    need, basis = _space_needed(earlier[-1] if earlier else None, module, optimizer)
    try:
        free = f"{_size(shutil.disk_usage(directory).free)} are free there now"
    except OSError:
        free = "the free space there is unknown"
    intact = (f"The newest complete checkpoint, {earlier[-1]!r}, is intact" if earlier
              else f"No earlier checkpoint exists in {directory!r}")
    return (f"could not write the checkpoint {final!r} ({error_line(failure)}); its incomplete files were removed. "
            f"It needs about {_size(need)} ({basis}) and {free}. {intact}, and the model, optimizer and training "
            f"state of this run were not changed by the failed save: free space (or make {directory!r} writable, or "
            "pass another `output_dir`) and run again with resume_from_checkpoint=True to continue"
            + (" from it" if earlier else ""))


def _space_needed(previous: str | None, module: Any, optimizer: Any) -> tuple[int, str]:
    """Bytes a checkpoint takes: the previous one's files, else the model's and optimizer's tensors."""
    if previous is not None:
        try:
            with open(os.path.join(previous, MANIFEST), encoding="utf-8") as f:
                return sum(json.load(f)["files"].values()), f"the size of {os.path.basename(previous)}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    total = 0
    try:
        def state_of(obj: Any) -> Any:  # a module / optimizer, or already its state dict (an asynchronous save)
            return obj if isinstance(obj, dict) else obj.state_dict()

        states = [state_of(module)] + ([state_of(optimizer).get("state", {})] if optimizer is not None else [])
        for tree in states:
            total += sum(_bytes(v) for v in _leaves(tree))
    except Exception:  # noqa: BLE001 - an estimate only
        return 0, "unknown: the model's tensors could not be measured"
    return total, "the model's and optimizer's tensors"


def _leaves(tree: Any) -> Iterator[Any]:
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _leaves(value)
    else:
        yield tree


def _bytes(value: Any) -> int:
    return value.numel() * value.element_size() if hasattr(value, "element_size") else 0


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
