"""Keras 3's tests of EarlyStopping, ReduceLROnPlateau, LearningRateScheduler and ModelCheckpoint
(keras/src/callbacks/*_test.py), their scenarios and expected values re-expressed with fitkit.

Scenarios the older tests already pin down are not repeated: EarlyStopping's stopping epoch of a
flat run for each patience, min_delta and missing values (test_callbacks_early_stopping.py),
ReduceLROnPlateau with a step scheduler (test_callbacks_learning_rate.py)."""

import os
import warnings

import pytest
import torch
from keras_port import Scripted, class_data, dense, differs

from fitkit import Model, TrainerControl, TrainerState, TrainingArguments
from fitkit.callbacks import EarlyStopping, LambdaCallback, LearningRateScheduler, ModelCheckpoint, ReduceLROnPlateau

MODE = "`mode` other than 'auto', 'min' or 'max' raises `ValueError` when the callback is built"
SCHEDULE = "a rate scheduled by `compile(lr_scheduler=...)` works with `ReduceLROnPlateau` and `LearningRateScheduler`"


# -- EarlyStopping (early_stopping_test.py) ----------------------------------------------------------------
def regression(n=10, dim=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, dim, generator=g), torch.rand(n, 1, generator=g)


def test_early_stopping_direction_for_each_mode_and_name():
    cases = [("max", "val_mse", "max"), ("min", "val_loss", "min"), ("auto", "val_mse", "min"), ("auto", "loss", "min"),
             ("auto", "acc", "max"), ("auto", "val_accuracy", "max"), ("auto", "hinge", "min"),
             ("auto", "f1_score", "max")]
    stoppers = [EarlyStopping(monitor=monitor, mode=mode, patience=0) for mode, monitor, _ in cases]
    model = Model(dense(5, 1, 1)).compile("adam", "mae", ["mse"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # several EarlyStopping in one list; names this model does not log
        model.fit(*regression(), batch_size=5, validation_data=regression(seed=1), callbacks=stoppers, epochs=2,
                  verbose=0)
    assert [s._direction for s in stoppers] == [expected for *_, expected in cases]
    with pytest.raises(ValueError, match="mode='min'"):
        EarlyStopping(monitor="unknown", patience=0)


@pytest.mark.parametrize("patience", [0, 1, 2, 3])
def test_early_stopping_patience_on_scripted_losses(patience):
    losses = [10.0, 9.0, 8.0, 9.0, 8.9, 8.8, 8.7, 8.6, 8.5]
    stopper = EarlyStopping(monitor="loss", patience=patience)
    Model(dense(5, 1)).compile("sgd", "mse").fit(
        *regression(), batch_size=10, epochs=len(losses), callbacks=[Scripted("loss", losses, on="log"), stopper],
        verbose=0)
    assert stopper.stopped_epoch == max(patience, 1) + 2


def test_early_stopping_reuse_runs_at_least_patience_epochs_each_fit():
    g = torch.Generator().manual_seed(0)
    data = torch.rand(100, 1, generator=g)
    labels = (data > 0.5).float()
    model = Model(dense(1, 1, 1)).compile("sgd", "mae", ["mse"])
    stopper = EarlyStopping(monitor="mse", patience=3)
    for _ in range(2):
        history = model.fit(data, labels, callbacks=[stopper], verbose=0, epochs=20)
        assert len(history.epoch) >= 3


def train_begin(callback):
    callback.on_train_begin(TrainingArguments(eval_strategy="epoch"), TrainerState(), TrainerControl())


def test_early_stopping_state_is_reset_at_each_train_begin():
    stopper = EarlyStopping(monitor="loss", patience=3)
    train_begin(stopper)
    stopper.best, stopper.wait, stopper.stopped_epoch, stopper.best_epoch = 0.1, 3, 5, 5
    stopper.best_weights = {"w": torch.zeros(1)}
    train_begin(stopper)  # a new fit
    assert stopper.best is None and stopper.wait == 0 and stopper.stopped_epoch == 0 and stopper.best_epoch == 0
    assert stopper.best_weights is None


def test_early_stopping_with_baseline_runs_at_least_patience_epochs():
    stopper = EarlyStopping(monitor="mse", patience=3, baseline=0.6)
    model = Model(dense(5, 1, 1)).compile("sgd", "mae", ["mse"])
    history = model.fit(*regression(), callbacks=[stopper], verbose=0, epochs=20)
    assert len(history.epoch) >= 3


def restored_epoch(losses, stop_at=None, **options):
    """Keras' DummyModel: each evaluation marks the weights with its epoch; returns (epochs run,
    the epoch whose weights the model holds at the end)."""
    script = Scripted("val_loss", losses, mark_weights=True)
    callbacks = [script, EarlyStopping(monitor="val_loss", restore_best_weights=True, **options)]
    if stop_at is not None:
        def stop(args, state, control, **kwargs):
            if len(script.weights) == stop_at + 1:
                control.should_training_stop = True

        callbacks.append(LambdaCallback(on_evaluate=stop))
    model = Model(dense(3, 1)).compile("sgd", "mse", learning_rate=0.0)
    history = model.fit(*regression(dim=3), validation_data=regression(dim=3, seed=1), epochs=len(losses),
                        callbacks=callbacks, verbose=0)
    return len(history.epoch), float(next(model.module.parameters()).detach().flatten()[0])


def test_early_stopping_restores_the_best_epoch_s_weights():
    assert restored_epoch([0.2, 0.15, 0.1, 0.11, 0.12], patience=2) == (5, 2.0)
    # no epoch beats the baseline: 5 epochs, and the best of them (epoch 2) comes back
    assert restored_epoch([0.9, 0.8, 0.7, 0.71, 0.72, 0.73], patience=5, baseline=0.5) == (5, 2.0)
    # another callback stops training: the best weights come back too
    assert restored_epoch([0.9, 0.8, 0.7, 0.71, 0.72, 0.73], stop_at=3, patience=5, baseline=0.5) == (4, 2.0)


def test_early_stopping_with_start_from_epoch():
    model = Model(dense(5, 1, 1)).compile("sgd", "mae", ["mse"])
    for patience in (3, 0):
        stopper = EarlyStopping(monitor="mse", patience=patience, start_from_epoch=2)
        history = model.fit(*regression(), callbacks=[stopper], verbose=0, epochs=20)
        assert len(history.epoch) >= patience + 2


@differs(MODE)
def test_early_stopping_unknown_mode_warns_and_falls_back_to_auto():
    with pytest.warns(UserWarning, match="mode 'unknown' is unknown"):
        stopper = EarlyStopping(monitor="val_loss", mode="unknown")
    assert stopper.mode == "auto"


# -- ReduceLROnPlateau (reduce_lr_on_plateau_test.py) --------------------------------------------------------
def plateau_fit(epochs, optimizer="adam", **options):
    (x, y), (vx, vy) = class_data(10, one_hot=True), class_data(10, seed=1, one_hot=True)
    compile_options = options.pop("compile", {})
    model = Model(dense(3, 5, 2, activation=None)).compile(optimizer, "mse", learning_rate=0.1, **compile_options)
    model.fit(x, y, validation_data=(vx, vy), epochs=epochs, verbose=0, **options)
    return model


def last_rate(model):
    """The rate after the run (the optimizer's, as Keras reads `model.optimizer.learning_rate`)."""
    return model.optimizer.param_groups[0]["lr"]


def test_reduce_lr_with_model_fit():
    model = plateau_fit(2, callbacks=[ReduceLROnPlateau(patience=1, factor=0.1, min_delta=100)])
    assert last_rate(model) == pytest.approx(0.01)


def test_reduce_lr_verbose_message(capsys):
    plateau_fit(2, callbacks=[ReduceLROnPlateau(patience=1, factor=0.1, min_delta=100, verbose=1)])
    assert "ReduceLROnPlateau reducing learning rate to 0.01" in capsys.readouterr().out


def test_reduce_lr_honors_min_lr():
    model = plateau_fit(4, callbacks=[ReduceLROnPlateau(patience=1, factor=0.1, min_delta=10, min_lr=0.005)])
    assert last_rate(model) == pytest.approx(0.005)


def test_reduce_lr_cooldown_cuts_every_other_epoch():
    model = plateau_fit(4, callbacks=[ReduceLROnPlateau(patience=1, factor=0.1, min_delta=100, cooldown=2)])
    assert last_rate(model) == pytest.approx(0.001)  # two cuts in four epochs


def test_reduce_lr_state_is_reset_at_each_train_begin():
    plateau = ReduceLROnPlateau(patience=1, factor=0.1, monitor="loss", min_delta=0, cooldown=2)
    train_begin(plateau)
    plateau.best, plateau.wait, plateau.cooldown_counter = 0.5, 3, 2
    train_begin(plateau)  # a new fit
    assert plateau.best is None and plateau.wait == 0 and plateau.cooldown_counter == 0


@differs(SCHEDULE)
def test_reduce_lr_refuses_an_optimizer_with_a_schedule():
    with pytest.raises(TypeError, match="LearningRateSchedule"):
        plateau_fit(2, callbacks=[ReduceLROnPlateau(patience=1, min_delta=100)], compile={"lr_scheduler": "linear"})


# -- LearningRateScheduler (learning_rate_scheduler_test.py) -------------------------------------------------
def scheduled_fit(schedule, epochs, lr=0.01, optimizer="sgd", **options):
    x, y = class_data(10, one_hot=True)
    compile_options = options.pop("compile", {})
    model = Model(dense(3, 5, 2, activation=None)).compile(optimizer, "mse", learning_rate=lr, **compile_options)
    history = model.fit(x, y, epochs=epochs, callbacks=[LearningRateScheduler(schedule, **options)], verbose=0)
    return model, history


def test_scheduler_updates_the_learning_rate():
    model, _ = scheduled_fit(lambda epoch: 1.0 / (2.0 + epoch), epochs=1, verbose=1)
    assert last_rate(model) == 0.5


def test_scheduler_verbose_message(capsys):
    scheduled_fit(lambda epoch: 1.0 / (1.0 + epoch), epochs=1, verbose=1)
    assert "LearningRateScheduler setting learning rate to 1.0" in capsys.readouterr().out


def test_schedule_dependent_on_the_previous_rate():
    model, _ = scheduled_fit(lambda epoch, lr: lr / 2, epochs=2, lr=0.03, optimizer="adam")
    assert last_rate(model) == 0.03 / 4.0


def test_learning_rate_in_history():
    _, history = scheduled_fit(lambda epoch, lr: 0.5, epochs=1)
    assert type(history.history["learning_rate"][0]) is float and history.history["learning_rate"][0] == 0.5


@differs(SCHEDULE)
def test_scheduler_refuses_an_optimizer_with_a_schedule():
    with pytest.raises(TypeError, match="LearningRateSchedule"):
        scheduled_fit(lambda epoch, lr: lr / 2, epochs=2, compile={"lr_scheduler": "linear"})


# -- ModelCheckpoint (model_checkpoint_test.py) --------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint_data():
    return class_data(30, classes=3, seed=42), class_data(30, classes=3, seed=43)


def checkpoint_fit(data, callbacks, epochs=1, batch_size=5, metrics=("accuracy",), model=None):
    (x, y), (vx, vy) = data
    model = model or Model(dense(3, 5, 3)).compile("sgd", "cross_entropy", list(metrics), learning_rate=0.01)
    model.fit(x, y, batch_size=batch_size, validation_data=(vx, vy), callbacks=callbacks, epochs=epochs, verbose=0)
    return model


@pytest.mark.parametrize("monitor, mode, save_best_only", [
    ("val_loss", "auto", False), ("val_loss", "min", False), ("val_accuracy", "max", False),
    ("val_accuracy", "max", True)])
def test_checkpoint_options_write_the_file_into_a_new_folder(tmp_path, checkpoint_data, monitor, mode, save_best_only):
    path = tmp_path / "subdir" / "checkpoint.pt"
    checkpoint_fit(checkpoint_data, [ModelCheckpoint(path, monitor=monitor, save_best_only=save_best_only, mode=mode)])
    assert path.exists()


def test_checkpoint_unknown_monitor_warns_and_saves(tmp_path, checkpoint_data):
    path = tmp_path / "checkpoint.pt"
    with pytest.warns(UserWarning, match="unknown"):
        checkpoint_fit(checkpoint_data, [ModelCheckpoint(path, monitor="unknown", save_best_only=True, mode="min")])
    assert path.exists()


@differs(MODE)
def test_checkpoint_unknown_mode_warns(tmp_path):
    with pytest.warns(UserWarning, match="ModelCheckpoint mode 'unknown' is unknown"):
        ModelCheckpoint(tmp_path / "c.pt", monitor="val_accuracy", save_best_only=True, mode="unknown")


@pytest.mark.parametrize("weights_only", [False, True])
def test_checkpoint_integer_save_freq_every_three_epochs(tmp_path, checkpoint_data, weights_only):
    pattern = str(tmp_path / "checkpoint.epoch{epoch:02d}.pt")
    ckpt = ModelCheckpoint(pattern, monitor="val_accuracy", mode="max", save_freq=15, save_weights_only=weights_only)
    checkpoint_fit(checkpoint_data, [ckpt], epochs=10, batch_size=6)  # 5 steps an epoch: a save every 3 epochs
    assert [e for e in range(1, 11) if os.path.exists(pattern.format(epoch=e))] == [3, 6, 9]


def test_checkpoint_save_freq_values():
    with pytest.raises(ValueError, match="Unrecognized save_freq"):
        ModelCheckpoint("c.pt", save_weights_only=True, save_freq="invalid_save_freq")
    ModelCheckpoint("c.pt", save_weights_only=True, save_freq="epoch")
    ModelCheckpoint("c.pt", save_weights_only=True, save_freq=3)


@pytest.mark.parametrize("weights_only", [False, True])
def test_checkpoint_batch_in_the_file_name(tmp_path, checkpoint_data, weights_only):
    pattern = str(tmp_path / "checkpoint.epoch{epoch:02d}batch{batch:02d}.pt")
    ckpt = ModelCheckpoint(pattern, monitor="val_loss", save_freq=1, save_weights_only=weights_only)
    checkpoint_fit(checkpoint_data, [ckpt], epochs=5, batch_size=15)  # 2 batches an epoch
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(pattern.format(epoch=e, batch=b)) for e in range(1, 6) for b in (1, 2))


@pytest.mark.parametrize("monitor, mode, threshold, saved", [
    ("val_accuracy", "max", -0.01, True), ("val_loss", "auto", None, True), ("val_loss", "min", 0, False),
    ("val_loss", "auto", 0, False), ("val_auroc", "auto", 1, False)])
def test_checkpoint_initial_value_threshold(tmp_path, checkpoint_data, monitor, mode, threshold, saved):
    path = tmp_path / "checkpoint.pt"
    ckpt = ModelCheckpoint(path, monitor=monitor, save_best_only=True, initial_value_threshold=threshold, mode=mode)
    checkpoint_fit(checkpoint_data, [ckpt], metrics=("accuracy", "auroc"))
    assert path.exists() is saved


@pytest.mark.parametrize("weights_only", [False, True])
def test_checkpoint_loads_back_the_same_weights(tmp_path, checkpoint_data, weights_only):
    path = tmp_path / "checkpoint.pt"
    model = checkpoint_fit(checkpoint_data, [ModelCheckpoint(path, monitor="val_loss", save_best_only=True,
                                                             save_weights_only=weights_only)])
    if weights_only:
        fresh = dense(3, 5, 3, seed=7)
        fresh.load_state_dict(torch.load(path, weights_only=True))
    else:
        fresh = Model.load(str(path), dense(3, 5, 3, seed=7)).module
    reference = model.module.state_dict()
    assert set(fresh.state_dict()) == set(reference)
    for name, value in fresh.state_dict().items():
        assert torch.equal(value, reference[name])
