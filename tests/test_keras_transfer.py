"""Keras 3's transfer-learning guide (transfer_learning) beside real Keras 3 (torch backend), with a
base that holds BatchNorm: frozen (`requires_grad_(False)`, or Keras' `trainable = False` written on
the torch module), its new head trained, then fine-tuned unfrozen at a low rate after compiling
again. History, `val_*`, `evaluate` and the final weights, BatchNorm's running statistics included,
agree to 1e-5.

Measured on Keras 3 (torch backend): the guide's `base(inputs, training=False)` inside a functional
model does not keep the unfrozen base in inference mode during `fit` (the functional model hands
fit's `training=True` to every layer): its BatchNorm normalises with batch statistics and moves its
moving statistics in fine-tuning. The ports below match those numbers; the torch idiom for what the
guide means, a `train()` override that keeps the base in `eval()`, is honoured in every epoch (its
own test, against a hand-written loop)."""

import warnings

import numpy as np
import pytest
import torch
from keras_real import real_keras

from fitkit import Model

N, BATCH, FEATURES, HIDDEN = 40, 16, 6, 8


def _data(seed=4, n=N):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    return x, (x[:, :1] + 0.3 * x[:, 1:2] > 0).astype("float32")


class Net(torch.nn.Module):
    """The guide's model: `base` (Dense, BatchNorm, relu) then a new head; `keep_base_eval`: the
    port of `base(inputs, training=False)` (a `train()` override, counted)."""

    def __init__(self, keep_base_eval=False):
        super().__init__()
        torch.manual_seed(0)
        self.base = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN),
                                        torch.nn.BatchNorm1d(HIDDEN, eps=1e-3, momentum=0.01), torch.nn.ReLU())
        self.head = torch.nn.Linear(HIDDEN, 1)
        with torch.no_grad():  # statistics of a "pretrained" base, far from this data's
            self.base[1].running_mean.uniform_(-1, 1)
            self.base[1].running_var.uniform_(0.5, 2)
            self.base[1].weight.uniform_(0.5, 1.5)
            self.base[1].bias.uniform_(-0.5, 0.5)
        self.keep_base_eval = keep_base_eval
        self.train_calls: list[bool] = []

    def train(self, mode=True):
        self.__dict__.setdefault("train_calls", []).append(mode)
        super().train(mode)
        if self.keep_base_eval:
            self.base.eval()
        return self

    def forward(self, x):
        return self.head(self.base(x))


def _keras_twin(keras, net):
    base = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN),
                             keras.layers.BatchNormalization(momentum=0.99, epsilon=1e-3),
                             keras.layers.Activation("relu")])
    inputs = keras.Input((FEATURES,))
    kmodel = keras.Model(inputs, keras.layers.Dense(1)(base(inputs, training=False)))
    lin, bn = net.base[0], net.base[1]
    base.layers[0].set_weights([lin.weight.detach().T.numpy().copy(), lin.bias.detach().numpy().copy()])
    base.layers[1].set_weights([t.detach().numpy().copy() for t in (bn.weight, bn.bias, bn.running_mean,
                                                                      bn.running_var)])
    kmodel.layers[-1].set_weights([net.head.weight.detach().T.numpy().copy(), net.head.bias.detach().numpy().copy()])
    return kmodel, base


def _same_weights(net, kmodel, base, moved_var=False):
    """The weights and BatchNorm's statistics agree. `moved_var`: BatchNorm trained, and torch's
    layer updates its running variance with the batch's unbiased variance, Keras' with the biased
    one (a difference of the layers, not of fitkit): compared through that factor."""
    kernel, bias = base.layers[0].get_weights()
    gamma, beta, mean, var = base.layers[1].get_weights()
    head_kernel, head_bias = kmodel.layers[-1].get_weights()
    bn = net.base[1]
    pairs = [(net.base[0].weight.T, kernel), (net.base[0].bias, bias), (bn.weight, gamma), (bn.bias, beta),
             (bn.running_mean, mean), (net.head.weight.T, head_kernel), (net.head.bias, head_bias)]
    if moved_var:
        assert np.allclose(bn.running_var.numpy(), var, rtol=5e-3) and not np.allclose(bn.running_var.numpy(), var)
    else:
        pairs.append((bn.running_var, var))
    for ours, theirs in pairs:
        np.testing.assert_allclose(ours.detach().numpy(), theirs, rtol=1e-5, atol=1e-5)


def _same_history(ours, theirs):
    assert sorted(ours) == sorted(theirs)
    for key, values in theirs.items():
        assert np.allclose(ours[key], values, rtol=1e-5, atol=1e-6), (key, ours[key], values)


def _run_guide(keras, freeze):
    """The guide's two phases on both sides; `freeze(net)` freezes the torch base."""
    x, y = _data()
    x_val, y_val = _data(5, 24)
    net = Net()
    kmodel, base = _keras_twin(keras, net)
    klosses = dict(loss=keras.losses.BinaryCrossentropy(from_logits=True),
                   metrics=[keras.metrics.BinaryAccuracy()])
    options = dict(batch_size=BATCH, shuffle=False, verbose=0, validation_data=(x_val, y_val))
    stats = net.base[1].running_mean.clone()

    base.trainable = False
    kmodel.compile(optimizer=keras.optimizers.Adam(), **klosses)
    freeze(net)
    model = Model(net).compile("adam", "binary_crossentropy", metrics=[keras.metrics.BinaryAccuracy()])
    _same_history(model.fit(x, y, epochs=3, **options).history, kmodel.fit(x, y, epochs=3, **options).history)
    assert torch.equal(net.base[1].running_mean, stats)  # frozen BatchNorm: its statistics not moved
    _same_weights(net, kmodel, base)

    base.trainable = True
    kmodel.compile(optimizer=keras.optimizers.Adam(1e-4), **klosses)
    net.base.trainable = True
    net.base.requires_grad_(True)
    model.compile("adam", "binary_crossentropy", metrics=[keras.metrics.BinaryAccuracy()], learning_rate=1e-4)
    _same_history(model.fit(x, y, epochs=2, **options).history, kmodel.fit(x, y, epochs=2, **options).history)
    np.testing.assert_allclose(model.evaluate(x_val, y_val, verbose=0), kmodel.evaluate(x_val, y_val, verbose=0),
                               rtol=1e-5)
    _same_weights(net, kmodel, base, moved_var=True)
    assert not torch.equal(net.base[0].weight, torch.nn.Linear(FEATURES, HIDDEN).weight)  # trained in phase 2


def test_frozen_base_with_batchnorm_then_fine_tuning():
    """The natural torch port: `requires_grad_(False)` on the base."""
    _run_guide(real_keras(), lambda net: net.base.requires_grad_(False))


def test_trainable_flag_on_a_torch_module():
    """Keras' idiom written on the torch module: `net.base.trainable = False`."""
    def freeze(net):
        net.base.trainable = False

    _run_guide(real_keras(), freeze)


def test_frozen_batchnorm_without_a_train_override():
    """A frozen base whose BatchNorm nobody puts in eval mode: fitkit runs it in inference mode
    while its parameters are frozen, as Keras' frozen BatchNorm (training mode would move the
    running statistics and normalise with the batch's)."""
    keras = real_keras()
    x, y = _data()
    net = Net(keep_base_eval=False)
    kmodel, base = _keras_twin(keras, net)
    base.trainable = False
    kmodel.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    net.base.requires_grad_(False)
    model = Model(net).compile("adam", "binary_crossentropy")
    options = dict(batch_size=BATCH, shuffle=False, verbose=0)
    _same_history(model.fit(x, y, epochs=2, **options).history, kmodel.fit(x, y, epochs=2, **options).history)
    _same_weights(net, kmodel, base)
    assert net.base[1].training is False and net.head.training is True


def _hand_loop(net, x, y, x_val, epochs):
    """What fitkit's fit below does, written by hand: `net.train()` each epoch, Adam (Keras'
    defaults), `net.eval()` to validate."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    x, y, x_val = map(torch.from_numpy, (x, y, x_val))
    for _ in range(epochs):
        net.train()
        for lo in range(0, len(x), BATCH):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(net(x[lo:lo + BATCH]), y[lo:lo + BATCH])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            net(x_val)


def test_train_override_called_as_a_hand_loop_calls_it():
    """A network whose `train()` keeps its base in `eval()` (the torch port of the guide's
    `training=False`): `net.train()` once an epoch and `net.eval()` once an evaluation, as a
    hand-written loop calls them, the first epoch included (fitkit's shortcut never bypasses an
    override); the weights and BatchNorm's statistics end as the hand loop's."""
    x, y = _data()
    x_val, y_val = _data(5, 8)
    net, hand = Net(keep_base_eval=True), Net(keep_base_eval=True)
    net.train_calls.clear()
    hand.train_calls.clear()
    model = Model(net).compile(lambda params: torch.optim.Adam(params, lr=1e-3, eps=1e-7), "binary_crossentropy")
    seen = []
    hook = net.base[1].register_forward_pre_hook(lambda m, args: seen.append(m.training))
    model.fit(x, y, epochs=3, batch_size=BATCH, shuffle=False, verbose=0, validation_data=(x_val, y_val))
    hook.remove()
    _hand_loop(hand, x, y, x_val, epochs=3)
    assert net.train_calls == hand.train_calls == [True, False] * 3
    assert len(seen) > 9 and not any(seen)  # BatchNorm in eval mode in every batch, the first epoch's too
    for ours, theirs in zip(net.state_dict().values(), hand.state_dict().values()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_unfreezing_without_compiling_again_warns():
    """Keras 3 warns when `trainable` changed since compile (the compiled optimizer goes on);
    fitkit warns the same and names the fix."""
    x, y = _data()
    net = Net()
    net.base.requires_grad_(False)
    model = Model(net).compile("adam", "binary_crossentropy")
    model.fit(x, y, epochs=1, batch_size=BATCH, verbose=0)
    net.base.requires_grad_(True)
    with pytest.warns(UserWarning, match=r"since `compile`.*call `compile\(\.\.\.\)` again"):
        model.fit(x, y, epochs=1, batch_size=BATCH, verbose=0)
    model.compile("adam", "binary_crossentropy", learning_rate=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, y, epochs=1, batch_size=BATCH, verbose=0)


def test_sequential_guide_freezing_all_layers_but_the_last():
    """The Sequential-model guide's "transfer learning" recipe: `for layer in model.layers[:-1]:
    layer.trainable = False`, written on the torch `Sequential`'s layers as in Keras."""
    keras = real_keras()
    x, y = _data()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.BatchNorm1d(HIDDEN, eps=1e-3, momentum=0.01),
                              torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))
    with torch.no_grad():
        net[1].running_mean.uniform_(-1, 1)
    kmodel = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN),
                               keras.layers.BatchNormalization(momentum=0.99, epsilon=1e-3),
                               keras.layers.Activation("relu"), keras.layers.Dense(1)])
    kmodel.layers[0].set_weights([net[0].weight.detach().T.numpy().copy(), net[0].bias.detach().numpy().copy()])
    kmodel.layers[1].set_weights([t.detach().numpy().copy() for t in (net[1].weight, net[1].bias,
                                                                        net[1].running_mean, net[1].running_var)])
    kmodel.layers[3].set_weights([net[3].weight.detach().T.numpy().copy(), net[3].bias.detach().numpy().copy()])
    for layer in kmodel.layers[:-1]:
        layer.trainable = False
    for layer in net[:-1]:
        layer.trainable = False
    kmodel.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    model = Model(net).compile("adam", "binary_crossentropy")
    options = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    _same_history(model.fit(x, y, **options).history, kmodel.fit(x, y, **options).history)
    ours = [net[0].weight.T, net[0].bias, net[1].weight, net[1].bias, net[1].running_mean, net[1].running_var,
            net[3].weight.T, net[3].bias]
    theirs = [w for i in (0, 1, 3) for w in kmodel.layers[i].get_weights()]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.detach().numpy(), b, rtol=1e-5, atol=1e-5)


def test_a_trainer_run_trains_a_frozen_parts_batchnorm_as_the_hf_trainer(tmp_path):
    """The Hugging Face face keeps the HF Trainer's habit: `model.train()` puts every BatchNorm in
    training mode, frozen or not, and freezing after `compile` draws no Keras warning."""
    x, y = _data()
    net = Net()
    stats = net.base[1].running_mean.clone()
    model = Model(net).compile("adam", "binary_crossentropy")
    net.base.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.fit(x, y, epochs=1, batch_size=BATCH, verbose=0, hf_trainer=True, output_dir=str(tmp_path),
                  save_strategy="no")
    assert net.base[1].training and not torch.equal(net.base[1].running_mean, stats)
