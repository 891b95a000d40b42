"""`evaluate` as Keras 3 returns it, beside real Keras 3 (torch backend) on the same weights:
the loss alone, or a list whose values and order are Keras' (`return_dict=False`, the default),
for one output and for two outputs with per-output losses and metrics; `metrics_names` pairs
with that list (`dict(zip(model.metrics_names, values))`, the guides' idiom); `return_dict=True`
gives Keras' dict."""

import numpy as np
import pytest
import torch
from keras_real import real_keras, twin_dense
from test_keras_multi_io import _data as two_head_data
from test_keras_multi_io import _twins as two_head_twins

from fitkit import Model

N = 24


def _regression():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N, 4, generator=g)
    return x.numpy(), (x.sum(-1, keepdim=True) + torch.randn(N, 1, generator=g)).numpy()


def _same_list(ours, theirs):
    assert isinstance(ours, list) and len(ours) == len(theirs), (ours, theirs)
    assert np.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours, theirs)


def _same_dict(ours, theirs):
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key


def test_one_output_without_metrics_returns_the_loss_alone_as_keras():
    keras = real_keras()
    x, y = _regression()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile("sgd", "mse")
    model = Model(net).compile("sgd", "mse")
    ours, theirs = model.evaluate(x, y, verbose=0), kmodel.evaluate(x, y, verbose=0)
    assert isinstance(ours, float) and ours == pytest.approx(theirs, rel=1e-5)
    assert model.metrics_names == kmodel.metrics_names == ["loss"]


def test_one_output_with_metrics_returns_keras_list_in_compile_order():
    """Keras keeps a single output's metrics in compile order (here not alphabetical)."""
    keras = real_keras()
    x, y = _regression()
    kmodel, net = twin_dense(keras, 4, 1)
    kmodel.compile("sgd", "mae", metrics=["root_mean_squared_error", "mse"])
    model = Model(net).compile("sgd", "mae", metrics=["root_mean_squared_error", "mse"])
    ours, theirs = model.evaluate(x, y, verbose=0), kmodel.evaluate(x, y, verbose=0)
    _same_list(ours, theirs)
    test_loss, rmse, mse = ours  # the guides' unpacking binds numbers
    assert mse == pytest.approx(rmse ** 2, rel=1e-5) and test_loss != mse
    _same_dict(dict(zip(model.metrics_names, ours)), kmodel.evaluate(x, y, verbose=0, return_dict=True))
    _same_dict(model.evaluate(x, y, verbose=0, return_dict=True), kmodel.evaluate(x, y, verbose=0, return_dict=True))
    _same_list(model.test_on_batch(x, y), kmodel.test_on_batch(x, y))


@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple-outputs", "dict-outputs"])
def test_two_outputs_give_keras_values_in_keras_order_and_names_that_pair_with_them(as_dict):
    """Keras' order: the loss, the per-output losses in output order, then the per-output
    metrics sorted by name (here not the compile order)."""
    keras = real_keras()
    xa, xb, ys, yc = two_head_data()
    names = ("score", "cls") if as_dict else ("output_0", "output_1")
    kmodel, model = two_head_twins(keras, names=names, as_dict=as_dict)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    metrics = [["root_mean_squared_error", "mae"], ["sparse_categorical_accuracy"]]
    losses, weights = ["mse", "sparse_categorical_crossentropy"], [1.0, 0.5]
    klosses = ["mse", sce]
    if as_dict:  # a dict model is compiled by output name (the outputs in their module order)
        metrics, losses, weights, klosses = (dict(zip(names, v)) for v in (metrics, losses, weights, klosses))
    kmodel.compile("sgd", loss=klosses, loss_weights=weights, metrics=metrics)
    model.compile("sgd", loss=losses, loss_weights=weights, metrics=metrics)
    before = model.metrics_names  # the per-output losses are known once the loss has run (as in Keras)
    assert before[0] == "loss" and not any(n.endswith("_loss") for n in before)
    targets = dict(zip(names, (ys, yc))) if as_dict else [ys, yc]
    ours, theirs = model.evaluate((xa, xb), targets, verbose=0), kmodel.evaluate([xa, xb], targets, verbose=0)
    _same_list(ours, theirs)
    keras_dict = kmodel.evaluate([xa, xb], targets, verbose=0, return_dict=True)
    _same_dict(dict(zip(model.metrics_names, ours)), keras_dict)
    assert model.metrics_names[:3] == ["loss", f"{names[0]}_loss", f"{names[1]}_loss"]
    assert model.metrics_names[:3] == [n for n in kmodel.metrics_names if n != "compile_metrics"][:3]
    _same_dict(model.evaluate((xa, xb), targets, verbose=0, return_dict=True), keras_dict)
    _same_list(model.test_on_batch((xa, xb), targets), kmodel.test_on_batch([xa, xb], targets))


def test_custom_values_of_a_test_step_follow_the_compiled_names_in_their_logged_order():
    class Extra(Model):
        def test_step(self, data):
            logs = super().test_step(data)
            return {"z_extra": 2.0, **logs, "a_extra": 1.0}

    x, y = _regression()
    model = Extra(torch.nn.Linear(4, 1)).compile("sgd", "mse", metrics=["mae"])
    loss, mae, z, a = model.evaluate(x, y, verbose=0)
    assert (z, a) == (2.0, 1.0) and loss != mae


def test_under_hf_arguments_evaluate_keeps_keras_form_and_return_dict_gives_the_trainers_dict(tmp_path):
    from transformers import TrainingArguments

    x, y = _regression()
    args = TrainingArguments(output_dir=str(tmp_path), num_train_epochs=1, per_device_train_batch_size=8,
                             report_to="none", use_cpu=True, save_strategy="no")
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse", metrics=["mae"])
    model.fit(x, y, args=args, verbose=0)
    values = model.evaluate(x, y, verbose=0)
    assert isinstance(values, list) and model.metrics_names == ["loss", "mae"]
    assert dict(zip(model.metrics_names, values)) == pytest.approx(model.evaluate(x, y, verbose=0, return_dict=True))
