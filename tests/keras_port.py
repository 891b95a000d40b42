"""Shared pieces of the tests that re-express Keras 3's own callback tests with fitkit
(`tests/test_keras_*.py`): Keras-like data and models, and `differs`, the mark of a behaviour
fitkit keeps on purpose (its reason quotes the docs line that says so, which
`test_keras_logging.py::test_every_kept_difference_is_a_line_of_the_docs` checks)."""

import pytest
import torch

from fitkit import TrainerCallback

DOCS = "docs/callbacks.md"


def differs(line: str):
    """A strict xfail: the test states Keras' behaviour, which fitkit changes as `line` of
    docs/callbacks.md says."""
    return pytest.mark.xfail(strict=True, reason=f"{DOCS}: {line}")


def class_data(n, dim=3, classes=2, seed=0, one_hot=False):
    """`n` samples of `classes` Gaussian blobs in `dim` dimensions (as Keras' `get_test_data`)."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + 0.5 * torch.randn(n, dim, generator=g)
    return x, (torch.nn.functional.one_hot(y, classes).float() if one_hot else y)


def dense(*sizes, seed=0, activation=torch.nn.ReLU):
    """Keras' `Sequential([Dense(a, activation), ..., Dense(z)])` for inputs of `sizes[0]` features."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2 and activation is not None:
            layers.append(activation())
    return torch.nn.Sequential(*layers)


def huge_dense(dim=3, classes=2, depth=5, value=1e5):
    """Keras' NaN test model: `depth` ReLU Dense(2) layers with a constant kernel of `value`,
    then Dense(classes): the first loss overflows, and one step turns the weights NaN."""
    net = dense(dim, *[2] * depth, classes)
    with torch.no_grad():
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.fill_(value)
                layer.bias.zero_()
    return net


class Scripted(TrainerCallback):
    """Sets `key` in each record it sees (evaluation metrics with `on="evaluate"`, training logs
    with `on="log"`, epoch-end logs only) to the next scripted value, and keeps a copy of the
    weights at each value. With `mark_weights`, the module's parameters are first filled with
    the value's index, so a restored model tells which epoch it came from (Keras' DummyModel)."""

    def __init__(self, key, values, on="evaluate", mark_weights=False):
        self.key, self.values, self.on, self.mark_weights = key, list(values), on, mark_weights
        self.weights = []

    def _next(self, record, model):
        if self.key in record or self.on == "evaluate":
            index = len(self.weights)
            if self.mark_weights:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float(index))
            record[self.key] = self.values[index]
            self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        if self.on == "evaluate":
            self._next(metrics, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if self.on == "log" and "loss" in logs and float(state.epoch).is_integer():  # the epoch-end record
            self._next(logs, model)
