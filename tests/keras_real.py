"""Real Keras 3 (torch backend) beside fitkit, for the tests that compare values with it:
`real_keras()` skips the test when Keras 3 is not importable; `twin_dense` builds the same Dense
model in both with the same weights."""

import os

import pytest
import torch


def real_keras():
    """The `keras` package on the torch backend, or skip."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3.") or keras.backend.backend() != "torch":
        pytest.skip(f"needs Keras 3 on the torch backend (found {keras.__version__} on {keras.backend.backend()})")
    return keras


def twin_dense(keras, n_in, n_out, seed=0, activation=None):
    """`(keras_model, torch_module)`: `Dense(n_out)` on `n_in` features in both, same weights."""
    kmodel = keras.Sequential([keras.Input((n_in,)), keras.layers.Dense(n_out, activation=activation)])
    torch.manual_seed(seed)
    net = torch.nn.Linear(n_in, n_out)
    kmodel.set_weights([net.weight.detach().T.numpy().copy(), net.bias.detach().numpy().copy()])
    return kmodel, net


def keras_weights(kmodel):
    """The Dense layer's `(weight, bias)` in torch's layout."""
    kernel, bias = kmodel.get_weights()
    return torch.from_numpy(kernel.T.copy()), torch.from_numpy(bias.copy())
