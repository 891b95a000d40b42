"""Keras' BackupAndRestore canary, re-expressed: a layer that counts its forward calls in a
buffer (saved with the weights) shows exactly which batches ran before and after an interruption.
fitkit runs no extra forward, so the count equals Keras' for the epoch-wise backup; with a step-wise
backup fitkit resumes mid-epoch where Keras restarts the epoch, so its count is the smaller one of
a run that repeats no batch."""

import numpy as np
import pytest
import torch

from fitkit import Model
from fitkit.callbacks import BackupAndRestore, Callback


class Canary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("counter", torch.zeros(()))
        self.dense = torch.nn.Linear(3, 1)

    def forward(self, x):
        self.counter += 1
        return self.dense(x)


class Interrupting(Callback):
    """Keras' interrupting callback: raise after the `epoch_int`-th epoch or `steps_int`-th batch."""

    def __init__(self, steps_int=None, epoch_int=None):
        super().__init__()
        self.batches = self.epochs = 0
        self.steps_int, self.epoch_int = steps_int, epoch_int

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1
        if self.epoch_int is not None and self.epochs == self.epoch_int:
            raise RuntimeError("EpochInterruption")

    def on_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.steps_int is not None and self.batches == self.steps_int:
            raise RuntimeError("StepsInterruption")


def _data():
    rng = np.random.default_rng(0)
    return rng.random((10, 3)).astype(np.float32), rng.random((10, 1)).astype(np.float32)


def _model():
    torch.manual_seed(0)
    return Model(Canary()).compile("sgd", "mse", metrics=["mse"])


def test_epoch_backup_counts_the_calls_keras_counts(tmp_path):
    x, y = _data()
    model, backup = _model(), BackupAndRestore(str(tmp_path / "backup"), save_freq="epoch")
    with pytest.raises(RuntimeError, match="EpochInterruption"):
        model.fit(x, y, batch_size=4, epochs=6, callbacks=[backup, Interrupting(epoch_int=2)], verbose=0)
    assert int(model.module.counter) == 6  # 3 batches an epoch, 2 epochs, no extra forward
    history = model.fit(x, y, batch_size=4, epochs=5, callbacks=[backup], verbose=0)
    assert history.epoch[-1] == 4
    assert int(model.module.counter) == 5 * 3  # Keras' figure: the backup's count, then epochs 3 to 5


def test_step_backup_resumes_mid_epoch_without_repeating_a_batch(tmp_path):
    x, y = _data()
    model, backup = _model(), BackupAndRestore(str(tmp_path / "backup"), save_freq=1)
    with pytest.raises(RuntimeError, match="StepsInterruption"):
        model.fit(x, y, batch_size=4, epochs=2, callbacks=[backup, Interrupting(steps_int=2)], verbose=0)
    assert int(model.module.counter) == 2
    history = model.fit(x, y, batch_size=4, epochs=5, callbacks=[backup], verbose=0)
    assert history.epoch[-1] == 4
    # the backup of step 2 (count 2), the epoch's last batch, then 4 epochs of 3 (Keras restarts
    # the interrupted epoch instead: 17)
    assert int(model.module.counter) == 2 + 1 + 4 * 3
