"""Keras' own callback objects (`keras.callbacks.*`, real Keras 3, torch backend) handed to fitkit: every
class the installed Keras exports either runs with Keras' effect (files, `History` keys, the rate, stopping)
or `fit` refuses it before anything starts, with an error naming fitkit's equivalent. The names come from
the installed Keras, so a class a newer Keras adds fails here until it is sorted into one or the other."""

import csv
import os

import numpy as np
import pytest
import torch

from fitkit import Model

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "torch":
    pytest.skip("keras was imported with another backend", allow_module_level=True)

N, BATCH, EPOCHS, LR = 40, 16, 3, 0.05


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(N, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)


def fit(callbacks, epochs=EPOCHS, x=None, y=None):
    if x is None:
        x, y = data()
    torch.manual_seed(0)
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse", metrics=["mean_absolute_error"], learning_rate=LR)
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, validation_data=(x[:20], y[:20]),
                        callbacks=callbacks, verbose=0)
    return model, history


def fit_keras(callbacks, epochs=EPOCHS):
    """The same run on real Keras: same initial weights, data and order."""
    x, y = data()
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.set_weights([reference.weight.detach().numpy().T, reference.bias.detach().numpy()])
    model.compile(keras.optimizers.SGD(learning_rate=LR), "mse", metrics=["mean_absolute_error"])
    return model.fit(x.numpy(), y.numpy(), batch_size=BATCH, epochs=epochs, shuffle=False,
                     validation_data=(x[:20].numpy(), y[:20].numpy()), callbacks=callbacks, verbose=0)


# -- the ones that run: each with Keras' effect ---------------------------------------------------------------------------
def runs_callback(tmp_path):
    seen = []

    class OddNames(keras.callbacks.Callback):  # Keras calls positionally: the parameters' names do not matter
        def on_epoch_end(self, epoch, l=None):
            seen.append((epoch, sorted(l), self.model))

    model, history = fit([OddNames()])
    assert [e for e, _, _ in seen] == history.epoch == [0, 1, 2]
    assert seen[0][1] == sorted(history.history) and all(m is model for _, _, m in seen)


def runs_lambda_callback(tmp_path):
    seen = []
    cb = keras.callbacks.LambdaCallback(on_train_begin=lambda l: seen.append(("begin", l)),
                                        on_train_batch_end=lambda b, l: seen.append(("batch", b)),
                                        on_epoch_end=lambda e, l: seen.append(("epoch", e, l["loss"])))
    _, history = fit([cb], epochs=2)
    assert seen[0] == ("begin", {}) and [s[1] for s in seen if s[0] == "batch"] == [0, 1, 2, 0, 1, 2]
    assert [s[2] for s in seen if s[0] == "epoch"] == pytest.approx(history.history["loss"], rel=1e-6)


def runs_history(tmp_path):
    cb = keras.callbacks.History()
    _, history = fit([cb])
    assert cb.epoch == history.epoch and sorted(cb.history) == sorted(history.history)
    for key, values in history.history.items():
        assert cb.history[key] == pytest.approx(values, rel=1e-6)


def runs_csv_logger(tmp_path):
    path = tmp_path / "log.csv"
    _, history = fit([keras.callbacks.CSVLogger(str(path))])
    with open(path) as rows_file:
        rows = list(csv.DictReader(rows_file))
    assert [int(r["epoch"]) for r in rows] == history.epoch
    assert [float(r["val_loss"]) for r in rows] == pytest.approx(history.history["val_loss"], rel=1e-6)


def runs_early_stopping(tmp_path):
    cb = keras.callbacks.EarlyStopping(monitor="loss", min_delta=100.0, patience=1, restore_best_weights=True)
    model, history = fit([cb], epochs=6)
    theirs = fit_keras([keras.callbacks.EarlyStopping(monitor="loss", min_delta=100.0, patience=1,
                                                      restore_best_weights=True)], epochs=6)
    assert history.epoch == theirs.epoch == [0, 1]
    assert all(np.allclose(a, b) for a, b in zip(model.get_weights(), cb.best_weights))
    # mode="auto" on a metric: Keras reads its direction from Keras metric objects; refused before the run
    with pytest.raises(TypeError, match=r"callbacks\[0\].*mode='min'.*fitkit\.callbacks\.EarlyStopping"):
        fit([keras.callbacks.EarlyStopping(monitor="val_mean_absolute_error")])
    _, history = fit([keras.callbacks.EarlyStopping(monitor="val_mean_absolute_error", mode="min")])
    assert history.epoch == [0, 1, 2]


def runs_learning_rate_scheduler(tmp_path):
    schedule = lambda epoch, lr: LR * 0.5 ** epoch  # noqa: E731
    model, history = fit([keras.callbacks.LearningRateScheduler(schedule)])
    theirs = fit_keras([keras.callbacks.LearningRateScheduler(schedule)])
    assert sorted(history.history) == sorted(theirs.history)  # `learning_rate` among them, as in Keras
    assert history.history["learning_rate"] == pytest.approx(theirs.history["learning_rate"])
    assert history.history["loss"] == pytest.approx(theirs.history["loss"], rel=1e-4)
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(LR / 4)


def runs_reduce_lr_on_plateau(tmp_path):
    make = lambda: keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=100.0)  # noqa: E731
    _, history = fit([make()])
    theirs = fit_keras([make()])
    assert sorted(history.history) == sorted(theirs.history)
    assert history.history["learning_rate"] == pytest.approx(theirs.history["learning_rate"])
    assert history.history["learning_rate"] == pytest.approx([LR, LR, LR / 2])  # logged before each reduction


def runs_terminate_on_nan(tmp_path):
    x, y = data()
    y = y.clone()
    y[BATCH + 1] = float("nan")  # the second batch's loss is NaN
    model, _ = fit([keras.callbacks.TerminateOnNaN()], x=x, y=y)
    assert model.state.global_step == 2  # stopped after the batch whose running loss is NaN, as Keras


def runs_remote_monitor(tmp_path):
    requests = pytest.importorskip("requests")
    posted = []

    def post(url, data=None, json=None, headers=None, **kwargs):
        posted.append((url, json if json is not None else data))

    cb = keras.callbacks.RemoteMonitor(root="http://monitor.invalid", send_as_json=True)
    original = requests.post
    requests.post = post
    try:
        _, history = fit([cb])
    finally:
        requests.post = original
    assert [p[1]["epoch"] for p in posted] == history.epoch
    assert [p[1]["loss"] for p in posted] == pytest.approx(history.history["loss"], rel=1e-6)
    assert all(p[0] == "http://monitor.invalid/publish/epoch/end/" for p in posted)


RUNS = {
    "Callback": runs_callback,
    "LambdaCallback": runs_lambda_callback,
    "History": runs_history,
    "CSVLogger": runs_csv_logger,
    "EarlyStopping": runs_early_stopping,
    "LearningRateScheduler": runs_learning_rate_scheduler,
    "ReduceLROnPlateau": runs_reduce_lr_on_plateau,
    "TerminateOnNaN": runs_terminate_on_nan,
    "RemoteMonitor": runs_remote_monitor,
}

# -- the ones refused: how to build one (None: handed over as the class), and the equivalent the error names ---------------
REFUSED = {
    "ModelCheckpoint": (lambda tmp: keras.callbacks.ModelCheckpoint(str(tmp / "m.keras")), "fitkit.callbacks.ModelCheckpoint"),
    "BackupAndRestore": (lambda tmp: keras.callbacks.BackupAndRestore(str(tmp / "backup")),
                         "fitkit.callbacks.BackupAndRestore"),
    "OrbaxCheckpoint": (None, "fitkit.callbacks.ModelCheckpoint"),
    "ProgbarLogger": (lambda tmp: keras.callbacks.ProgbarLogger(), "fitkit.callbacks.ProgressBar"),
    "TensorBoard": (lambda tmp: keras.callbacks.TensorBoard(str(tmp / "tb")), "fitkit.integrations.TensorBoardCallback"),
    "SwapEMAWeights": (lambda tmp: keras.callbacks.SwapEMAWeights(), "fitkit.callbacks.Callback"),
    "CallbackList": (lambda tmp: keras.callbacks.CallbackList(), "fitkit.callbacks.Callback"),
}


def keras_callback_classes():
    import keras.callbacks

    return sorted(n for n in dir(keras.callbacks) if isinstance(getattr(keras.callbacks, n), type))


def test_every_keras_callback_class_is_sorted_into_runs_or_refused():
    names = keras_callback_classes()
    assert "ModelCheckpoint" in names and "LambdaCallback" in names  # the enumeration sees Keras' classes
    unsorted = [n for n in names if n not in RUNS and n not in REFUSED]
    assert not unsorted, f"keras.callbacks classes neither run nor refused: {unsorted}"


@pytest.mark.parametrize("name", sorted(RUNS))
def test_keras_callback_runs_with_keras_effect(name, tmp_path):
    assert name in keras_callback_classes()
    RUNS[name](tmp_path)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_keras_callback_is_refused_at_the_start_of_fit_naming_fitkits_equivalent(name, tmp_path):
    assert name in keras_callback_classes()
    make, equivalent = REFUSED[name]
    callback = getattr(keras.callbacks, name) if make is None else make(tmp_path)
    started = []

    class Probe(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            started.append(True)

    pattern = rf"`callbacks\[1\]` is keras\.callbacks\.{name}.*{equivalent.replace('.', chr(92) + '.')}"
    with pytest.raises(TypeError, match=pattern):
        fit([Probe(), callback])
    assert not started  # refused before anything ran
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
    with pytest.raises(TypeError, match=rf"`callback` is keras\.callbacks\.{name}"):
        model.add_callback(callback)


def test_a_subclass_of_a_refused_keras_callback_is_refused_and_names_its_base(tmp_path):
    class MyCheckpoint(keras.callbacks.ModelCheckpoint):
        pass

    with pytest.raises(TypeError, match=r"MyCheckpoint \(a subclass of keras\.callbacks\.ModelCheckpoint\)"):
        fit([MyCheckpoint(str(tmp_path / "m.keras"))])

