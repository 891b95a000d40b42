"""Small shared pieces for the tests."""

import torch

from fitkit import TrainerCallback
from fitkit.callbacks.base import EVENTS


def mlp(d_in=8, d_out=3, hidden=16, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out))


def blobs(n=32, seed=0):
    """`n` samples of a separable 3-class problem with 8 features."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, 8, generator=g) * 3
    y = torch.arange(n) % 3
    return centers[y] + torch.randn(n, 8, generator=g), y


class Pairs(torch.utils.data.Dataset):
    """A map-style dataset of `(x[i], y[i])` pairs."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Recorder(TrainerCallback):
    """Records every documented event it receives, with the global step."""

    def __init__(self):
        self.events = []
        self.kwargs = {}

    def _make(name):
        def handler(self, args, state, control, **kwargs):
            self.events.append(name)
            self.kwargs.setdefault(name, sorted(kwargs))

        handler.__name__ = name
        return handler

    for _name in EVENTS:
        locals()[_name] = _make(_name)
    del _name, _make


def training_records(log_history):
    """The log records of training itself: without the run's closing summary (its runtime and
    speed differ from run to run)."""
    return [r for r in log_history if "train_runtime" not in r]


class Script(TrainerCallback):
    """Replaces `key` in each evaluation's metrics by the next scripted value (order 0, so the
    monitors, which run later, see the scripted values)."""

    def __init__(self, key, values):
        self.key, self.values, self.i = key, list(values), 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics[self.key] = self.values[self.i]
        self.i += 1
