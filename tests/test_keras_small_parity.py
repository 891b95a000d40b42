"""Smaller Keras habits beside real Keras 3 (issue 36): the logs of `on_predict_batch_end` for a
dict output, `on_predict_begin` on a fitkit callback, Keras' learning-rate callbacks in the
`History`, and a `keras.callbacks.History` given to `fit`."""

import logging
import warnings

import numpy as np
import pytest
import torch
from keras_real import real_keras, twin_dense

from fitkit import Model, TrainerCallback


def _data(n=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(-1, keepdim=True)


class TwoOut(torch.nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        y = self.linear(x)
        return {"a": y, "b": 2 * y}


def test_predict_batch_end_logs_hold_a_dict_outputs_items_as_keras():
    keras = real_keras()
    x, _ = _data(16)
    kdense, net = twin_dense(keras, 4, 1)
    inputs = keras.Input((4,))
    out = kdense(inputs)
    kmodel = keras.Model(inputs, {"a": out, "b": keras.layers.Lambda(lambda t: 2 * t)(out)})

    def recorder(seen):
        return keras.callbacks.LambdaCallback(on_predict_batch_end=lambda batch, logs: seen.append(logs))

    theirs, ours = [], []
    kmodel.predict(x.numpy(), batch_size=8, verbose=0, callbacks=[recorder(theirs)])
    Model(TwoOut(net)).compile("sgd", "mse").predict(x, batch_size=8, verbose=0, callbacks=[recorder(ours)])
    assert len(ours) == len(theirs) == 2
    for mine, keras_logs in zip(ours, theirs):  # Keras' callback list flattens the dict into the logs
        assert list(mine) == list(keras_logs) == ["a", "b"]
        for key in ("a", "b"):
            np.testing.assert_allclose(np.asarray(mine[key]), np.asarray(keras_logs[key]), rtol=1e-5, atol=1e-6)


def test_a_trainer_callbacks_on_predict_begin_is_called_without_a_warning(caplog):
    calls = []

    class Begin(TrainerCallback):
        def on_predict_begin(self, args, state, control, **kwargs):
            calls.append("begin")

    x, _ = _data(8)
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        model.predict(x, verbose=0, callbacks=[Begin()])
    assert calls == ["begin"]
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [s for s in said if "on_predict_begin" in s], said


@pytest.mark.parametrize("which", ["ReduceLROnPlateau", "LearningRateScheduler"])
def test_keras_learning_rate_callbacks_leave_learning_rate_in_the_history_as_keras(which):
    keras = real_keras()
    x, y = _data()
    kmodel, net = twin_dense(keras, 4, 1)

    def callback():
        if which == "ReduceLROnPlateau":
            return keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, factor=0.5, min_delta=10.0)
        return keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)

    kmodel.compile(keras.optimizers.SGD(0.01), "mse")
    fit = dict(batch_size=8, epochs=3, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), callbacks=[callback()], **fit).history
    ours = Model(net).compile("sgd", "mse", learning_rate=0.01).fit(x, y, callbacks=[callback()], **fit).history
    assert sorted(ours) == sorted(theirs) == ["learning_rate", "loss"]
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key


def test_a_keras_history_given_to_fit_is_filled_and_returned_as_keras():
    keras = real_keras()
    x, y = _data()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(keras.optimizers.SGD(0.01), "mse")
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    theirs_cb, ours_cb = keras.callbacks.History(), keras.callbacks.History()
    theirs = kmodel.fit(x.numpy(), y.numpy(), callbacks=[theirs_cb], **fit)
    model = Model(net).compile("sgd", "mse", learning_rate=0.01)
    ours = model.fit(x, y, callbacks=[ours_cb], **fit)
    assert theirs is theirs_cb and ours is ours_cb
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)  # Keras' attribute, after fit
    assert ours.epoch == theirs.epoch == [0, 1]
    assert ours.history["loss"] == pytest.approx(theirs.history["loss"], rel=1e-5)


@pytest.mark.parametrize("columns", [1, 3])
def test_auc_on_one_or_several_label_columns_gives_keras_auc(columns):
    """`"auc"` on multi-label targets: one curve over every score, Keras' AUC(multi_label=False)."""
    keras = real_keras()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, 6, generator=g)
    y = (x[:, :columns] + 0.7 * torch.randn(64, columns, generator=g) > 0).float()
    kmodel, net = twin_dense(keras, 6, columns, activation="sigmoid")  # fitkit's module gives the logits
    kmodel.compile("sgd", "binary_crossentropy", metrics=["auc"])
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), batch_size=16, verbose=0, return_dict=True)
    model = Model(net).compile("sgd", "binary_crossentropy", metrics=["auc"])
    ours = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert ours["auc"] == pytest.approx(theirs["auc"], rel=1e-5)


def test_the_optimizers_learning_rate_is_there_after_compile_and_steers_fit_as_keras():
    """Keras builds the optimizer at `compile`: its rate can be read and set before any fit."""
    keras = real_keras()
    x, y = _data()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile("adam", "mse")
    model = Model(net).compile("adam", "mse")
    assert float(model.optimizer.learning_rate) == pytest.approx(float(kmodel.optimizer.learning_rate)) == 1e-3
    kmodel.optimizer.learning_rate = 0.05
    model.optimizer.learning_rate = 0.05
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), **fit).history
    ours = model.fit(x, y, **fit).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
    pending = Model(torch.nn.Linear(2, 1)).compile("sgd", "mse").optimizer
    with pytest.raises(AttributeError, match="built when `fit` starts"):
        pending.param_groups  # noqa: B018 - the optimizer itself exists from the first fit
    with pytest.raises(ValueError, match="finite number"):
        pending.learning_rate = -1
    assert Model(torch.nn.Linear(2, 1)).optimizer is None  # nothing compiled
