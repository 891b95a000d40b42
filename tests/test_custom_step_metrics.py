"""Compiled metrics in custom steps (Keras 3): `super().train_step(data)` keeps them,
`self.compute_metrics` updates and returns them, `self.metrics` lists them, and
`compute_loss` takes keywords. The guide "Customizing what happens in fit() with PyTorch",
first example, re-expressed."""

import pytest
import torch
from keras_real import keras_weights, real_keras, twin_dense

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


# -- trackers in custom steps, beside real Keras 3 (the guide's "going lower-level" and GAN) -------

def _partial_data():
    """70 samples: batches of 16 leave a partial last batch of 6, where weighting matters."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70, 4, generator=g)
    return x, x.sum(-1, keepdim=True), torch.rand(70, 1, generator=g)


def _keras_apply(model, loss, weights):
    """The guide's torch-backend update: backward, then the Keras optimizer applies the grads."""
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        model.optimizer.apply([w.value.grad for w in weights], weights)


def _keras_guide(keras, inner):
    """The guide's model, in Keras: a `Mean` loss tracker and a `MeanAbsoluteError`, listed."""

    class KerasGuide(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = inner
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

        def call(self, x):
            return self.inner(x)

        def train_step(self, data):
            x, y = data
            y_pred = self(x, training=True)
            loss = torch.nn.functional.mse_loss(y_pred, y)
            _keras_apply(self, loss, list(self.trainable_weights))
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            self.loss_tracker.update_state(torch.nn.functional.mse_loss(y_pred, y))
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

    return KerasGuide()


def test_the_guides_loss_tracker_and_metric_objects_give_keras_values_per_epoch():
    keras = real_keras()
    x, y, _ = _partial_data()
    kinner, net = twin_dense(keras, 4, 1)

    class Guide(Model):
        def __init__(self, module):
            super().__init__(module)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

        def train_step(self, data):
            x, y = data
            y_pred = self(x)
            loss = torch.nn.functional.mse_loss(y_pred, y)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        def test_step(self, data):
            x, y = data
            y_pred = self(x)
            self.loss_tracker.update_state(torch.nn.functional.mse_loss(y_pred, y))
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

    kmodel = _keras_guide(keras, kinner)
    kmodel.compile(keras.optimizers.SGD(0.01))
    model = Guide(net).compile("sgd", learning_rate=0.01)
    fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), **fit).history
    ours = model.fit(x, y, **fit).history
    assert sorted(ours) == sorted(theirs) == ["loss", "mae"]
    for key, values in theirs.items():  # reset at each epoch, each step's loss counted once
        assert ours[key] == pytest.approx(values, rel=1e-5), key
    theirs_eval = kmodel.evaluate(x.numpy(), y.numpy(), batch_size=16, verbose=0, return_dict=True)
    ours_eval = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    assert ours_eval == pytest.approx(theirs_eval, rel=1e-5)  # reset before evaluating, as Keras


def test_the_guides_metrics_loop_with_n_by_1_sample_weights_gives_keras_values():
    """The guide's "supporting sample_weight" step: `compute_loss` with `(N, 1)` weights, then
    every entry of `self.metrics` updated (the loss tracker unweighted by batch size)."""
    keras = real_keras()
    x, y, weights = _partial_data()
    kinner, net = twin_dense(keras, 4, 1)

    class KerasWeighted(keras.Model):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def call(self, x):
            return self.inner(x)

        def train_step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            _keras_apply(self, loss, list(self.trainable_weights))
            for metric in self.metrics:
                metric.update_state(loss)
            return {m.name: m.result() for m in self.metrics}

    class Weighted(Model):
        def train_step(self, data):
            x, y, sample_weight = unpack_data(data)
            y_pred = self(x)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            for metric in self.metrics:
                metric.update_state(loss)
            return {m.name: m.result() for m in self.metrics}

    kmodel = KerasWeighted(kinner)
    kmodel.compile(keras.optimizers.SGD(0.01), loss="mse")
    model = Weighted(net).compile("sgd", "mse", learning_rate=0.01)
    fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), sample_weight=weights.numpy(), **fit).history
    ours = model.fit(x, y, sample_weight=weights, **fit).history
    assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
    kernel, bias = keras_weights(kinner)
    torch.testing.assert_close(net.weight.detach(), kernel, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(net.bias.detach(), bias, rtol=1e-5, atol=1e-6)


def test_the_gan_examples_two_trackers_give_keras_values_per_epoch():
    """The GAN example's shape: two sub-networks, two optimizers of the step's own, a `d_loss`
    and a `g_loss` tracker held as attributes (Keras tracks them without a `metrics` property);
    the latent points come from the batch so both libraries see the same ones."""
    keras = real_keras()
    real = 3 + 0.5 * torch.randn(70, 1, generator=torch.Generator().manual_seed(1))
    kgen, gen = twin_dense(keras, 2, 1, seed=1)
    kdisc, disc = twin_dense(keras, 1, 1, seed=2)
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def latent(batch):
        return torch.cat([batch.sin(), batch.cos()], -1)

    def labels(n):
        return torch.cat([torch.ones(n, 1), torch.zeros(n, 1)])

    class KerasGAN(keras.Model):
        def __init__(self):
            super().__init__()
            self.generator, self.discriminator = kgen, kdisc
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.d_optimizer, self.g_optimizer = keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05)
            self.built = True  # as the guide's GAN: its parts are built

        def train_step(self, data):
            real = data[0] if isinstance(data, tuple) else data
            n = real.shape[0]
            fake = self.generator(latent(real)).detach()
            d_loss = bce(self.discriminator(torch.cat([fake, real])), labels(n))
            self.zero_grad()
            d_loss.backward()
            weights = list(self.discriminator.trainable_weights)
            with torch.no_grad():
                self.d_optimizer.apply([w.value.grad for w in weights], weights)
            g_loss = bce(self.discriminator(self.generator(latent(real))), torch.zeros(n, 1))
            self.zero_grad()
            g_loss.backward()
            weights = list(self.generator.trainable_weights)
            with torch.no_grad():
                self.g_optimizer.apply([w.value.grad for w in weights], weights)
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    class GAN(Model):
        def __init__(self):
            super().__init__(torch.nn.ModuleDict({"generator": gen, "discriminator": disc}))
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.d_optimizer = torch.optim.SGD(disc.parameters(), lr=0.05)
            self.g_optimizer = torch.optim.SGD(gen.parameters(), lr=0.05)

        def train_step(self, data):
            real, _, _ = unpack_data(data)
            nets, n = self.module, len(real)
            fake = nets.generator(latent(real)).detach()
            d_loss = bce(nets.discriminator(torch.cat([fake, real])), labels(n))
            self.d_optimizer.zero_grad()
            self.backward(d_loss)
            self.d_optimizer.step()
            g_loss = bce(nets.discriminator(nets.generator(latent(real))), torch.zeros(n, 1))
            self.g_optimizer.zero_grad()
            self.backward(g_loss)
            self.g_optimizer.step()
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    kmodel = KerasGAN()
    kmodel.compile()
    fit = dict(batch_size=16, epochs=3, shuffle=False, verbose=0)
    theirs = kmodel.fit(real.numpy(), **fit).history
    ours = GAN().compile(loss=None).fit(real, **fit).history
    assert sorted(ours) == sorted(theirs) == ["d_loss", "g_loss"]
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key


def test_metrics_that_is_not_a_list_of_metric_objects_fails_clearly():
    class Odd(Model):
        @property
        def metrics(self):
            return ["loss"]

        def train_step(self, data):
            return {}

    x, y = _data(8)
    with pytest.raises(TypeError, match=r"`metrics` lists 'loss'.*reset_state"):
        Odd(_net()).compile("sgd", "mse").fit(x, y, verbose=0)


# -- trackers and the one-batch calls, and a tracker the model does not hold, beside Keras ---------
def _tracked_pair(keras, tracker_of):
    """A Keras model and a fitkit one whose steps update `tracker_of(model)` with the batch's MSE
    and return its result under the tracker's name."""
    kinner, net = twin_dense(keras, 4, 1)

    def keras_step(model, data, train):
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        loss = torch.nn.functional.mse_loss(model(x, training=train), y)
        if train:
            _keras_apply(model, loss, list(model.trainable_weights))
        tracker = tracker_of(model)
        tracker.update_state(loss)
        return {tracker.name: tracker.result()}

    def fitkit_step(model, data, train):
        x, y, _ = unpack_data(data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if train:
            model.backward(loss)
            model.optimizer.step()
            model.optimizer.zero_grad()
        tracker = tracker_of(model)
        tracker.update_state(loss)
        return {tracker.name: tracker.result()}

    class KerasTracked(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner, self.tracker = kinner, keras.metrics.Mean(name="loss")

        def call(self, x):
            return self.inner(x)

        def train_step(self, data):
            return keras_step(self, data, True)

        def test_step(self, data):
            return keras_step(self, data, False)

    class Tracked(Model):
        def __init__(self):
            super().__init__(net)
            self.tracker = keras.metrics.Mean(name="loss")

        def train_step(self, data):
            return fitkit_step(self, data, True)

        def test_step(self, data):
            return fitkit_step(self, data, False)

    kmodel = KerasTracked()
    kmodel.compile(keras.optimizers.SGD(0.01))
    return kmodel, Tracked().compile("sgd", learning_rate=0.01)


def test_train_and_test_on_batch_reset_the_models_trackers_as_keras():
    keras = real_keras()
    x, y, _ = _partial_data()
    kmodel, model = _tracked_pair(keras, lambda m: m.tracker)
    for call in ("train_on_batch", "test_on_batch", "train_on_batch"):
        for batch in (slice(0, 8), slice(8, 24)):  # each call reports its batch alone: reset before it
            theirs = getattr(kmodel, call)(x[batch], y[batch], return_dict=True)
            ours = getattr(model, call)(x[batch], y[batch], return_dict=True)
            assert ours == pytest.approx(theirs, rel=1e-5), call
    assert float(model.tracker.count) == float(kmodel.tracker.count) == 1  # reset once more before the last batch


def test_a_tracker_the_model_does_not_hold_is_reset_by_neither_library():
    keras = real_keras()
    x, y, _ = _partial_data()
    outside = {"keras": keras.metrics.Mean(name="running"), "fitkit": keras.metrics.Mean(name="running")}
    kmodel, model = _tracked_pair(keras, lambda m: outside["keras" if isinstance(m, keras.Model) else "fitkit"])
    fit = dict(batch_size=16, epochs=2, shuffle=False, verbose=0)
    kmodel.fit(x.numpy(), y.numpy(), **fit)
    model.fit(x, y, **fit)
    assert float(outside["fitkit"].count) == float(outside["keras"].count) == 10  # every step of both epochs
    for call in ("train_on_batch", "test_on_batch"):
        theirs = getattr(kmodel, call)(x[:8], y[:8], return_dict=True)
        assert getattr(model, call)(x[:8], y[:8], return_dict=True) == pytest.approx(theirs, rel=1e-5)
    assert float(outside["fitkit"].result()) == pytest.approx(float(outside["keras"].result()), rel=1e-5)
