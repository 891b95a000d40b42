"""EarlyStopping: Keras semantics on real fits (frozen models and scripted metric values)."""

import json
import warnings

import pytest
import torch
from helpers import blobs as data
from helpers import mlp

from fitkit import Model, TrainerCallback
from fitkit.callbacks import EarlyStopping


def fit(callbacks, epochs=10, lr=0.0, validation=True, **options):
    x, y = data()
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=lr)
    val = data(16, seed=1) if validation else None
    history = model.fit(x, y, batch_size=16, epochs=epochs, validation_data=val, callbacks=callbacks,
                        verbose=0, seed=0, **options)
    return model, history


class Script(TrainerCallback):
    """Replaces `key` in each evaluation's metrics by the next scripted value and keeps a copy
    of the weights at that evaluation (runs before EarlyStopping: order 0 < 10)."""

    def __init__(self, key, values):
        self.key, self.values, self.weights = key, list(values), []

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        metrics[self.key] = self.values[len(self.weights)]
        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})


@pytest.mark.parametrize("patience, epochs_run", [(0, 2), (1, 2), (2, 3), (3, 4)])
def test_frozen_model_stops_after_one_plus_patience_epochs(patience, epochs_run):
    stop = EarlyStopping(monitor="val_loss", patience=patience)
    model, history = fit([stop], epochs=10)
    assert len(history.epoch) == epochs_run
    assert model.state.epoch == epochs_run
    assert stop.stopped_epoch == epochs_run - 1  # 0-based, Keras
    assert stop.best_epoch == 0
    assert history.history["val_loss"][0] == history.history["val_loss"][-1]  # really frozen


def test_improving_model_is_not_stopped():
    stop = EarlyStopping(monitor="val_loss", patience=1)
    _, history = fit([stop], epochs=5, lr=0.005)
    losses = history.history["val_loss"]
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert not stop.stopped and stop.stopped_epoch == 0


def test_start_from_epoch_ignores_the_first_epochs():
    stop = EarlyStopping(patience=1, start_from_epoch=2)
    _, history = fit([stop], epochs=10)
    # epochs 1 and 2 are ignored, epoch 3 sets the best, epoch 4 has no improvement -> stop
    assert len(history.epoch) == 4
    assert stop.best_epoch == 2 and stop.stopped_epoch == 3


def test_min_delta_needs_a_large_enough_change():
    values = [1.0, 0.95, 0.9, 0.85, 0.8]
    stop = EarlyStopping(patience=2, min_delta=0.1)
    _, history = fit([Script("val_loss", values), stop], epochs=5, lr=0.01)
    assert len(history.epoch) == 3  # 0.05 steps never count as improvements

    stop = EarlyStopping(patience=2)
    _, history = fit([Script("val_loss", values), stop], epochs=5, lr=0.01)
    assert len(history.epoch) == 5


def test_mode_max_from_the_name():
    values = [0.5, 0.6, 0.6, 0.6, 0.6, 0.6]
    stop = EarlyStopping(monitor="val_accuracy", patience=2)
    _, history = fit([Script("val_accuracy", values), stop], epochs=6, lr=0.01)
    assert len(history.epoch) == 4 and stop.best_epoch == 1  # 0.6 was an improvement: higher is better
    stop = EarlyStopping(monitor="val_accuracy", patience=2, mode="min")
    _, history = fit([Script("val_accuracy", values), stop], epochs=6, lr=0.01)
    assert len(history.epoch) == 3 and stop.best_epoch == 0


def test_baseline_must_be_beaten_within_patience():
    stop = EarlyStopping(patience=2, baseline=0.5)
    _, history = fit([Script("val_loss", [1.0] * 10), stop], epochs=10, lr=0.01)
    assert len(history.epoch) == 2  # the first value never beat the baseline, so the wait kept counting
    stop = EarlyStopping(patience=2, baseline=2.0)
    _, history = fit([Script("val_loss", [1.0] * 10), stop], epochs=10, lr=0.01)
    assert len(history.epoch) == 3


def test_restore_best_weights_after_an_early_stop():
    script = Script("val_loss", [3.0, 1.0, 2.0, 2.5, 4.0, 5.0])
    stop = EarlyStopping(patience=2, restore_best_weights=True)
    model, history = fit([script, stop], epochs=6, lr=0.05)
    assert len(history.epoch) == 4 and stop.best_epoch == 1
    final = model.module.state_dict()
    for k, v in final.items():
        assert torch.equal(v, script.weights[1][k])
    assert any(not torch.equal(final[k], script.weights[3][k]) for k in final)  # it moved after the best


def test_restore_best_weights_also_without_an_early_stop():
    script = Script("val_loss", [3.0, 1.0, 2.0])
    stop = EarlyStopping(patience=5, restore_best_weights=True)
    model, _ = fit([script, stop], epochs=3, lr=0.05)
    assert not stop.stopped
    for k, v in model.module.state_dict().items():
        assert torch.equal(v, script.weights[1][k])


def test_without_restore_the_last_weights_stay():
    script = Script("val_loss", [3.0, 1.0, 2.0])
    model, _ = fit([script, EarlyStopping(patience=5)], epochs=3, lr=0.05)
    for k, v in model.module.state_dict().items():
        assert torch.equal(v, script.weights[2][k])


def test_missing_monitor_warns_once_and_training_completes():
    stop = EarlyStopping(monitor="val_f1", patience=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history = fit([stop], epochs=3)
    mine = [w for w in caught if "val_f1" in str(w.message)]
    assert len(mine) == 1
    assert "val_loss" in str(mine[0].message) and "val_accuracy" in str(mine[0].message)
    assert len(history.epoch) == 3


def test_mode_auto_needs_a_known_name():
    with pytest.raises(ValueError, match="mode='min'"):
        EarlyStopping(monitor="val_custom_score")
    EarlyStopping(monitor="val_custom_score", mode="max")  # explicit mode is fine
    EarlyStopping(monitor="val_r2_score")  # torchmetrics' R2Score says higher is better
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(mode="lowest")


def test_training_loss_without_validation_is_checked_each_epoch():
    stop = EarlyStopping(monitor="loss", patience=1)
    _, history = fit([stop], epochs=10, validation=False, shuffle=False)
    assert len(history.epoch) == 2


def test_counters_reset_for_each_fit():
    stop = EarlyStopping(patience=1)
    x, y = data()
    model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=0.0)
    for _ in range(2):
        history = model.fit(x, y, batch_size=16, epochs=10, validation_data=data(16, 1), callbacks=[stop],
                            verbose=0, seed=0)
        assert len(history.epoch) == 2


def test_standalone_evaluate_is_ignored():
    stop = EarlyStopping(monitor="val_loss", patience=0)
    model, _ = fit([stop], epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.evaluate(*data(), callbacks=[stop])
    assert not [w for w in caught if "EarlyStopping" in str(w.message)]
    assert stop.wait == 0


def test_state_is_json_and_load_state_continues_counting():
    stop = EarlyStopping(patience=2)
    fit([stop], epochs=10)
    saved = json.loads(json.dumps(stop.state()))
    assert saved["wait"] == 2 and saved["stopped_epoch"] == 2 and saved["best_epoch"] == 0
    assert isinstance(saved["best"], float)

    resumed = EarlyStopping(patience=2)
    resumed.load_state({**saved, "wait": 1, "best": 0.0})  # a best no frozen model can beat
    _, history = fit([resumed], epochs=10)
    assert len(history.epoch) == 1  # wait 1 -> 2 at the first evaluation: stop


def test_it_runs_after_user_callbacks():
    stop = EarlyStopping()
    model = Model(mlp())
    model.add_callback(stop)
    user = Script("val_loss", [])
    model.add_callback(user)
    names = [type(cb).__name__ for cb in model.callbacks]
    assert names.index("Script") < names.index("EarlyStopping")
