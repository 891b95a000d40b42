"""Stateful data sources (`state_dict()` / `load_state_dict()`) resume mid-epoch from their saved
state, reading no consumed item; sources without state re-read the consumed batches (one notice)."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest
import torch
from helpers import Crash, CrashAt, mlp, reserved_port, seeded_classes
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from fitkit import Model, TrainerCallback
from fitkit.engine.checkpoint import layout, listing

N, BATCH = 40, 4  # 10 batches an epoch, 2 epochs: 20 steps


def _order(epoch):
    return torch.randperm(N, generator=torch.Generator().manual_seed(100 + epoch)).tolist()


class Recording:
    """Records the sample indices read once `recording` is on (set at `on_train_begin`, so the
    batch read to check the data before training is left out)."""

    def __init__(self):
        self.x, self.y = seeded_classes(N, 4, 2)
        self.reads: list[int] = []
        self.recording = False

    def item(self, i):
        if self.recording:
            self.reads.append(i)
        return self.x[i], self.y[i]


class StatefulStream(Recording, IterableDataset):
    """An IterableDataset with an epoch-dependent order that saves its position (items yielded)."""

    def __init__(self):
        super().__init__()
        self.epoch, self.pos, self._pending = 0, 0, None

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state):
        self._pending = dict(state)

    def __iter__(self):
        pending, self._pending = self._pending, None
        self.epoch, self.pos = (pending["epoch"], pending["pos"]) if pending else (self.epoch, 0)
        order = _order(self.epoch)
        while self.pos < N:
            i = order[self.pos]
            self.pos += 1
            yield self.item(i)
        self.epoch, self.pos = self.epoch + 1, 0


class PlainStream(Recording, IterableDataset):
    """The same stream without a state: each pass starts from its first item."""

    def __init__(self):
        super().__init__()
        self.epoch = 0

    def __iter__(self):
        for i in _order(self.epoch):
            yield self.item(i)
        self.epoch += 1


class Items(Recording, Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.item(i)


class SlowItems(Items):
    """Reads slow enough that batches would be read ahead on a thread (`fitkit.engine.data.prefetch`)."""

    def item(self, i):
        time.sleep(0.002)
        return super().item(i)


class StatefulLoader(DataLoader):
    """Mimics torchdata's `StatefulDataLoader`: it saves the batches it yielded this epoch and
    resumes after them, reading only the samples of the batches it yields."""

    def __init__(self, dataset):
        super().__init__(dataset, batch_size=BATCH)
        self.epoch, self.yielded, self.pending = 0, 0, None

    def state_dict(self):
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state):
        self.pending = dict(state)

    def __iter__(self):
        pending, self.pending = self.pending, None
        self.epoch, self.yielded = (pending["epoch"], pending["yielded"]) if pending else (self.epoch, 0)
        order = _order(self.epoch)
        while self.yielded < len(self):
            b = self.yielded
            self.yielded += 1
            yield default_collate([self.dataset[i] for i in order[b * BATCH:(b + 1) * BATCH]])
        self.epoch, self.yielded = self.epoch + 1, 0


class _Record(TrainerCallback):
    """Turns the source's recording on at the start of training and keeps every batch trained."""

    def __init__(self, source):
        self.source, self.batches = source, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.source.recording = True

    def on_step_end(self, args, state, control, batch=None, **kwargs):
        self.batches.append([t.clone() for t in batch])




def _fit(out, make, seed=0, callbacks=(), **options):
    net = mlp(4, 2, seed=seed, dropout=0.2)
    source = make()
    data = StatefulLoader(source) if isinstance(source, Items) else source
    record = _Record(source)
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(data, batch_size=BATCH, epochs=2, seed=7, verbose=0, output_dir=str(out),
              callbacks=[record, *callbacks], **options)
    return model, source, record


def _resumes_exactly(tmp_path, make, save_steps, crash, save_async):
    save = dict(save_strategy="steps", save_steps=save_steps, save_async=save_async)
    full, full_source, full_record = _fit(tmp_path / "full", make, **save)
    assert full.state.global_step == 20 and len(full_source.reads) == 2 * N
    with pytest.raises(Crash):
        _fit(tmp_path / "cut", make, callbacks=[CrashAt(crash)], **save)
    step = int(listing.list_checkpoints(str(tmp_path / "cut"))[-1].rsplit("-", 1)[1])
    assert step == save_steps
    resumed, source, record = _fit(tmp_path / "cut", make, seed=99, resume_from_checkpoint=True, **save)
    return full, full_source, full_record, resumed, source, record, step


@pytest.mark.parametrize("make", [StatefulStream, Items], ids=["iterable_dataset", "stateful_loader"])
@pytest.mark.parametrize("save_steps,crash", [(3, 5), (13, 15)])  # mid-epoch 0; mid-epoch 1
@pytest.mark.parametrize("save_async", [False, True], ids=["sync", "async"])
def test_a_stateful_source_resumes_without_reading_a_consumed_item(tmp_path, make, save_steps, crash, save_async,
                                                                 caplog):
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        full, full_source, full_record, resumed, source, record, step = _resumes_exactly(
            tmp_path, make, save_steps, crash, save_async)
    consumed = step * BATCH
    assert source.reads == full_source.reads[consumed:]  # the items after the checkpoint, and no other
    assert len(source.reads) + consumed == len(full_source.reads)
    assert len(record.batches) == 20 - step
    for a, b in zip(record.batches, full_record.batches[step:]):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert resumed.state.global_step == full.state.global_step == 20
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)
    assert "re-reads" not in caplog.text


@pytest.mark.parametrize("save_async", [False, True], ids=["sync", "async"])
def test_the_saved_state_is_that_of_the_batches_trained(tmp_path, save_async):
    """The checkpoint holds the loader's state after the last trained batch (nothing read ahead),
    in the loop's record, which loads with `weights_only=True`."""
    with pytest.raises(Crash):
        _fit(tmp_path, SlowItems, save_strategy="steps", save_steps=3, save_async=save_async,
             callbacks=[CrashAt(4)])
    path = listing.list_checkpoints(str(tmp_path))[-1]
    payload = torch.load(os.path.join(path, layout.WEIGHTS), weights_only=True)
    assert payload["loop"]["data_state"] == [[{"epoch": 0, "yielded": 3}]]


def test_a_source_without_state_replays_with_one_notice(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        full, full_source, full_record, resumed, source, record, step = _resumes_exactly(
            tmp_path, PlainStream, 3, 5, False)
    assert source.reads == full_source.reads  # the consumed items are read again, then skipped
    assert len(record.batches) == 20 - step
    for a, b in zip(record.batches, full_record.batches[step:]):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)
    notices = [r for r in caplog.records if "re-reads" in r.getMessage()]
    assert len(notices) == 1 and "re-reads 3 batches" in notices[0].getMessage()


class OddStateStream(StatefulStream):
    def state_dict(self):
        return {**super().state_dict(), "odd": {1, 2}}  # a set: not loadable with weights_only=True


def test_a_state_that_is_not_plain_values_is_not_saved_and_the_source_replays(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        full, full_source, _, resumed, source, _, step = _resumes_exactly(tmp_path, OddStateStream, 3, 5, False)
    assert source.reads == full_source.reads
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)
    assert "state_dict() of `x`'s data holds values" in caplog.text and "re-reads 3 batches" in caplog.text


@pytest.mark.slow
def test_under_ddp_each_process_resumes_its_own_stream_without_rereading(tmp_path):
    """2 processes, each streaming its own half: a checkpoint holds both positions, and a resume
    (synchronous and asynchronous saves) gives each process its own, reading no consumed item."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "stateful_ddp.py")
    results = tmp_path / "results"
    results.mkdir()
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, script, "--results", str(results), "--output", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=300, env=dict(os.environ, MASTER_PORT=str(port)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {}
    for name in os.listdir(results):
        with open(results / name) as f:
            r = json.load(f)
        runs[r["name"], r["rank"]] = r
    cut, per_epoch = 4, 24  # the script's CUT; each process's items an epoch (its N = 48, halved)
    for rank in (0, 1):
        full = runs["full", rank]
        assert full["step"] == 12 and len(full["reads"]) == 2 * per_epoch
        for mode in ("sync", "async"):
            saved, resumed = runs[f"cut-{mode}", rank], runs[f"resume-{mode}", rank]
            assert saved["data_state"] == [[{"epoch": 0, "pos": cut * BATCH, "shard": r}] for r in (0, 1)]
            assert resumed["reads"] == full["reads"][cut * BATCH:], mode  # its own items after the checkpoint
            assert resumed["batches"] == full["batches"][cut:]
            assert resumed["step"] == 12 and resumed["weights"] == full["weights"]
    assert runs["full", 0]["reads"] != runs["full", 1]["reads"]  # two different streams
