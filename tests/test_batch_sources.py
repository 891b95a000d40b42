"""Batch-centric sources, Keras' `PyDataset` shape: an object whose `__getitem__` returns whole
batches (NumPy or tensors), and a plain list of NumPy `(x, y)` batches, train like arrays do."""

import numpy as np
import pytest
import torch

from fitkit import Model


class Batches:
    """`keras.utils.PyDataset`'s protocol: `__len__` batches, `__getitem__(i)` one whole batch."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.reads: list[int] = []

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, i: int):
        self.reads.append(i)
        part = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.x[part], self.y[part]


def _data(n=24):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, size=n)


def _model(seed=0):
    torch.manual_seed(seed)
    return Model(torch.nn.Linear(4, 3)).compile("sgd", "cross_entropy", metrics=["accuracy"])


def test_a_pydataset_like_source_trains_as_the_same_arrays_do():
    x, y = _data()
    source = Batches(x, y, batch_size=8)
    by_batches = _model().fit(source, epochs=2, shuffle=False, verbose=0)
    by_arrays = _model().fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
    # each batch read once an epoch, in order: the first-batch checks read the run's own first batch
    assert source.reads == [0, 1, 2, 0, 1, 2]
    assert by_batches.history["loss"] == pytest.approx(by_arrays.history["loss"], rel=1e-6)
    assert by_batches.history["accuracy"] == pytest.approx(by_arrays.history["accuracy"])


def test_shuffle_reads_a_pydatasets_batches_in_a_new_order_each_epoch_as_keras():
    """Keras' `shuffle=True` shuffles a PyDataset's batch order; validation stays in order, and
    the same seed gives the same orders."""
    x, y = _data(48)
    reads = []
    for _ in range(2):
        train, val = Batches(x, y, batch_size=6), Batches(x[:12], y[:12], batch_size=6)
        _model().fit(train, validation_data=val, epochs=3, shuffle=True, seed=5, verbose=0)
        passes = [train.reads[8 * e:8 * (e + 1)] for e in range(3)]  # (the checks read no batch of their own)
        assert all(sorted(p) == list(range(8)) for p in passes)  # each batch once a pass
        assert passes[0] != list(range(8)) and len({tuple(p) for p in passes}) == 3
        assert val.reads[-2:] == [0, 1]
        reads.append(train.reads)
    assert reads[0] == reads[1]


def test_a_list_of_numpy_batches_trains_and_evaluates():
    x, y = _data()
    batches = [(x[i:i + 6], y[i:i + 6]) for i in range(0, 24, 6)]
    model = _model()
    history = model.fit(batches, epochs=1, shuffle=False, verbose=0)
    reference = _model().fit(x, y, epochs=1, batch_size=6, shuffle=False, verbose=0)
    assert history.history["loss"] == pytest.approx(reference.history["loss"], rel=1e-6)
    assert set(model.evaluate(batches, verbose=0, return_dict=True)) == {"loss", "accuracy"}
    listed = _model().fit(batches, epochs=1, verbose=0)  # shuffle=True: a list is still read as listed
    assert listed.history["loss"] == pytest.approx(reference.history["loss"], rel=1e-6)


def test_a_batch_of_an_unsupported_type_is_a_clear_error():
    with pytest.raises((TypeError, ValueError), match=r"(?i)batch"):
        _model().fit([("not", "arrays")], epochs=1, verbose=0)


def test_a_users_keras_pydataset_subclass_trains_and_validates_as_in_keras():
    """A `keras.utils.PyDataset` subclass of the test's own (its module is not Keras'): read by
    `num_batches`, its epoch hooks paired, the same values as real Keras gives."""
    from keras_real import real_keras, twin_dense

    keras = real_keras()

    class Sequence(keras.utils.PyDataset):
        def __init__(self, x, y, batch_size):
            super().__init__()
            self.x, self.y, self.batch_size = x, y, batch_size
            self.begun = self.ended = 0

        def __len__(self):
            return -(-len(self.x) // self.batch_size)

        def __getitem__(self, i):
            part = slice(i * self.batch_size, (i + 1) * self.batch_size)
            return self.x[part], self.y[part]

        def on_epoch_begin(self):
            self.begun += 1

        def on_epoch_end(self):
            self.ended += 1

    rng = np.random.default_rng(0)
    x = rng.normal(size=(70, 4)).astype(np.float32)
    y = x.sum(-1, keepdims=True)
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile(keras.optimizers.SGD(0.01), "mse", metrics=["mae"])
    model = Model(net).compile("sgd", "mse", learning_rate=0.01, metrics=["mae"])
    fit = dict(epochs=2, shuffle=False, verbose=0)
    theirs = kmodel.fit(Sequence(x, y, 16), validation_data=Sequence(x[:30], y[:30], 16), **fit).history
    train, val = Sequence(x, y, 16), Sequence(x[:30], y[:30], 16)
    ours = model.fit(train, validation_data=val, **fit).history
    assert sorted(ours) == sorted(theirs)
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key
    assert train.begun == train.ended >= 2 and val.begun == val.ended >= 2
