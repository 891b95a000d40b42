"""Keras 3's multi-input / multi-output contract, re-expressing the "Training & evaluation with the
built-in methods" guide's sections (list and dict losses, `loss_weights`, per-output metrics,
arrays in lists and dicts, `evaluate` per output) beside real Keras 3 (torch backend) on the same
initial weights and data order (`shuffle=False`): same History keys, same values."""

import numpy as np
import pytest
import torch
from keras_real import real_keras

from fitkit import Model

N, BATCH = 24, 8


class TwoHeads(torch.nn.Module):
    """Two inputs (3 and 2 features), two outputs: a score and 3 class logits."""

    def __init__(self, names=("score", "cls"), as_dict=True):
        super().__init__()
        self.score, self.cls = torch.nn.Linear(5, 1), torch.nn.Linear(5, 3)
        self.names, self.as_dict = names, as_dict

    def forward(self, a, b):
        h = torch.cat([a, b], dim=-1)
        out = (self.score(h), self.cls(h))
        return dict(zip(self.names, out)) if self.as_dict else out


def _data():
    rng = np.random.default_rng(0)
    xa, xb = rng.normal(size=(N, 3)).astype("float32"), rng.normal(size=(N, 2)).astype("float32")
    ys, yc = rng.normal(size=(N, 1)).astype("float32"), rng.integers(0, 3, size=(N,)).astype("int64")
    return xa, xb, ys, yc


def _twins(keras, names=("score", "cls"), as_dict=True):
    """(keras model, fitkit Model) with the same weights; Keras' outputs named `names`."""
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Concatenate()([a, b])
    score = keras.layers.Dense(1, name=names[0])(h)
    cls = keras.layers.Dense(3, name=names[1])(h)
    kmodel = keras.Model([a, b], {names[0]: score, names[1]: cls} if as_dict else [score, cls])
    torch.manual_seed(0)
    net = TwoHeads(names, as_dict)
    for layer, lin in ((names[0], net.score), (names[1], net.cls)):
        kmodel.get_layer(layer).set_weights([lin.weight.detach().T.numpy().copy(), lin.bias.detach().numpy().copy()])
    return kmodel, Model(net)


def _close(ours: dict, theirs: dict):
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert np.allclose(ours[key], theirs[key], rtol=2e-4, atol=1e-5), (key, ours[key], theirs[key])


def test_list_losses_loss_weights_and_per_output_metrics_equal_keras():
    keras = real_keras()
    xa, xb, ys, yc = _data()
    kmodel, model = _twins(keras, as_dict=True)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kmodel.compile(keras.optimizers.SGD(0.1), loss={"score": "mse", "cls": sce}, loss_weights={"score": 1.0, "cls": 0.5},
                   metrics={"score": ["mae"], "cls": ["sparse_categorical_accuracy"]})
    model.compile("sgd", loss={"score": "mse", "cls": "sparse_categorical_crossentropy"},
                  loss_weights={"score": 1.0, "cls": 0.5}, learning_rate=0.1,
                  metrics={"score": ["mae"], "cls": ["sparse_categorical_accuracy"]})
    theirs = kmodel.fit([xa, xb], {"score": ys, "cls": yc}, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                        validation_split=0.25).history
    ours = model.fit([xa, xb], {"score": ys, "cls": yc}, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                     validation_split=0.25).history
    _close(ours, theirs)
    assert "score_loss" in ours and "val_cls_sparse_categorical_accuracy" in ours
    _close(model.evaluate((xa, xb), {"score": ys, "cls": yc}, verbose=0, return_dict=True),
           kmodel.evaluate([xa, xb], {"score": ys, "cls": yc}, verbose=0, return_dict=True))


def test_tuple_outputs_with_a_list_of_losses_and_a_list_of_lists_of_metrics_equal_keras():
    """A torch module's tuple outputs are named output_0, output_1 (Keras names a functional
    model's by its layers: the Keras twin's layers carry those names)."""
    keras = real_keras()
    xa, xb, ys, yc = _data()
    kmodel, model = _twins(keras, names=("output_0", "output_1"), as_dict=False)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kmodel.compile(keras.optimizers.SGD(0.05), loss=["mse", sce], loss_weights=[0.3, 1.0],
                   metrics=[["mae"], ["sparse_categorical_accuracy"]])
    model.compile("sgd", loss=["mse", "cross_entropy"], loss_weights=[0.3, 1.0], learning_rate=0.05,
                  metrics=[["mae"], ["sparse_categorical_accuracy"]])
    theirs = kmodel.fit([xa, xb], [ys, yc], batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ours = model.fit([xa, xb], [ys, yc], batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    _close(ours, theirs)
    assert {"loss", "output_0_loss", "output_1_loss", "output_0_mae"} <= set(ours)


def test_one_loss_on_a_tuple_output_applies_to_each_output_as_keras():
    keras = real_keras()
    xa, xb, ys, yc = _data()
    onehot = np.eye(3, dtype="float32")[yc]
    kmodel, model = _twins(keras, names=("output_0", "output_1"), as_dict=False)
    kmodel.compile(keras.optimizers.SGD(0.05), loss="mse")
    model.compile("sgd", loss="mse", learning_rate=0.05)
    theirs = kmodel.fit([xa, xb], [ys, onehot], batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    ours = model.fit([xa, xb], [ys, onehot], batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    _close(ours, theirs)


def test_an_output_without_loss_logs_only_the_loss_as_keras():
    keras = real_keras()
    xa, xb, ys, yc = _data()
    kmodel, model = _twins(keras)
    kmodel.compile(keras.optimizers.SGD(0.1), loss={"score": "mse", "cls": None})
    model.compile("sgd", loss={"score": "mse", "cls": None}, learning_rate=0.1)
    theirs = kmodel.fit({"a": xa, "b": xb}, {"score": ys, "cls": yc}, batch_size=BATCH, shuffle=False, verbose=0)
    ours = model.fit([xa, xb], {"score": ys, "cls": yc}, batch_size=BATCH, shuffle=False, verbose=0)
    _close(ours.history, theirs.history)


def test_one_sample_weight_array_weighs_every_output_as_keras():
    keras = real_keras()
    xa, xb, ys, yc = _data()
    w = np.linspace(0.2, 2.0, N).astype("float32")
    kmodel, model = _twins(keras)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kmodel.compile(keras.optimizers.SGD(0.1), loss={"score": "mse", "cls": sce})
    model.compile("sgd", loss={"score": "mse", "cls": "cross_entropy"}, learning_rate=0.1)
    theirs = kmodel.fit([xa, xb], {"score": ys, "cls": yc}, sample_weight=w, batch_size=BATCH, shuffle=False,
                        verbose=0).history
    ours = model.fit([xa, xb], {"score": ys, "cls": yc}, sample_weight=w, batch_size=BATCH, shuffle=False,
                     verbose=0).history
    _close(ours, theirs)


def test_dict_inputs_validation_data_and_predict_keep_the_structure():
    xa, xb, ys, yc = _data()
    torch.manual_seed(0)
    model = Model(TwoHeads()).compile("adam", loss={"score": "mse", "cls": "cross_entropy"})
    history = model.fit({"a": xa, "b": xb}, {"score": ys, "cls": yc}, batch_size=BATCH, verbose=0,
                        validation_data=({"a": xa[:8], "b": xb[:8]}, {"score": ys[:8], "cls": yc[:8]}))
    assert {"loss", "score_loss", "cls_loss", "val_loss", "val_score_loss", "val_cls_loss"} == set(history.history)
    out = model.predict([xa, xb], batch_size=5)
    assert set(out) == {"score", "cls"} and out["score"].shape == (N, 1) and out["cls"].shape == (N, 3)
    values = model.evaluate((xa, xb), (ys, yc), verbose=0, return_dict=True)  # tuple targets, in the outputs' order
    assert set(values) == {"loss", "score_loss", "cls_loss"}
    assert values["loss"] == pytest.approx(values["score_loss"] + values["cls_loss"], rel=1e-5)


def test_several_outputs_against_one_target_array_are_refused_not_trained_silently():
    xa, xb, ys, _ = _data()
    model = Model(TwoHeads(as_dict=False)).compile("sgd", "mse")
    start = [p.detach().clone() for p in model.module.parameters()]
    with pytest.raises(ValueError, match="returned 2 outputs .*one target per output"):
        model.fit([xa, xb], ys, verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(start, model.module.parameters()))


@pytest.mark.parametrize("kwargs, text", [
    (dict(loss={"score": "mse", "nope": "mse"}), "not outputs of the module"),
    (dict(loss=["mse"]), "1 entries but the module returned 2 outputs"),
    (dict(loss="mse", metrics=["mae"]), "`metrics` is a flat list"),
])
def test_per_output_misuse_names_the_argument(kwargs, text):
    xa, xb, ys, yc = _data()
    model = Model(TwoHeads()).compile("sgd", **kwargs)
    with pytest.raises(ValueError, match=text):
        model.fit([xa, xb], {"score": ys, "cls": np.eye(3, dtype="float32")[yc]}, verbose=0)


@pytest.mark.parametrize("compiled", [
    dict(loss=["mse", "cross_entropy"]),
    dict(loss=["mse", "cross_entropy"], metrics=[["mae"], ["accuracy"]]),
    dict(loss="mse"),
])
def test_the_guides_dict_targets_on_a_tuple_output_fail_clearly_then_train_named(compiled):
    """The guide keys `y` by its functional model's output layers; a torch module's tuple
    outputs are output_0, output_1: the error says so and how to name them, before any step."""
    xa, xb, ys, yc = _data()
    targets = {"priority": ys, "department": np.eye(3, dtype="float32")[yc]}
    model = Model(TwoHeads(as_dict=False)).compile("sgd", **compiled)
    start = [p.detach().clone() for p in model.module.parameters()]
    with pytest.raises(ValueError, match=r"`y` has no entry for output 'output_0': its keys are \['priority', "
                                         r"'department'\].*return a dict from `forward`"):
        model.fit([xa, xb], targets, verbose=0)
    assert all(torch.equal(a, b) for a, b in zip(start, model.module.parameters()))
    named = Model(TwoHeads(names=("priority", "department"))).compile("sgd", **compiled)
    assert "loss" in named.fit([xa, xb], targets, epochs=1, verbose=0).history  # the fix the error gives


def test_class_weight_is_refused_for_several_outputs():
    xa, xb, ys, yc = _data()
    model = Model(TwoHeads()).compile("sgd", loss={"score": "mse", "cls": "cross_entropy"})
    with pytest.raises(ValueError, match="`class_weight` is for a model with one output"):
        model.fit([xa, xb], {"score": ys, "cls": yc}, class_weight={0: 1.0, 1: 2.0}, verbose=0)


def test_a_per_output_compile_survives_save_and_load(tmp_path):
    xa, xb, ys, yc = _data()
    model = Model(TwoHeads()).compile("sgd", loss={"score": "mse", "cls": "cross_entropy"},
                                      loss_weights={"cls": 0.5}, metrics={"cls": ["accuracy"]})
    model.fit([xa, xb], {"score": ys, "cls": yc}, verbose=0)
    model.save(tmp_path / "m.pt")
    loaded = Model.load(str(tmp_path / "m.pt"), TwoHeads())
    assert loaded.config.loss == model.config.loss and loaded.config.options["loss_weights"] == {"cls": 0.5}
    assert set(loaded.evaluate([xa, xb], {"score": ys, "cls": yc}, verbose=0, return_dict=True)) == {
        "loss", "score_loss", "cls_loss", "cls_accuracy"}


def test_model_checkpoint_names_may_use_the_loss_logged_at_that_step(tmp_path):
    from fitkit.callbacks import ModelCheckpoint

    xa, xb, ys, yc = _data()
    model = Model(TwoHeads()).compile("sgd", loss={"score": "mse", "cls": "cross_entropy"})
    saver = ModelCheckpoint(str(tmp_path / "m-{step}-{loss:.2f}.pt"), save_freq=2)
    model.fit([xa, xb], {"score": ys, "cls": yc}, batch_size=4, epochs=1, verbose=0, callbacks=[saver],
              logging_strategy="steps", logging_steps=2)
    logged = {}
    for record in model.state.log_history:  # the step's own log (the epoch's comes after, at the last step)
        if "loss" in record:
            logged.setdefault(record["step"], record)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"m-{s}-{logged[s]['loss']:.2f}.pt" for s in (2, 4, 6))


def test_loss_weights_stay_with_a_fit_given_args():
    """compile's `loss_weights` is compile's own, not a `TrainingArguments` field: a fit given
    `args=` trains as the same fit given keywords (it raised "unknown option" before)."""
    from fitkit import TrainingArguments

    xa, xb, ys, yc = _data()
    runs = []
    for given in ({"batch_size": BATCH, "epochs": 2}, {"args": TrainingArguments(per_device_train_batch_size=BATCH,
                                                                                   num_train_epochs=2)}):
        torch.manual_seed(0)
        model = Model(TwoHeads()).compile("sgd", {"score": "mse", "cls": "sparse_categorical_crossentropy"},
                                          loss_weights={"score": 1.0, "cls": 0.5}, learning_rate=0.1)
        history = model.fit([xa, xb], {"score": ys, "cls": yc}, shuffle=False, verbose=0, **given)
        runs.append(history.history)
    assert runs[0] == runs[1] and len(runs[0]["loss"]) == 2
