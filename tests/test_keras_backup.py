"""Keras 3's tests of BackupAndRestore (keras/src/callbacks/backup_and_restore_test.py), their
scenarios and expected values re-expressed with fitkit. A counting layer tells how many batches
the model saw; its count is part of the weights, so a backup carries it."""

import os

import pytest
import torch
from keras_port import differs

from fitkit import Model, TrainerCallback
from fitkit.callbacks import BackupAndRestore

MID_EPOCH = "`BackupAndRestore` resumes mid-epoch at the batch where the backup was taken"


class Interrupting(TrainerCallback):
    """Raises at the `steps`-th step end or the `epochs`-th epoch end."""

    def __init__(self, steps=None, epochs=None):
        self.steps, self.epochs, self.step_count, self.epoch_count = steps, epochs, 0, 0

    def on_step_end(self, args, state, control, **kwargs):
        self.step_count += 1
        if self.step_count == self.steps:
            raise RuntimeError("StepsInterruption")

    def on_epoch_summary(self, args, state, control, **kwargs):  # Keras' on_epoch_end, after the backup's
        self.epoch_count += 1
        if self.epoch_count == self.epochs:
            raise RuntimeError("EpochInterruption")


class Canary(torch.nn.Module):
    """Keras' CanaryLayer then Dense(1): counts every call of its forward, as Keras' layer does
    (fitkit calls the module no extra time, so the counts are Keras' own)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("counter", torch.zeros(()))
        self.dense = torch.nn.Linear(3, 1)

    def forward(self, x):
        self.counter += 1
        return self.dense(x)


def make_model():
    torch.manual_seed(0)
    return Model(Canary()).compile("sgd", "mse", ["mse"])


DATA = (torch.rand(10, 3, generator=torch.Generator().manual_seed(0)),
        torch.rand(10, 1, generator=torch.Generator().manual_seed(1)))


def fit(model, callbacks, epochs):
    return model.fit(*DATA, batch_size=4, callbacks=callbacks, epochs=epochs, verbose=0)  # 3 batches an epoch


def interrupted(tmp_path, backup_options, **interrupt):
    backup_dir = tmp_path / "subdir"
    assert not backup_dir.exists()
    model, backup = make_model(), BackupAndRestore(str(backup_dir), **backup_options)
    with pytest.raises(RuntimeError, match="Interruption"):
        fit(model, [backup, Interrupting(**interrupt)], epochs=6)
    assert backup_dir.exists()
    return model, backup


def test_save_freq_unknown_error():
    for value in ("batch", 0.15):
        with pytest.raises(ValueError, match="Invalid value"):
            BackupAndRestore(backup_dir="backup_dir", save_freq=value)


def test_best_case_epoch(tmp_path):
    model, backup = interrupted(tmp_path, {"save_freq": "epoch"}, epochs=2)
    assert int(model.module.counter) == 6
    history = fit(model, [backup], epochs=5)
    assert history.epoch[-1] == 4 and int(model.module.counter) == 5 * 3


def test_best_case_step_resumes_at_the_batch_after_the_backup(tmp_path):
    model, backup = interrupted(tmp_path, {"save_freq": 1}, steps=2)
    assert int(model.module.counter) == 2
    history = fit(model, [backup], epochs=5)
    assert history.epoch[-1] == 4 and int(model.module.counter) == 5 * 3  # no batch seen twice


@differs(MID_EPOCH)
def test_best_case_step_as_keras_restarts_the_epoch(tmp_path):
    model, backup = interrupted(tmp_path, {"save_freq": 1}, steps=2)
    fit(model, [backup], epochs=5)
    assert int(model.module.counter) == 17  # Keras sees the interrupted epoch's first batches twice


def test_backup_corrupted_falls_back_to_the_previous_one(tmp_path):
    model, backup = interrupted(tmp_path, {"save_freq": "epoch", "double_checkpoint": True}, epochs=2)
    assert sorted(os.listdir(tmp_path / "subdir")) == ["checkpoint-3", "checkpoint-6"]
    assert int(model.module.counter) == 6
    with open(tmp_path / "subdir" / "checkpoint-6" / "state.pt", "w") as f:
        f.write("0")  # Keras' corruption: the weights file replaced by one character
    history = fit(model, [backup], epochs=5)
    assert history.epoch[-1] == 4 and int(model.module.counter) == 5 * 3  # from the epoch-1 backup (3 batches)


def test_backup_is_deleted_after_a_complete_fit(tmp_path):
    backup_dir = tmp_path / "subdir"
    fit(make_model(), [BackupAndRestore(str(backup_dir), save_freq="epoch")], epochs=2)
    assert not backup_dir.exists()


@pytest.mark.parametrize("backup_dir", ["", None])
def test_backup_dir_empty_or_none_error(backup_dir):
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        BackupAndRestore(backup_dir=backup_dir, save_freq="epoch")


def test_a_resumed_run_fires_each_epoch_event_once_as_keras(tmp_path):
    """Interrupted as epoch 2 begins, the resumed run begins at epoch 2: Keras' events are
    `on_epoch_begin(2)`, `on_epoch_end(2)`, ...: epoch 1's end and epoch 2's begin, once."""
    from fitkit.callbacks import Callback

    class Events(Callback):
        def __init__(self, fail_at=None):
            super().__init__()
            self.seen, self.fail_at = [], fail_at

        def on_epoch_begin(self, epoch, logs=None):
            self.seen.append(("begin", epoch))
            if epoch == self.fail_at:
                raise RuntimeError("interrupted")

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append(("end", epoch))

    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    first, resumed = Events(fail_at=2), Events()
    with pytest.raises(RuntimeError, match="interrupted"):
        Model(torch.nn.Linear(4, 1)).compile("sgd", "mse").fit(
            x, x[:, :1], epochs=4, verbose=0, callbacks=[BackupAndRestore(tmp_path), first])
    Model(torch.nn.Linear(4, 1)).compile("sgd", "mse").fit(
        x, x[:, :1], epochs=4, verbose=0, callbacks=[BackupAndRestore(tmp_path), resumed])
    assert first.seen == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1), ("begin", 2)]
    assert resumed.seen == [("begin", 2), ("end", 2), ("begin", 3), ("end", 3)]
