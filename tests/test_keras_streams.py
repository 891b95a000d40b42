"""`steps_per_epoch` over a stream, beside real Keras 3 (torch backend) from the same weights: the
built-in-methods guide's case, a stream that repeats, is read on across epochs as Keras' epoch
iterator reads it (not restarted each epoch); a one-shot generator runs with `steps_per_epoch`;
a stream that ends before `steps_per_epoch * epochs` batches stops training with a warning that
names the fix, and a generator without `steps_per_epoch` is refused naming it."""

import logging

import numpy as np
import pytest
import torch
from keras_real import keras_weights, real_keras, twin_dense

from fitkit import Model

N, BATCH, STEPS, EPOCHS = 100, 10, 4, 3  # 4 of the 10 batches an epoch: the stream goes on


def _arrays():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, 3)).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5]], dtype="float32") + 0.1


def _batches(x, y, tensors, repeat=True, limit=None):
    """The stream's batches in order (numpy for Keras, torch for fitkit), again from the start
    after the last when `repeat`, at most `limit` of them."""
    count = 0
    while True:
        for lo in range(0, N, BATCH):
            if limit is not None and count == limit:
                return
            count += 1
            xb, yb = x[lo:lo + BATCH], y[lo:lo + BATCH]
            yield (torch.from_numpy(xb), torch.from_numpy(yb)) if tensors else (xb, yb)
        if not repeat:
            return


class Repeating(torch.utils.data.IterableDataset):
    """A stream that repeats without end (a torch IterableDataset): re-iterable, no length."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return _batches(self.x, self.y, tensors=True)


def _twins(keras):
    kmodel, net = twin_dense(keras, 3, 1)
    kmodel.compile(keras.optimizers.SGD(0.05), loss="mse")
    return kmodel, Model(net).compile("sgd", "mse", learning_rate=0.05), net


def _same(ours, theirs, kmodel, net):
    assert ours.history["loss"] == pytest.approx(theirs.history["loss"], rel=1e-5)
    weight, bias = keras_weights(kmodel)
    torch.testing.assert_close(net.weight.detach(), weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(net.bias.detach(), bias, rtol=1e-5, atol=1e-6)


def test_a_one_shot_generator_is_read_on_across_epochs():
    keras = real_keras()
    x, y = _arrays()
    kmodel, model, net = _twins(keras)
    options = dict(epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    theirs = kmodel.fit(_batches(x, y, tensors=False), **options)
    ours = model.fit(_batches(x, y, tensors=True), **options)
    _same(ours, theirs, kmodel, net)


def test_a_repeating_stream_continues_instead_of_restarting():
    """A re-iterable stream (a DataLoader over an IterableDataset that repeats): epoch 2 trains on
    batches 5-8, not on batches 1-4 again."""
    keras = real_keras()
    x, y = _arrays()
    kmodel, model, net = _twins(keras)
    options = dict(epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    theirs = kmodel.fit(_batches(x, y, tensors=False), **options)
    ours = model.fit(torch.utils.data.DataLoader(Repeating(x, y), batch_size=None), **options)
    _same(ours, theirs, kmodel, net)
    seen = []
    restarted = Model(torch.nn.Linear(3, 1)).compile("sgd", "mse")
    restarted.module.register_forward_pre_hook(lambda m, args: seen.append(float(args[0][0, 0])))
    restarted.fit(torch.utils.data.DataLoader(Repeating(x, y), batch_size=None), **options)
    firsts = [float(x[lo, 0]) for lo in range(0, N, BATCH)]
    assert seen[:EPOCHS * STEPS] == pytest.approx((firsts * 2)[:EPOCHS * STEPS])


def test_a_stream_that_runs_out_stops_training_naming_the_fix(caplog):
    x, y = _arrays()
    model = Model(torch.nn.Linear(3, 1)).compile("sgd", "mse")
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        history = model.fit(_batches(x, y, tensors=True, limit=6), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    assert len(history.history["loss"]) == 2 and model.state.global_step == 6
    assert "ran out" in caplog.text and "steps_per_epoch * epochs" in caplog.text


def test_a_generator_without_steps_per_epoch_is_refused_naming_it():
    x, y = _arrays()
    model = Model(torch.nn.Linear(3, 1)).compile("sgd", "mse")
    with pytest.raises(TypeError, match="one-shot iterator.*pass `steps_per_epoch`"):
        model.fit(_batches(x, y, tensors=True), epochs=2, verbose=0)
