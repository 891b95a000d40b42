"""Losses in Keras' order and with Keras' reduction, checked against real Keras 3: the
"Customizing fit" guide's `CustomMSE` (an MSE plus a regulariser on the prediction) and a
per-sample loss with and without sample weights."""

import pytest
import torch
from keras_real import real_keras, twin_dense

from fitkit import Model
from fitkit.adapters.losses import build_loss


class CustomMSE:
    """The guide's loss, written with torch ops: Keras' `call(y_true, y_pred)`, one value per sample."""

    def __init__(self, regularization_factor=0.1):
        self.regularization_factor = regularization_factor

    def call(self, y_true, y_pred):
        mse = torch.mean(torch.square(y_true - y_pred), dim=-1)
        reg = torch.mean(torch.square(0.5 - y_pred), dim=-1)
        return mse + reg * self.regularization_factor


def custom_mse(y_true, y_pred):
    """The same as a plain function (Keras' order by its parameter names)."""
    return CustomMSE().call(y_true, y_pred)


def _keras_custom_mse(keras):
    ops = keras.ops

    class KerasCustomMSE(keras.losses.Loss):
        def __init__(self, regularization_factor=0.1, name="custom_mse"):
            super().__init__(name=name)
            self.regularization_factor = regularization_factor

        def call(self, y_true, y_pred):
            mse = ops.mean(ops.square(y_true - y_pred), axis=-1)
            reg = ops.mean(ops.square(0.5 - y_pred), axis=-1)
            return mse + reg * self.regularization_factor

    return KerasCustomMSE()


def _batch():
    g = torch.Generator().manual_seed(2)
    return torch.randn(32, 4, generator=g), torch.rand(32, 1, generator=g)


@pytest.mark.parametrize("loss", [CustomMSE(), custom_mse], ids=["call-method", "function"])
def test_custom_mse_equals_keras_on_a_fixed_batch(loss):
    keras = real_keras()
    x, y = _batch()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(optimizer="adam", loss=_keras_custom_mse(keras))
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), batch_size=32, verbose=0)
    ours = Model(net).compile("adam", loss).evaluate(x, y, batch_size=32, verbose=0, return_dict=True)["loss"]
    assert ours == pytest.approx(theirs, rel=1e-5)
    swapped = float(CustomMSE().call(net(x), y).mean())  # fitkit's (outputs, targets) order would give this
    assert swapped != pytest.approx(theirs, rel=1e-3)


def test_one_training_step_with_custom_mse_equals_keras():
    keras = real_keras()
    x, y = _batch()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(optimizer="sgd", loss=_keras_custom_mse(keras))
    model = Model(net).compile("sgd", CustomMSE())
    kmodel.train_on_batch(x.numpy(), y.numpy())
    model.train_on_batch(x, y)
    kernel, bias = kmodel.get_weights()
    torch.testing.assert_close(net.weight.detach(), torch.from_numpy(kernel.T.copy()), rtol=1e-5, atol=1e-6)


def _per_sample(y_true, y_pred):
    return torch.mean(torch.abs(y_true - y_pred), dim=-1)


def _keras_per_sample(keras):
    class PerSample(keras.losses.Loss):  # reduction: Keras' default, "sum_over_batch_size"
        def call(self, y_true, y_pred):
            return keras.ops.mean(keras.ops.abs(y_true - y_pred), axis=-1)

    return PerSample()


def test_per_sample_loss_reduces_as_keras_with_and_without_sample_weights():
    keras = real_keras()
    g = torch.Generator().manual_seed(3)
    y_pred, y_true = torch.randn(10, 3, generator=g), torch.randn(10, 3, generator=g)
    weights = torch.rand(10, generator=g)
    ours, theirs = build_loss(_per_sample), _keras_per_sample(keras)
    assert float(ours(y_pred, y_true)) == pytest.approx(float(theirs(y_true, y_pred)), rel=1e-6)
    assert float(ours(y_pred, y_true, weights)) == pytest.approx(
        float(theirs(y_true, y_pred, sample_weight=weights)), rel=1e-6)


def test_evaluate_with_sample_weights_equals_keras():
    keras = real_keras()
    x, y = _batch()
    weights = torch.rand(32, generator=torch.Generator().manual_seed(4))
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(optimizer="adam", loss=_keras_per_sample(keras))
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), sample_weight=weights.numpy(), batch_size=32, verbose=0)
    ours = Model(net).compile("adam", _per_sample).evaluate(x, y, sample_weight=weights, batch_size=32, verbose=0)
    assert ours == pytest.approx(theirs, rel=1e-5)  # no metrics: the loss alone, as Keras


def test_fitkit_order_stays_for_other_callables():
    seen = []

    def loss(outputs, targets):
        seen.append((outputs.shape, targets.dtype))
        return torch.nn.functional.cross_entropy(outputs, targets)

    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    Model(torch.nn.Linear(4, 3)).compile("adam", loss).evaluate(x, y, verbose=0)
    assert seen[-1] == (torch.Size([8, 3]), torch.int64)


# -- (N, 1) class indices, as Keras' sparse crossentropy squeezes them ------------------------------
def test_n_by_1_class_indices_give_keras_sparse_loss_and_accuracy():
    keras = real_keras()
    g = torch.Generator().manual_seed(3)
    x, y, w = torch.randn(37, 4, generator=g), torch.randint(0, 3, (37, 1), generator=g), torch.rand(37, generator=g)
    metrics = ["sparse_categorical_accuracy", "accuracy"]
    kmodel, net = twin_dense(keras, 4, 3)
    kmodel.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=metrics)
    model = Model(net).compile("sgd", "sparse_categorical_crossentropy", metrics=metrics, learning_rate=0.1)
    for weights in (None, w):  # (N,) class indices in a (N, 1) column, unweighted and weighted
        theirs = kmodel.evaluate(x.numpy(), y.numpy(), sample_weight=None if weights is None else weights.numpy(),
                                 batch_size=8, verbose=0, return_dict=True)
        ours = model.evaluate(x, y, sample_weight=weights, batch_size=8, verbose=0, return_dict=True)
        assert ours == pytest.approx(theirs, rel=1e-5)
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), **fit).history
    ours = model.fit(x, y, **fit).history
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key
    theirs_batch = kmodel.train_on_batch(x[:8].numpy(), y[:8].numpy(), return_dict=True)
    assert model.train_on_batch(x[:8], y[:8], return_dict=True) == pytest.approx(theirs_batch, rel=1e-5)


def test_the_pytorch_name_still_wants_one_index_per_sample():
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8, 1))
    with pytest.raises(ValueError, match=r"y.reshape\(-1\)"):
        Model(torch.nn.Linear(4, 3)).compile("sgd", "cross_entropy").fit(x, y, verbose=0)
