"""Stateful Keras-like callbacks across a checkpoint resume: an interrupted run, resumed, ends
like an uninterrupted one.

The module learns (a real learning rate) and the resumed run starts from other initial weights,
so only a resume from the checkpoint can end with the same weights; the validation loss the
monitors see is scripted per epoch, so the plateau, the learning-rate cuts and the early stop
fall on known epochs."""

import csv

import torch
from helpers import blobs as data
from helpers import mlp

from fitkit import Model, TrainerCallback
from fitkit.callbacks import CSVLogger, EarlyStopping, LambdaCallback, ModelCheckpoint, ReduceLROnPlateau

#: The val_loss the monitors see after each epoch: best after epoch 2, then a plateau.
VAL_LOSS = [1.0, 0.5, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]


class ScriptedValLoss(TrainerCallback):
    """Sets `val_loss` from `VAL_LOSS` by epoch (stateless, so a resumed run sees the same)."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics["val_loss"] = VAL_LOSS[round(state.epoch) - 1]


class StartStep(TrainerCallback):
    def __init__(self):
        self.step = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.step = state.global_step


def run(folder, stop_after=None, resume=None, init_seed=0):
    callbacks = [ScriptedValLoss(), CSVLogger(folder / "log.csv"), EarlyStopping(patience=3),
                 ModelCheckpoint(folder / "best-{epoch}.pt", save_best_only=True),
                 ReduceLROnPlateau(factor=0.5, patience=1), StartStep()]
    if stop_after:  # an interruption after `stop_after` epochs (the epoch's checkpoint is written)
        callbacks.append(LambdaCallback(on_epoch_end=lambda a, s, c, **k: setattr(
            c, "should_training_stop", s.epoch >= stop_after)))
    model = Model(mlp(seed=init_seed)).compile("adam", "cross_entropy", learning_rate=0.05)
    model.fit(*data(), batch_size=16, epochs=8, validation_data=data(16, 1), callbacks=callbacks, verbose=0, seed=0,
              output_dir=str(folder / "out"), save_strategy="epoch", resume_from_checkpoint=resume)
    with open(folder / "log.csv", newline="") as f:
        rows = list(csv.reader(f))
    return rows, callbacks, model


def test_resumed_run_continues_the_callbacks(tmp_path):
    whole, whole_cbs, whole_model = run(tmp_path / "whole")
    first, _, _ = run(tmp_path / "cut", stop_after=2)
    assert len(first) == 1 + 2
    resumed, resumed_cbs, resumed_model = run(tmp_path / "cut", resume=True, init_seed=1)  # other initial weights
    assert resumed_cbs[-1].step == 2 * 2  # it started where the checkpoint of epoch 2 left off (2 steps an epoch)
    # stopped early after epoch 5 (best 0.5 at epoch 2, patience 3); the rate, logged with each epoch,
    # halved after epochs 3 and 4 (patience 1)
    assert [r[0] for r in whole[1:]] == ["0", "1", "2", "3", "4"]
    column = whole[0].index("learning_rate")
    assert [float(r[column]) for r in whole[1:]] == [0.05, 0.05, 0.05, 0.025, 0.0125]
    assert resumed == whole  # every row and value: the losses of a resumed run are the uninterrupted run's
    for a, b in zip(whole_model.module.parameters(), resumed_model.module.parameters()):
        assert torch.equal(a, b)
    assert resumed_cbs[2].state() == whole_cbs[2].state()  # EarlyStopping
    assert resumed_cbs[4].state() == whole_cbs[4].state()  # ReduceLROnPlateau
    # ModelCheckpoint's best carried over: the plateau after the resume saved nothing more
    assert sorted(p.name for p in (tmp_path / "cut").glob("best-*.pt")) == ["best-1.pt", "best-2.pt"]
