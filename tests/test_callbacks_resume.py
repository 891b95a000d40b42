"""Stateful Keras-like callbacks across a checkpoint resume: an interrupted run, resumed, ends
like an uninterrupted one."""

import csv

import torch
from helpers import blobs as data, mlp

from fitkit import Model
from fitkit.callbacks import CSVLogger, EarlyStopping, LambdaCallback, ModelCheckpoint, ReduceLROnPlateau


def run(folder, stop_after=None, resume=None):
    callbacks = [CSVLogger(folder / "log.csv"), EarlyStopping(patience=3),
                 ModelCheckpoint(folder / "best-{epoch}.pt", save_best_only=True),
                 ReduceLROnPlateau(factor=0.5, patience=1)]
    if stop_after:  # an interruption after `stop_after` epochs (the epoch's checkpoint is written)
        callbacks.append(LambdaCallback(on_epoch_end=lambda a, s, c, **k: setattr(
            c, "should_training_stop", s.epoch >= stop_after)))
    model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=0.0)  # flat: a plateau from epoch 2
    model.fit(*data(), batch_size=16, epochs=8, validation_data=data(16, 1), callbacks=callbacks, verbose=0, seed=0,
              output_dir=str(folder / "out"), save_strategy="epoch", resume_from_checkpoint=resume)
    with open(folder / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    return rows, callbacks


def test_resumed_run_continues_the_callbacks(tmp_path):
    whole, whole_cbs = run(tmp_path / "whole")
    first, _ = run(tmp_path / "cut", stop_after=2)
    assert len(first) == 1 + 2
    resumed, resumed_cbs = run(tmp_path / "cut", resume=True)
    # the early stop happens at the same epoch, so the CSV has the same rows (epoch, learning rate)
    assert [r[:2] for r in resumed] == [r[:2] for r in whole]
    assert len(whole) == 1 + 4 and [r[0] for r in whole[1:]] == ["0", "1", "2", "3"]
    assert resumed_cbs[1].state() == whole_cbs[1].state()  # EarlyStopping
    assert resumed_cbs[3].state() == whole_cbs[3].state()  # ReduceLROnPlateau
    assert sorted(p.name for p in (tmp_path / "cut").glob("best-*.pt")) == ["best-1.pt"]  # best kept across
