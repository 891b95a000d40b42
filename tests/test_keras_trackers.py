"""Trackers of every kind in a custom `train_step`, and Keras' metric objects as the guides write
them, beside real Keras 3 (torch backend) from the same weights: the customizing guide's "going
lower-level" step with its trackers as Keras' `Mean` or as torchmetrics objects, listed in a
`metrics` property or held only as attributes (each reset at an epoch's start and before an
evaluation, its last result logged); the built-in-methods guide's `CategoricalTruePositives`
whose `result()` is the Variable itself; `F1Score(average="macro")` through validation; two
metrics of one name refused."""

import numpy as np
import pytest
import torch
import torchmetrics
from keras_real import real_keras, twin_dense
from test_custom_step_metrics import _keras_guide, _partial_data

from fitkit import Model


def _trackers(keras, kind):
    if kind.startswith("keras"):
        return keras.metrics.Mean(name="loss"), keras.metrics.MeanAbsoluteError(name="mae")
    return torchmetrics.MeanMetric(), torchmetrics.MeanAbsoluteError()


def _ported(keras, kind):
    """The guide's step in fitkit, its trackers of `kind`: Keras' or torchmetrics', listed in a
    `metrics` property or held as attributes only."""
    keras_api = kind.startswith("keras")

    class Guide(Model):
        def __init__(self, module):
            super().__init__(module)
            self.loss_tracker, self.mae_metric = _trackers(keras, kind)

        def _values(self, loss, y, y_pred):
            if keras_api:
                self.loss_tracker.update_state(loss)
                self.mae_metric.update_state(y, y_pred)
                return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}
            self.loss_tracker.update(loss.detach())
            self.mae_metric.update(y_pred.detach(), y)
            return {"loss": self.loss_tracker.compute(), "mae": self.mae_metric.compute()}

        def train_step(self, data):
            x, y = data
            y_pred = self(x)
            loss = torch.nn.functional.mse_loss(y_pred, y)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return self._values(loss, y, y_pred)

        def test_step(self, data):
            x, y = data
            y_pred = self(x)
            return self._values(torch.nn.functional.mse_loss(y_pred, y), y, y_pred)

    if kind.endswith("listed"):
        Guide.metrics = property(lambda self: [self.loss_tracker, self.mae_metric])
    return Guide


@pytest.mark.parametrize("kind", ["keras listed", "keras attributes", "torchmetrics listed",
                                  "torchmetrics attributes"])
def test_trackers_of_every_kind_log_keras_values(kind):
    keras = real_keras()
    x, y, _ = _partial_data()
    x_val, y_val = x[:30] + 0.5, y[:30]
    kinner, net = twin_dense(keras, 4, 1)
    kmodel = _keras_guide(keras, kinner)
    kmodel.compile(keras.optimizers.SGD(0.01))
    model = _ported(keras, kind)(net).compile("sgd", learning_rate=0.01)
    fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), validation_data=(x_val.numpy(), y_val.numpy()), **fit).history
    ours = model.fit(x, y, validation_data=(x_val, y_val), **fit).history
    assert sorted(ours) == sorted(theirs) == ["loss", "mae", "val_loss", "val_mae"]
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key
    theirs_eval = kmodel.evaluate(x.numpy(), y.numpy(), batch_size=16, verbose=0, return_dict=True)
    ours_eval = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert ours_eval == pytest.approx(theirs_eval, rel=1e-5)


# -- Keras' metric objects as the guides write them -------------------------------------------------

N, CLASSES = 40, 3


def _classifier_twins(keras):
    kinner, net = twin_dense(keras, 5, CLASSES, seed=1)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(N, 5)).astype("float32")
    y = rng.integers(0, CLASSES, size=(N,)).astype("int64")
    return kinner, net, x, y


def _true_positives_returning_the_variable(keras):
    """The guide's `CategoricalTruePositives`, whose `result()` returns the Variable itself."""
    ops = keras.ops

    class CategoricalTruePositives(keras.metrics.Metric):
        def __init__(self, name="categorical_true_positives", **kwargs):
            super().__init__(name=name, **kwargs)
            self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
            values = ops.cast(ops.reshape(y_true, (-1, 1)), "int32") == ops.cast(y_pred, "int32")
            self.true_positives.assign_add(ops.sum(ops.cast(values, "float32")))

        def result(self):
            return self.true_positives

        def reset_state(self):
            self.true_positives.assign(0.0)

    return CategoricalTruePositives


@pytest.mark.parametrize("metric", ["true_positives_variable", "f1_macro"])
def test_keras_metric_objects_as_the_guides_write_them(metric):
    keras = real_keras()
    kinner, net, x, y = _classifier_twins(keras)

    def make():
        if metric == "f1_macro":
            return keras.metrics.F1Score(average="macro", threshold=None)
        return _true_positives_returning_the_variable(keras)()

    kmodel = keras.Sequential([keras.Input((5,)), kinner])
    sparse = metric != "f1_macro"
    target = y if sparse else np.eye(CLASSES, dtype="float32")[y]
    kmodel.compile(keras.optimizers.SGD(0.1), metrics=[make()],
                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True) if sparse else
                   keras.losses.CategoricalCrossentropy(from_logits=True))
    model = Model(net).compile("sgd", "sparse_categorical_crossentropy" if sparse else "categorical_crossentropy",
                               metrics=[make()], learning_rate=0.1)
    fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
    if not sparse:
        # (not with the Variable: Keras' History then keeps the Variable itself, which its validation
        # resets and refills, so Keras logs the validation count under the training name too)
        fit["validation_data"] = (x[:24], target[:24])
    theirs, ours = kmodel.fit(x, target, **fit).history, model.fit(x, target, **fit).history
    assert sorted(ours) == sorted(theirs)
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key
    assert model.evaluate(x, target, verbose=0) == pytest.approx(kmodel.evaluate(x, target, verbose=0), rel=1e-5)


def test_two_metrics_of_one_name_are_refused():
    keras = real_keras()
    with pytest.raises(ValueError, match=r"two metrics are logged as 'f1_score'.*own `name=`"):
        Model(torch.nn.Linear(2, 3)).compile("sgd", "categorical_crossentropy",
                                             metrics=[keras.metrics.F1Score(average="macro"),
                                                      keras.metrics.F1Score(average="micro")])


def test_a_torchmetrics_tracker_returned_as_a_number_is_named_in_a_warning():
    """fitkit tells a torchmetrics tracker's value by identity; a `.item()` of it cannot be told
    and is averaged: a warning says so and names the fix."""
    class AsNumber(Model):
        def __init__(self, module):
            super().__init__(module)
            self.tracker = torchmetrics.MeanMetric()

        def train_step(self, data):
            x, y = data
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.tracker.update(loss.detach())
            return {"loss": loss, "tracked": self.tracker.compute().item()}

    x, y, _ = _partial_data()
    with pytest.warns(UserWarning, match=r"MeanMetric.*return `tracker.compute\(\)` itself"):
        AsNumber(torch.nn.Linear(4, 1)).compile("sgd").fit(x, y, batch_size=16, epochs=1, verbose=0)
