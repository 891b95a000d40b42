"""`state.pt` of a background save: written past the page cache (`DirectFile`), digested while
written (`HashingFile`), without torch's CRC-32 (`save_state`); the file loads as torch.save's."""

import errno
import hashlib
import io
import os

import pytest
import torch

from fitkit.engine.checkpoint import state_file
from fitkit.engine.checkpoint.state_file import BLOCK, DirectFile, HashingFile, save_state


def _payload():
    g = torch.Generator().manual_seed(0)
    return {"model": {"w": torch.randn(300, 301, generator=g), "b": torch.arange(7)},
            "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "loop": {"epoch": 1, "name": "x"}}


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("buffer_size", [BLOCK, 3 * BLOCK, 1 << 20])
def test_the_file_loads_as_torch_saves_and_its_digest_is_the_files(tmp_path, buffer_size):
    path = str(tmp_path / "state.pt")
    with DirectFile(path, buffer_size=buffer_size) as raw:
        out = HashingFile(raw)
        save_state(_payload(), out)
    with open(path, "rb") as f:
        written = f.read()
    assert len(written) == raw.size and len(written) % BLOCK  # the padded last block was cut off
    assert hashlib.sha256(written).hexdigest() == out.hexdigest()
    assert _equal(torch.load(path, weights_only=True), _payload())
    reference = io.BytesIO()
    torch.save(_payload(), reference)
    assert len(written) == len(reference.getvalue())  # the same records; only the CRC-32 fields differ


def test_a_filesystem_that_refuses_o_direct_is_written_buffered(tmp_path, monkeypatch):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_open, real_write = os.open, os.write
    opened = []

    def refusing_open(path, flags, mode=0o777):  # tmpfs on older kernels, some network filesystems
        opened.append(bool(flags & os.O_DIRECT))
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(state_file.os, "open", refusing_open)
    with DirectFile(str(tmp_path / "a.pt"), buffer_size=BLOCK) as raw:
        save_state(_payload(), raw)
    assert opened == [True, False] and not raw.direct
    assert _equal(torch.load(tmp_path / "a.pt", weights_only=True), _payload())

    monkeypatch.setattr(state_file.os, "open", real_open)
    refused = []

    def refusing_write(fd, data):  # the open took O_DIRECT, the write does not
        if not refused:
            refused.append(1)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(state_file.os, "write", refusing_write)
    with DirectFile(str(tmp_path / "b.pt"), buffer_size=BLOCK) as raw:
        save_state(_payload(), raw)
    assert refused and not raw.direct
    assert _equal(torch.load(tmp_path / "b.pt", weights_only=True), _payload())


def test_a_full_disk_is_an_os_error(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_file.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        with DirectFile(str(tmp_path / "c.pt"), buffer_size=BLOCK) as raw:
            save_state(_payload(), raw)


def test_without_this_torchs_writer_it_is_torch_save(monkeypatch):
    real, calls = torch._C.PyTorchFileWriter, []

    def other_build(*args):  # a torch whose writer takes other arguments: refuses save_state's call
        calls.append(args)
        if len(calls) == 1:
            raise TypeError("incompatible constructor arguments")
        return real(*args)

    monkeypatch.setattr(torch._C, "PyTorchFileWriter", other_build)
    buffer = io.BytesIO()
    save_state(_payload(), buffer)
    buffer.seek(0)
    assert len(calls) == 2 and _equal(torch.load(buffer, weights_only=True), _payload())


def _host_copy():
    from fitkit.engine.checkpoint.async_save import HostCopy

    g = torch.Generator().manual_seed(1)
    tree = {"model": {"big": torch.randn(1000, 1000, generator=g), "odd": torch.randn(300_001, generator=g),
                      "small": torch.randn(10, generator=g)},
            "optimizer": {"state": {0: {"exp_avg": torch.randn(600, 600, generator=g), "step": torch.tensor(2.0)}}}}
    pending = HostCopy().take(tree)
    return tree, pending.finish(), pending.aligned


def test_the_host_copys_large_buffers_are_page_aligned_and_go_to_the_device_from_where_they_lie(tmp_path):
    tree, payload, aligned = _host_copy()
    large = [payload["model"]["big"], payload["model"]["odd"], payload["optimizer"]["state"][0]["exp_avg"]]
    assert aligned == {t.data_ptr() for t in large} and all(p % BLOCK == 0 for p in aligned)
    path = str(tmp_path / "state.pt")
    with DirectFile(path, buffer_size=1 << 20, in_place=aligned) as raw:
        out = HashingFile(raw)
        save_state(payload, out, alignment=BLOCK)
    if not raw.direct:
        pytest.skip("this filesystem refuses O_DIRECT: every write is buffered")
    whole = sum(t.numel() * t.element_size() // BLOCK * BLOCK for t in large)
    assert raw.written_in_place == whole  # all but the last partial block of the odd-sized tensor
    with open(path, "rb") as f:
        written = f.read()
    assert hashlib.sha256(written).hexdigest() == out.hexdigest()
    assert _equal(torch.load(path, weights_only=True), tree)


def test_a_failed_write_from_the_callers_memory_is_raised_and_later_writes_are_skipped(tmp_path, monkeypatch):
    tree, payload, aligned = _host_copy()
    real_write, sizes = os.write, []

    def full_after_the_first(fd, data):
        sizes.append(len(data))
        if len(sizes) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(state_file.os, "write", full_after_the_first)
    with pytest.raises(OSError, match="No space"):
        with DirectFile(str(tmp_path / "d.pt"), buffer_size=1 << 20, in_place=aligned) as raw:
            save_state(payload, raw, alignment=BLOCK)
    assert len(sizes) == 2  # the queued writes after the failed one never reached the file


def test_a_small_buffer_that_begins_on_a_page_is_not_written_in_place(monkeypatch):
    """Only the large buffers (maps of their own) count as written from where they lie: a small
    one that happens to begin on a page boundary (made certain here) is not among them."""
    import mmap

    from fitkit.engine.checkpoint import async_save

    def on_a_page(like, pinned):  # every buffer page-aligned, whatever its size
        memory = mmap.mmap(-1, max(like.numel() * like.element_size(), 1))
        return torch.frombuffer(memory, dtype=like.dtype, count=like.numel()).view(like.shape)

    monkeypatch.setattr(async_save, "_empty", on_a_page)
    tree, payload, aligned = _host_copy()
    small = [payload["model"]["small"], payload["optimizer"]["state"][0]["step"]]
    assert all(t.data_ptr() % async_save.PAGE == 0 for t in small)  # the case: small buffers on a page
    large = [payload["model"]["big"], payload["model"]["odd"], payload["optimizer"]["state"][0]["exp_avg"]]
    assert aligned == {t.data_ptr() for t in large}
