"""Hugging Face names: EarlyStoppingCallback with HF semantics, ProgressCallback."""

import warnings

import pytest
from helpers import Script, mlp
from helpers import blobs as data

from fitkit import Model
from fitkit.callbacks import EarlyStoppingCallback, ProgressBar, ProgressCallback


def fit(callbacks, epochs=10, lr=0.0, **options):
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=lr)
    history = model.fit(*data(), batch_size=16, epochs=epochs, validation_data=data(16, 1), callbacks=callbacks,
                        verbose=0, seed=0, **options)
    return model, history


# -- EarlyStoppingCallback -----------------------------------------------------------------------------------
@pytest.mark.parametrize("patience, epochs_run", [(0, 1), (1, 2), (3, 4)])
def test_hf_patience_counts_evaluations_without_improvement(patience, epochs_run):
    stop = EarlyStoppingCallback(early_stopping_patience=patience)
    _, history = fit([stop], epochs=10)
    assert len(history.epoch) == epochs_run
    assert stop.early_stopping_patience_counter == patience


def test_hf_threshold():
    values = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75]
    _, history = fit([Script("val_loss", values), EarlyStoppingCallback(2, early_stopping_threshold=0.1)], epochs=6)
    assert len(history.epoch) == 3
    _, history = fit([Script("val_loss", values), EarlyStoppingCallback(2)], epochs=6)
    assert len(history.epoch) == 6


def test_hf_metric_name_and_direction_from_the_arguments():
    values = [0.5, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    # a bare or eval_-prefixed name is looked up with fitkit's val_ prefix; "accuracy" is greater-is-better
    for name in ("accuracy", "eval_accuracy", "val_accuracy"):
        _, history = fit([Script("val_accuracy", values), EarlyStoppingCallback(2)], epochs=8,
                         metric_for_best_model=name)
        assert len(history.epoch) == 5, name
    _, history = fit([Script("val_accuracy", values), EarlyStoppingCallback(2)], epochs=8,
                     metric_for_best_model="val_accuracy", greater_is_better=False)
    assert len(history.epoch) == 3


def test_hf_missing_metric_warns_then_the_run_stops_with_an_error():
    # HF 5.x: the callback warns at on_evaluate, then the trainer's best-metric check raises,
    # naming the evaluation's values
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"'val_f1' matches none .*\(val_accuracy, val_loss\)"):
            fit([EarlyStoppingCallback(0)], epochs=3, metric_for_best_model="val_f1")
    assert len([w for w in caught if "val_f1" in str(w.message)]) == 1


def test_hf_state_layout():
    stop = EarlyStoppingCallback(2, 0.5)
    fit([stop], epochs=10)
    state = stop.state()
    assert state["args"] == {"early_stopping_patience": 2, "early_stopping_threshold": 0.5}
    assert state["attributes"]["early_stopping_patience_counter"] == 2
    resumed = EarlyStoppingCallback(2, 0.5)
    resumed.load_state({"attributes": {"early_stopping_patience_counter": 1, "best_metric": 0.0}})
    _, history = fit([resumed], epochs=10)
    assert len(history.epoch) == 1


def test_progress_callback_is_the_progress_bar():
    assert ProgressCallback is ProgressBar
