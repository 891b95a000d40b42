"""BackupAndRestore: an interrupted fit, called again, resumes exactly; the backup goes at the end."""

import os

import pytest
import torch
from helpers import Crash, CrashAt, training_records

from fitkit import Model
from fitkit.callbacks import BackupAndRestore
from fitkit.engine.checkpoint.layout import CheckpointError


def _run(backup, callbacks=(), seed=0, **options):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(80, 6, generator=g), torch.randint(0, 3, (80,), generator=g)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    model = Model(net).compile("adam", "cross_entropy", ["accuracy"], learning_rate=1e-2)
    model.fit(x, y, epochs=4, batch_size=8, verbose=0, seed=5, validation_split=0.2,
              callbacks=[*callbacks, backup], **options)
    return model


@pytest.mark.parametrize("save_freq", ["epoch", 3])
def test_interrupted_fit_resumes_from_the_backup_exactly(tmp_path, save_freq):
    reference = _run(BackupAndRestore(str(tmp_path / "ref"), save_freq=save_freq))
    backup = BackupAndRestore(str(tmp_path / "bak"), save_freq=save_freq)
    with pytest.raises(Crash):
        _run(backup, callbacks=[CrashAt(20)])
    kept = os.listdir(tmp_path / "bak")
    assert len(kept) == 1 and kept[0].startswith("checkpoint-")  # only the newest backup is kept
    resumed = _run(backup, seed=123)  # the same call again, even with other initial weights
    assert training_records(resumed.state.log_history) == training_records(reference.state.log_history)
    for a, b in zip(reference.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)
    assert not os.path.exists(tmp_path / "bak")  # removed once fit completed


def test_backup_is_kept_when_asked(tmp_path):
    _run(BackupAndRestore(str(tmp_path / "b"), delete_checkpoint=False))
    assert os.listdir(tmp_path / "b") == ["checkpoint-32"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="Invalid value for argument `save_freq`: 0"):
        BackupAndRestore("b", save_freq=0)
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        BackupAndRestore("")


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size: only the digest tells
    path.write_bytes(bytes(data))


def _interrupted(tmp_path, **options):
    backup = BackupAndRestore(str(tmp_path / "bak"), **options)
    with pytest.raises(Crash):
        _run(backup, callbacks=[CrashAt(20)])  # 8 steps an epoch: backups at steps 8 and 16
    return backup


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_backup_is_an_error_naming_the_file_not_a_silent_restart(tmp_path, damage):
    backup = _interrupted(tmp_path)
    weights = tmp_path / "bak" / "checkpoint-16" / "state.pt"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        _flip_a_byte(weights)
    with pytest.raises(CheckpointError, match=r"BackupAndRestore cannot resume: the backup .*checkpoint-16.*state\.pt"):
        _run(backup)
    assert os.listdir(tmp_path / "bak") == ["checkpoint-16"]  # nothing deleted


def test_double_checkpoint_keeps_two_and_falls_back_to_the_older_one(tmp_path, caplog):
    reference = _run(BackupAndRestore(str(tmp_path / "ref")))
    backup = _interrupted(tmp_path, double_checkpoint=True)
    assert sorted(os.listdir(tmp_path / "bak")) == ["checkpoint-16", "checkpoint-8"]
    _flip_a_byte(tmp_path / "bak" / "checkpoint-16" / "state.pt")
    backup.delete_checkpoint = False
    with caplog.at_level("WARNING", logger="fitkit"):
        resumed = _run(backup, seed=123)
    assert "newest backup" in caplog.text and "checkpoint-8" in caplog.text
    assert training_records(resumed.state.log_history) == training_records(reference.state.log_history)
    for a, b in zip(reference.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)
    assert sorted(os.listdir(tmp_path / "bak")) == ["checkpoint-24", "checkpoint-32", "damaged-checkpoint-16"]


def test_double_checkpoint_with_both_backups_damaged_is_an_error(tmp_path):
    backup = _interrupted(tmp_path, double_checkpoint=True)
    for step in (8, 16):
        _flip_a_byte(tmp_path / "bak" / f"checkpoint-{step}" / "state.pt")
    with pytest.raises(CheckpointError, match="both backups are damaged"):
        _run(backup)
