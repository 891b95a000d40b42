"""Keras 3's metric names: accepted, logged under the name given, with Keras' values on the same
predictions (a Keras model ending in sigmoid / softmax beside the same fitkit module returning
logits, as fitkit's losses take them), checked against real Keras 3."""

import pytest
import torch
from keras_real import real_keras, twin_dense

from fitkit import Model

N = 64


def _data(kind):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, 6, generator=g)
    if kind == "binary":
        return x, (x[:, 0] + 0.5 * torch.randn(N, generator=g) > 0).float()[:, None]
    if kind == "regression":
        return x, torch.randn(N, 2, generator=g)
    labels = (x.argmax(-1) + torch.randint(0, 2, (N,), generator=g)) % 7
    return x, labels if kind == "sparse" else torch.nn.functional.one_hot(labels, 7).float()


# (metric names, data kind, Keras loss, fitkit loss, Keras activation, output units)
CASES = [
    (["binary_accuracy", "auc"], "binary", "binary_crossentropy", "binary_crossentropy", "sigmoid", 1),
    (["sparse_categorical_accuracy"], "sparse", "sparse_categorical_crossentropy", "sparse_categorical_crossentropy",
     "softmax", 7),
    (["categorical_accuracy", "top_k_categorical_accuracy"], "onehot", "categorical_crossentropy",
     "categorical_crossentropy", "softmax", 7),
    (["mean_absolute_error", "mean_squared_error"], "regression", "mse", "mse", None, 2),
]


@pytest.mark.parametrize("names, kind, kloss, floss, activation, units", CASES, ids=[c[1] for c in CASES])
def test_keras_metric_names_log_keras_values(names, kind, kloss, floss, activation, units):
    keras = real_keras()
    x, y = _data(kind)
    kmodel, net = twin_dense(keras, 6, units, activation=activation)
    kmodel.compile(optimizer="adam", loss=kloss, metrics=names)
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), batch_size=16, verbose=0, return_dict=True)
    ours = Model(net).compile("adam", floss, metrics=names).evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert set(ours) == set(theirs)  # logged under the names Keras logs
    for name in theirs:
        # Keras' AUC interpolates over 200 thresholds; torchmetrics' binned AUROC on the same bins
        assert ours[name] == pytest.approx(theirs[name], rel=1e-4 if name != "auc" else 5e-3), name


def test_keras_names_in_fit_history_keep_the_name_given():
    x, y = _data("sparse")
    model = Model(torch.nn.Linear(6, 7)).compile("adam", "cross_entropy", metrics=["sparse_categorical_accuracy"])
    history = model.fit(x, y, epochs=1, batch_size=16, validation_split=0.25, verbose=0)
    assert {"sparse_categorical_accuracy", "val_sparse_categorical_accuracy"} <= set(history.history)
