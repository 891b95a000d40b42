"""Sample weights of every shape Keras 3 accepts, beside real Keras 3 (torch backend) on the same
initial weights and data order (`shuffle=False`): `(N,)` and `(N, 1)` arrays, per output, from a
DataLoader and in a custom `train_step`; the same losses per epoch and the same weights after
training. Also `class_weight` errors."""

import numpy as np
import pytest
import torch
from keras_real import keras_weights, real_keras, twin_dense
from test_keras_multi_io import _data as two_head_data
from test_keras_multi_io import _twins as two_head_twins

from fitkit import Model
from fitkit.adapters.losses import reduce_loss

N, BATCH, EPOCHS = 20, 8, 2  # the last batch of each epoch is partial


def _regression():
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(N, 4, generator=g), torch.randn(N, 1, generator=g)
    return x, y, torch.rand(N, generator=g) * 2


def _keras_fit(keras, x, y, weights, loss="mse"):
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(optimizer="sgd", loss=loss)
    history = kmodel.fit(x.numpy(), y.numpy(), sample_weight=weights.numpy(), batch_size=BATCH, epochs=EPOCHS,
                         shuffle=False, verbose=0).history
    return history, keras_weights(kmodel), net


def _same_weights(net, theirs):
    torch.testing.assert_close(net.weight.detach(), theirs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(net.bias.detach(), theirs[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", ["(N,)", "(N, 1)"])
def test_fit_with_sample_weights_of_either_shape_equals_keras(shape):
    keras = real_keras()
    x, y, w = _regression()
    w = w if shape == "(N,)" else w[:, None]
    theirs, kweights, net = _keras_fit(keras, x, y, w)
    ours = Model(net).compile("sgd", "mse").fit(x, y, sample_weight=w, batch_size=BATCH, epochs=EPOCHS,
                                               shuffle=False, verbose=0).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    _same_weights(net, kweights)


def test_a_dataloader_yielding_column_weights_equals_keras():
    keras = real_keras()
    x, y, w = _regression()
    theirs, kweights, net = _keras_fit(keras, x, y, w[:, None])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y, w[:, None]), batch_size=BATCH)
    ours = Model(net).compile("sgd", "mse").fit(loader, epochs=EPOCHS, verbose=0).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    _same_weights(net, kweights)


def test_a_custom_train_step_with_column_weights_equals_keras():
    """The guide's custom `train_step` unpacking `(x, y, sample_weight)`; the weights reach the
    compiled loss through `compute_loss`, as Keras' do."""
    keras = real_keras()
    x, y, w = _regression()
    theirs, kweights, net = _keras_fit(keras, x, y, w[:, None])

    class Custom(Model):
        def train_step(self, data):
            x, y, sample_weight = data
            y_pred = self(x)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return self.compute_metrics(x, y, y_pred, sample_weight)

    ours = Custom(net).compile("sgd", "mse").fit(x, y, sample_weight=w[:, None], batch_size=BATCH, epochs=EPOCHS,
                                                shuffle=False, verbose=0).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    _same_weights(net, kweights)


def test_a_keras_order_loss_with_column_weights_equals_keras():
    keras = real_keras()
    x, y, w = _regression()

    def per_sample_mae(y_true, y_pred):
        return torch.mean(torch.abs(y_true - y_pred), dim=-1)

    theirs, kweights, net = _keras_fit(keras, x, y, w[:, None], loss="mae")
    ours = Model(net).compile("sgd", per_sample_mae).fit(x, y, sample_weight=w[:, None], batch_size=BATCH,
                                                         epochs=EPOCHS, shuffle=False, verbose=0).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    _same_weights(net, kweights)


def test_per_output_column_weights_equal_keras():
    keras = real_keras()
    xa, xb, ys, yc = two_head_data()
    rng = np.random.default_rng(3)
    ws, wc = rng.uniform(0, 2, size=(len(xa), 1)).astype("float32"), rng.uniform(0, 2, size=(len(xa), 1)).astype("float32")
    kmodel, model = two_head_twins(keras)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kmodel.compile(keras.optimizers.SGD(0.1), loss={"score": "mse", "cls": sce})
    model.compile("sgd", loss={"score": "mse", "cls": "sparse_categorical_crossentropy"}, learning_rate=0.1)
    data = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    theirs = kmodel.fit([xa, xb], {"score": ys, "cls": yc}, sample_weight={"score": ws, "cls": wc}, **data).history
    ours = model.fit([xa, xb], {"score": ys, "cls": yc}, sample_weight={"score": ws, "cls": wc}, **data).history
    for key in theirs:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5), key


def test_reduce_loss_matches_keras_for_every_weight_shape():
    real_keras()
    g = torch.Generator().manual_seed(1)
    per_sample, per_step = torch.rand(6, generator=g), torch.rand(6, 5, generator=g)
    cases = [(per_sample, torch.rand(6, generator=g)), (per_sample, torch.rand(6, 1, generator=g)),
             (per_step, torch.rand(6, 5, generator=g)), (per_step, torch.rand(6, 5, 1, generator=g)),
             (per_sample[:, None], torch.rand(6, generator=g))]
    from keras.src.losses.loss import reduce_weighted_values
    for values, weight in cases:
        theirs = float(reduce_weighted_values(values, weight))
        assert float(reduce_loss(values, weight)) == pytest.approx(theirs, rel=1e-6), (values.shape, weight.shape)


def test_class_weight_keyed_by_output_name_is_refused_clearly():
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    model = Model(torch.nn.Linear(4, 2)).compile("sgd", "cross_entropy")
    with pytest.raises(ValueError, match=r"class_weight.*class indices.*'class_output'.*sample_weight"):
        model.fit(x, y, class_weight={"class_output": {0: 1.0, 1: 2.0}}, verbose=0)
    with pytest.raises(ValueError, match=r"class_weight.*number.*'heavy'"):
        model.fit(x, y, class_weight={0: "heavy"}, verbose=0)


def test_class_weight_on_column_targets_weighs_by_class_as_keras():
    """Binary targets of shape (N, 1), as Keras' guides give them: the class is the value, not
    the argmax of one column (which would be class 0 for every sample)."""
    keras = real_keras()
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(N, 4, generator=g), (torch.rand(N, 1, generator=g) > 0.5).float()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
    theirs = kmodel.fit(x.numpy(), y.numpy(), class_weight={0: 1.0, 1: 3.0}, batch_size=BATCH, epochs=EPOCHS,
                        shuffle=False, verbose=0).history
    ours = Model(net).compile("sgd", "binary_crossentropy").fit(x, y, class_weight={0: 1.0, 1: 3.0}, batch_size=BATCH,
                                                                epochs=EPOCHS, shuffle=False, verbose=0).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    _same_weights(net, keras_weights(kmodel))
