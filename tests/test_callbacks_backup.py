"""BackupAndRestore: an interrupted fit, called again, resumes exactly; the backup goes at the end."""

import os

import pytest
import torch
from helpers import training_records

from fitkit import Model, TrainerCallback
from fitkit.callbacks import BackupAndRestore


class _Crash(Exception):
    pass


class _CrashAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise _Crash()


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
    with pytest.raises(_Crash):
        _run(backup, callbacks=[_CrashAt(20)])
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
    with pytest.raises(ValueError, match="`save_freq`=0 is invalid"):
        BackupAndRestore("b", save_freq=0)
    with pytest.raises(ValueError, match="`backup_dir` is required"):
        BackupAndRestore("")
