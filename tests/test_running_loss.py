"""The logged losses do not depend on checkpoints: taking one reads the running sums without
regrouping them, and a run resumed mid-epoch sums its losses as the uninterrupted run did."""

import pytest
import torch
from helpers import Crash, CrashAt, mlp, seeded_classes, training_records

from fitkit import Model, TrainerCallback
from fitkit.engine import running_loss
from fitkit.engine.checkpoint import listing
from fitkit.engine.running_loss import RunningLoss

STEPS_PER_EPOCH = 25  # 196 samples in batches of 8: 24 full ones and a short one of 4


@pytest.fixture(autouse=True)
def _small_folds(monkeypatch):
    monkeypatch.setattr(running_loss, "FOLD_EVERY", 4)  # many folds, and pending losses at most reads


def _fit(out, init_seed=0, callbacks=(), **options):
    x, y = seeded_classes(196, 8, 3)
    model = Model(mlp(hidden=32, seed=init_seed, dropout=0.2)).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, batch_size=8, epochs=2, seed=5, verbose=0, output_dir=str(out), logging_strategy="steps",
              logging_steps=5, callbacks=list(callbacks), **options)
    return model




class _FirstLog(TrainerCallback):
    """The first step a run logs, and where it started."""

    def __init__(self):
        self.start = self.first = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.first = self.first if self.first is not None else state.global_step


def _losses(model):
    return [(r["step"], r["loss"]) for r in training_records(model.state.log_history) if "loss" in r]


def test_checkpoints_leave_the_logged_losses_bit_identical(tmp_path):
    plain = _fit(tmp_path / "plain", save_strategy="no")
    saving = _fit(tmp_path / "saving", save_strategy="steps", save_steps=3)  # reads between folds
    assert len(listing.list_checkpoints(str(tmp_path / "saving"))) >= 2 * STEPS_PER_EPOCH // 3
    assert _losses(saving) == _losses(plain)  # every bit: == on floats
    assert training_records(saving.state.log_history) == training_records(plain.state.log_history)


def test_a_mid_epoch_resume_logs_the_same_bits(tmp_path):
    plain = _fit(tmp_path / "plain", save_strategy="no")
    out = tmp_path / "cut"
    with pytest.raises(Crash):
        _fit(out, save_strategy="steps", save_steps=3, callbacks=[CrashAt(32)])
    newest = listing.list_checkpoints(str(out))[-1]
    assert newest.endswith("checkpoint-30")  # epoch 2, 5 batches in: one loss pending a fold of 4
    first = _FirstLog()
    resumed = _fit(out, init_seed=123, save_strategy="steps", save_steps=3, resume_from_checkpoint=True,
                   callbacks=[first])  # other initial weights: only the checkpoint can make it equal
    assert first.start == 30 and first.first == 35
    after = [pair for pair in _losses(plain) if pair[0] > 30]
    assert after and _losses(resumed)[-len(after):] == after
    assert resumed.history.history == plain.history.history  # the epoch means, every bit
    for a, b in zip(plain.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)


def test_reading_the_sum_never_changes_later_sums():
    g = torch.Generator().manual_seed(3)
    losses = torch.rand(23, generator=g) * 10
    sizes = [8] * 22 + [3]
    quiet, busy = RunningLoss(torch.device("cpu")), RunningLoss(torch.device("cpu"))
    for i, (loss, size) in enumerate(zip(losses, sizes)):
        quiet.add(loss, size)
        busy.add(loss, size)
        busy.total  # noqa: B018 - a read after every step, as logging_steps=1 does
        if i % 3 == 0:
            assert torch.equal(busy.total, quiet.total)
    assert torch.equal(busy.total, quiet.total) and busy.count == quiet.count == 179
    # a resumed sum: the folded part and the pending losses put back give the same later sums
    folded, pending = quiet.parts()
    assert pending  # 23 adds, folds of 4: three pending
    again = RunningLoss(torch.device("cpu"))
    again.set(float(folded), quiet.count, [(float(loss), size) for loss, size in pending])
    for run in (quiet, again):
        run.add(torch.tensor(0.123456789), 8)
    assert torch.equal(again.total, quiet.total)
