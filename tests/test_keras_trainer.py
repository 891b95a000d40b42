"""Keras habits on `Model` (issue 15), with the scenarios and expected values of the
evaluate / predict / *_on_batch parts of Keras' `keras/src/trainers/trainer_test.py`
re-expressed with fitkit, plus the Keras `fit` arguments and methods a Keras user reaches for.

Keras' `ExampleModel` is a Dense layer of 3 units without bias and with a kernel of ones:
here `torch.nn.Linear(4, 3, bias=False)` with weights of ones, and Keras' SGD (rate 0.01).
"""

import math

import numpy as np
import pytest
import torch
from helpers import Recorder, blobs, mlp

from fitkit import Model, TrainerCallback, TrainingArguments, unpack_data
from fitkit.callbacks import LambdaCallback


def dense_of_ones():
    layer = torch.nn.Linear(4, 3, bias=False)
    torch.nn.init.ones_(layer.weight)
    return layer


X = np.ones((100, 4), dtype="float32")
Y = np.zeros((100, 3), dtype="float32")
SW = np.arange(100, dtype="float32") / 50.0


# -- *_on_batch ------------------------------------------------------------------------------------
def test_on_batch_methods_report_the_batch_before_the_update():
    model = Model(dense_of_ones()).compile("sgd", "mse", metrics=["mse"])
    logs = model.train_on_batch(X, Y)
    assert isinstance(logs, list) and len(logs) == 2 and logs[0] == pytest.approx(16.0)
    logs = model.train_on_batch(X, Y, return_dict=True)
    assert isinstance(logs, dict) and len(logs) == 2 and logs["loss"] == pytest.approx(15.158, abs=1e-3)
    logs = model.test_on_batch(X, Y)
    assert isinstance(logs, list) and len(logs) == 2 and logs[0] == pytest.approx(14.360, abs=1e-3)
    logs = model.test_on_batch(X, Y, return_dict=True)
    assert logs["loss"] == pytest.approx(14.360, abs=1e-3)
    np.testing.assert_allclose(model.predict_on_batch(X)[0].numpy(), [3.789511] * 3, rtol=1e-5)
    # sample weights: Keras averages weighted losses over the batch
    assert model.train_on_batch(X, Y, SW)[0] == pytest.approx(14.217, abs=1e-3)
    assert model.test_on_batch(X, Y, SW)[0] == pytest.approx(13.476, abs=1e-3)
    np.testing.assert_allclose(model.predict_on_batch(X)[0].numpy(), [3.689468] * 3, rtol=1e-5)
    # class weights: one-hot-like targets of zeros are class 0
    assert model.train_on_batch(X, Y, class_weight={1: 0.3, 0: 0.2})[0] == pytest.approx(2.722, abs=1e-3)


def test_on_batch_methods_without_training():
    model = Model(dense_of_ones()).compile(loss="mse", metrics=["mse"])
    np.testing.assert_allclose(model.predict_on_batch(X)[0].numpy(), [4.0, 4.0, 4.0])
    logs = model.test_on_batch(X, Y)
    assert isinstance(logs, list) and len(logs) == 2 and logs[0] == pytest.approx(16.0)
    assert model.test_on_batch(X, Y, return_dict=True)["loss"] == pytest.approx(16.0)


@pytest.mark.xfail(strict=True, reason="docs/migrating-from-keras.md: `predict` and `predict_on_batch` return "
                                       "torch tensors, not NumPy arrays")
def test_predict_on_batch_returns_numpy_as_keras():
    assert isinstance(Model(dense_of_ones()).predict_on_batch(X), np.ndarray)


def test_on_batch_steps_train_like_fit():
    x, y = blobs(32)
    a, b = Model(mlp()), Model(mlp())
    for model in (a, b):
        model.compile("adam", "cross_entropy", ["accuracy"], learning_rate=0.01)
    a.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    for _ in range(3):
        logs = b.train_on_batch(x, y, return_dict=True)
    assert set(logs) == {"loss", "accuracy"}
    assert all(torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters()))


# -- evaluate --------------------------------------------------------------------------------------
def test_evaluate_flow_returns_keras_list_or_a_dict():
    model = Model(dense_of_ones()).compile("sgd", "mse", metrics=["mse"])
    assert model.evaluate(X, Y, batch_size=16) == pytest.approx([16.0, 16.0])  # Keras' default: a list
    result = model.evaluate(X, Y, batch_size=16, return_dict=True)
    assert result == pytest.approx({"loss": 16.0, "mse": 16.0})
    assert Model(dense_of_ones()).compile("sgd", "mse").evaluate(X, Y, batch_size=16) == pytest.approx(16.0)


class CustomTestStep(Model):
    def test_step(self, data):
        logs = super().test_step(data)
        x, y, _ = unpack_data(data)
        logs["mse"] = torch.nn.functional.mse_loss(self.module(x), y)
        logs["my_custom_metric"] = 5.0
        return logs


@pytest.mark.parametrize("return_dict", [False, True])
def test_evaluate_with_a_custom_test_step(return_dict):
    model = CustomTestStep(dense_of_ones()).compile("sgd", "mse", metrics=["mse"])
    out = model.evaluate(X, Y, batch_size=16, return_dict=return_dict)
    assert len(out) == 3
    assert (out["my_custom_metric"] if return_dict else out[-1]) == pytest.approx(5.0)  # custom values go last


def test_evaluate_list_follows_the_metrics_order():
    def metrics_zero(y_pred, y_true):
        return torch.tensor(0.0)

    def metrics_one(y_pred, y_true):
        return torch.tensor(1.0)

    x, y = np.ones((3, 4), dtype="float32"), np.ones((3, 3), dtype="float32")
    model = Model(dense_of_ones()).compile("sgd", "mse", metrics=[metrics_zero, metrics_one])
    assert model.metrics_names == ["loss", "metrics_zero", "metrics_one"]
    out = model.evaluate(x, y, verbose=0, return_dict=False)
    assert len(out) == 3 and out[1] == 0.0 and out[2] == 1.0
    model.compile("sgd", "mse", metrics=[metrics_one, metrics_zero])
    out = model.evaluate(x, y, verbose=0, return_dict=False)
    assert out[1] == 1.0 and out[2] == 0.0


def test_evaluate_with_a_different_batch_size_gives_the_same_loss():
    x, y = blobs(64)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    assert model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)["loss"] == pytest.approx(
        model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)["loss"], rel=1e-6)


def test_evaluate_and_predict_take_steps_and_verbose(capsys):
    x, y = blobs(64)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model.module(x[:20]), y[:20]).item()
    assert model.evaluate(x, y, batch_size=10, steps=2, verbose=0, return_dict=True)["loss"] == pytest.approx(expected, rel=1e-6)
    assert model.predict(x, batch_size=10, steps=3, verbose=0).shape == (30, 3)
    assert capsys.readouterr().out == ""
    model.evaluate(x, y, batch_size=16, verbose=2)
    model.predict(x, batch_size=16, verbose=1)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("4/4 - ") and "loss: " in lines[0]
    assert lines[1].startswith("4/4 - ") and "loss" not in lines[1]
    with pytest.raises(ValueError, match="`verbose`=3"):
        model.evaluate(x, y, verbose=3)


# -- fit's Keras arguments -------------------------------------------------------------------------
def test_stop_training_from_a_lambda_callback_ends_the_run():
    x, y = blobs(32)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    stopper = LambdaCallback(on_epoch_end=lambda args, state, control, **kw: setattr(
        model, "stop_training", state.epoch >= 2))
    recorder = Recorder()
    history = model.fit(x, y, epochs=6, batch_size=8, callbacks=[stopper, recorder], verbose=0)
    assert len(history.history["loss"]) == 2 and recorder.events[-1] == "on_train_end"
    assert model.stop_training  # still set after the run, as Keras leaves it
    model.fit(x, y, epochs=2, batch_size=8, verbose=0)  # cleared when the next fit starts
    assert model.state.global_step == 8


class StopOnTheModule(TrainerCallback):
    """Sets `stop_training` on the module a callback receives, at global step 3."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 3:
            model.stop_training = True


def test_stop_training_on_the_module_ends_after_the_current_step():
    x, y = blobs(64)
    recorder = Recorder()
    model = Model(mlp()).compile("sgd", "cross_entropy")
    model.fit(x, y, epochs=6, batch_size=8, callbacks=[StopOnTheModule(), recorder], verbose=0)
    assert model.state.global_step == 3 and recorder.events[-1] == "on_train_end"


def test_initial_epoch_starts_the_epoch_count_there():
    x, y = blobs(40)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    history = model.fit(x, y, batch_size=10, epochs=5, initial_epoch=3, verbose=0)
    assert history.epoch == [3, 4] and len(history.history["loss"]) == 2
    assert model.state.global_step == 20  # the steps of epochs 0..4, as if 0..2 were done
    with pytest.raises(ValueError, match="`initial_epoch`=5 leaves nothing to train"):
        model.fit(x, y, epochs=5, initial_epoch=5, verbose=0)


class Stream:
    """Data of unknown length that never ends: `steps_per_epoch` gives it epochs."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        while True:
            yield self.x, self.y


def test_steps_per_epoch_bounds_epochs_and_gives_endless_data_its_epochs():
    x, y = blobs(40)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    history = model.fit(x, y, batch_size=10, epochs=2, steps_per_epoch=3, verbose=0)
    assert model.state.global_step == 6 and history.params["steps"] == 3
    history = model.fit(Stream(x[:10], y[:10]), epochs=3, steps_per_epoch=4, verbose=0)
    assert model.state.global_step == 12 and history.epoch == [0, 1, 2]


class CountsEvaluationBatches(TrainerCallback):
    def __init__(self):
        self.sizes = []

    def on_prediction_step(self, args, state, control, batch=None, **kwargs):
        self.sizes.append(len(batch[0]))


def test_validation_steps_and_validation_batch_size():
    x, y = blobs(60)
    counter = CountsEvaluationBatches()
    model = Model(mlp()).compile("sgd", "cross_entropy")
    history = model.fit(x[:40], y[:40], epochs=1, batch_size=10, validation_data=(x[40:], y[40:]),
                        validation_batch_size=5, validation_steps=2, callbacks=[counter], verbose=0)
    assert counter.sizes == [5, 5]
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model.module(x[40:50]), y[40:50]).item()
    assert history.history["val_loss"][0] == pytest.approx(expected, rel=1e-6)


def test_validation_freq_evaluates_every_n_epochs():
    x, y = blobs(40)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    history = model.fit(x[:30], y[:30], epochs=4, batch_size=10, validation_data=(x[30:], y[30:]),
                        validation_freq=2, verbose=0)
    values = history.history["val_loss"]
    assert math.isnan(values[0]) and math.isnan(values[2]) and not math.isnan(values[1]) and not math.isnan(values[3])


@pytest.mark.xfail(strict=True, reason="docs/migrating-from-keras.md: with `validation_freq`, History holds NaN "
                                       "for the epochs without validation (one value per epoch)")
def test_validation_freq_history_lists_only_validated_epochs_as_keras():
    x, y = blobs(40)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    history = model.fit(x[:30], y[:30], epochs=4, batch_size=10, validation_data=(x[30:], y[30:]),
                        validation_freq=2, verbose=0)
    assert len(history.history["val_loss"]) == 2


def test_keras_only_data_options_name_the_fitkit_way():
    x, y = blobs(16)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    with pytest.raises(TypeError, match="`workers`.*num_workers"):
        model.fit(x, y, workers=4, verbose=0)
    with pytest.raises(TypeError, match="`use_multiprocessing`.*num_workers"):
        model.fit(x, y, use_multiprocessing=True, verbose=0)


@pytest.mark.parametrize("name, value, hint", [("steps_per_execution", 4, "every step"),
                                               ("auto_scale_loss", True, "16-mixed")])
def test_keras_only_compile_options_name_the_fitkit_way(name, value, hint):
    with pytest.raises(TypeError, match=f"`{name}` is a Keras option.*{hint}") as raised:
        Model(mlp()).compile("sgd", "cross_entropy", **{name: value})
    assert "did you mean" not in str(raised.value)


def test_run_eagerly_turns_jit_compile_off_as_keras_does(tmp_path):
    """Keras 3 on torch: `run_eagerly=True` disables `jit_compile`, with a warning when it was
    asked for; `run_eagerly=False` changes nothing (torch runs eagerly). fitkit the same, kept
    through `args=` and a save and load."""
    from keras_real import real_keras

    keras = real_keras()
    kmodel = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.warns(UserWarning, match="run_eagerly"):
        kmodel.compile("sgd", "mse", run_eagerly=True, jit_compile=True)
    with pytest.warns(UserWarning, match="run_eagerly"):
        model = Model(mlp()).compile("sgd", "cross_entropy", run_eagerly=True, jit_compile=True)
    assert kmodel.jit_compile is False and model.config.args.jit_compile is False
    assert model.training_arguments(TrainingArguments(per_device_train_batch_size=4)).jit_compile is False
    model.save(tmp_path / "m.pt")
    with pytest.warns(UserWarning, match="run_eagerly"):
        assert Model.load(tmp_path / "m.pt", mlp()).config.args.jit_compile is False
    kmodel.compile("sgd", "mse", run_eagerly=False, jit_compile=True)
    assert kmodel.jit_compile is True
    assert Model(mlp()).compile("sgd", "cross_entropy", run_eagerly=False, jit_compile=True).config.args.jit_compile is True
    with pytest.raises(TypeError, match="`run_eagerly` must be True or False"):
        Model(mlp()).compile("sgd", "cross_entropy", run_eagerly="yes")


# -- weights, counts, names, calling ------------------------------------------------------------------
def test_weights_counts_names_and_calling_the_model(tmp_path):
    x, y = blobs(32)
    model = Model(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 3)))
    model.compile("adam", "cross_entropy", metrics=["accuracy"])
    assert model.count_params() == 8 * 16 + 16 + 32 + 16 * 3 + 3
    assert model.metrics_names == ["loss", "accuracy"]
    before = model.get_weights()
    assert all(isinstance(w, np.ndarray) for w in before) and len(before) == len(model.module.state_dict())
    model.save_weights(tmp_path / "w.pt")
    model.fit(x, y, epochs=2, verbose=0)
    assert not np.array_equal(model.get_weights()[0], before[0])
    model.set_weights(before)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
    model.fit(x, y, epochs=1, verbose=0)
    model.load_weights(tmp_path / "w.pt")
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
    model.module.eval()
    torch.testing.assert_close(model(x), model.module(x))
    with pytest.raises(ValueError, match="list of 9 arrays"):
        model.set_weights(before[:2])
    with pytest.raises(ValueError, match=r"0.weight has shape \(16, 8\)"):
        model.set_weights([np.zeros((2, 2))] + before[1:])


def test_summary_shows_output_shapes_after_fitting_a_dataloader():
    x, y = blobs(32)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    model.fit(loader, verbose=0)
    assert "(None, 16)" in model.summary() and "(None, 3)" in model.summary()


def test_the_migration_page_moves_a_keras_script_by_imports_and_model_only(tmp_path, monkeypatch, capsys):
    import os
    import re

    page = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "migrating-from-keras.md")
    with open(page) as f:
        keras_block, fitkit_block = re.findall(r"```python\n(# (?:Keras|fitkit)\n.*?)```", f.read(), re.S)[:2]
    marker = "# -- the same in both from here --"
    assert keras_block.split(marker)[1] == fitkit_block.split(marker)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(fitkit_block, page, "exec"), {"__name__": "migrated"})
    printed = capsys.readouterr().out.split()
    assert printed[1] == "True" and printed[2] == "9610" and (tmp_path / "training.csv").is_file()
