"""Compiled metrics in custom steps (Keras 3): `super().train_step(data)` keeps them,
`self.compute_metrics` updates and returns them, `self.metrics` lists them, and
`compute_loss` takes keywords. The guide "Customizing what happens in fit() with PyTorch",
first example, re-expressed."""

import pytest
import torch

from fitkit import Model, unpack_data


def _data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)


def _net():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


class ViaSuper(Model):
    def train_step(self, data):
        return super().train_step(data)

    def test_step(self, data):
        return super().test_step(data)


class GuideModel(Model):
    """The guide's first custom step: forward, compute_loss, backward, step, compute_metrics."""

    def train_step(self, data):
        x, y = data
        y_pred = self(x)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        self.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return self.compute_metrics(x, y, y_pred, sample_weight=None)


class MetricsLoop(Model):
    """The guide's other form: every entry of `self.metrics` updated, then their results."""

    def train_step(self, data):
        x, y, _ = unpack_data(data)
        y_pred = self(x)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred)
        self.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def _fit(cls, **kwargs):
    x, y = _data()
    model = cls(_net()).compile("sgd", "mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, **kwargs)
    return model, history


@pytest.mark.parametrize("cls", [ViaSuper, GuideModel, MetricsLoop])
def test_custom_steps_log_loss_and_compiled_metrics_as_the_plain_model(cls):
    _, plain = _fit(Model, validation_split=0.25)
    _, custom = _fit(cls, validation_split=0.25)
    assert set(plain.history) <= set(custom.history)
    for key in ("loss", "mae", "val_loss", "val_mae"):
        assert custom.history[key] == pytest.approx(plain.history[key], rel=1e-5), key


def test_evaluate_through_super_test_step_returns_the_compiled_metrics():
    x, y = _data()
    plain = Model(_net()).compile("sgd", "mse", metrics=["mae"]).evaluate(x, y, batch_size=16, verbose=0)
    custom = ViaSuper(_net()).compile("sgd", "mse", metrics=["mae"]).evaluate(x, y, batch_size=16, verbose=0)
    assert custom == pytest.approx(plain, rel=1e-6)


def test_metrics_outside_a_call_is_empty_and_compute_loss_takes_keywords():
    x, y = _data(8)
    model = Model(_net()).compile("sgd", "mse", metrics=["mae"])
    assert model.metrics == []
    loss = model.compute_loss(y=y, y_pred=model(x))
    assert float(loss) == pytest.approx(float(torch.nn.functional.mse_loss(model(x), y)))


def test_train_on_batch_with_compute_metrics_reports_the_batch():
    x, y = _data(16)
    model = GuideModel(_net()).compile("sgd", "mse", metrics=["mae"])
    mae = float((model(x) - y).abs().mean())
    logs = model.train_on_batch(x, y, return_dict=True)
    assert logs["mae"] == pytest.approx(mae, rel=1e-5) and "loss" in logs
