"""Keras-style callbacks: Keras 3's "Writing your own callbacks" guide, re-expressed, run with real
Keras 3 (torch backend) and with fitkit on the same weights and data order."""

import math
import os
import sys

import numpy as np
import pytest
import torch

from fitkit import Model, TrainerCallback
from fitkit.callbacks import Callback, LambdaCallback

os.environ.setdefault("KERAS_BACKEND", "torch")

N, BATCH, EPOCHS = 40, 16, 3  # 3 steps an epoch (16, 16, 8), 2 validation batches of 16 and 4


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(N, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(N, 1, generator=g)
    return x, y


def keras_or_skip():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip("keras was imported with another backend")
    return keras


# -- the guide's callbacks, written once, for either base class ----------------------------------------------------
def guide_callbacks(base):
    class CustomCallback(base):
        """Every method records its name, its index argument and its logs' keys."""

        def __init__(self):
            super().__init__()
            self.calls = []

        def _add(self, name, index, logs):
            self.calls.append((name, index, sorted(logs or {})))

    for name in ("on_train_begin", "on_train_end", "on_test_begin", "on_test_end", "on_predict_begin",
                 "on_predict_end"):
        setattr(CustomCallback, name, lambda self, logs=None, _n=name: self._add(_n, None, logs))
    for name in ("on_epoch_begin", "on_epoch_end", "on_train_batch_begin", "on_train_batch_end",
                 "on_test_batch_begin", "on_test_batch_end", "on_predict_batch_begin", "on_predict_batch_end"):
        setattr(CustomCallback, name, lambda self, index, logs=None, _n=name: self._add(_n, index, logs))

    class LossAndErrorPrintingCallback(base):
        def __init__(self):
            super().__init__()
            self.batch_losses, self.test_losses, self.epochs = [], [], []

        def on_train_batch_end(self, batch, logs=None):
            self.batch_losses.append((batch, logs["loss"]))

        def on_test_batch_end(self, batch, logs=None):
            self.test_losses.append((batch, logs["loss"]))

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append((epoch, logs["loss"], logs["mean_absolute_error"]))

    class EarlyStoppingAtMinLoss(base):
        """Stop when the training loss has not gone down for `patience` epochs; keep the best weights."""

        def __init__(self, patience=0):
            super().__init__()
            self.patience = patience
            self.best_weights = None

        def on_train_begin(self, logs=None):
            self.wait, self.stopped_epoch, self.best = 0, 0, np.inf

        def on_epoch_end(self, epoch, logs=None):
            current = logs.get("loss")
            if np.less(current, self.best):
                self.best, self.wait = current, 0
                self.best_weights = self.model.get_weights()
            else:
                self.wait += 1
                if self.wait >= self.patience:
                    self.stopped_epoch = epoch
                    self.model.stop_training = True
                    self.model.set_weights(self.best_weights)

    class CustomLearningRateScheduler(base):
        def __init__(self, schedule):
            super().__init__()
            self.schedule = schedule
            self.rates = []

        def on_epoch_begin(self, epoch, logs=None):
            lr = float(np.array(self.model.optimizer.learning_rate))
            scheduled = self.schedule(epoch, lr)
            self.model.optimizer.learning_rate = scheduled
            self.rates.append(scheduled)

    return CustomCallback, LossAndErrorPrintingCallback, EarlyStoppingAtMinLoss, CustomLearningRateScheduler


def halve_from_epoch_one(epoch, lr):
    return lr if epoch == 0 else lr * 0.5


def run_fitkit(callbacks, epochs=EPOCHS, lr=0.05):
    x, y = data()
    torch.manual_seed(0)
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse", metrics=["mean_absolute_error"], learning_rate=lr)
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, validation_data=(x[:20], y[:20]),
                        callbacks=callbacks, verbose=0)
    model.evaluate(x, y, batch_size=BATCH, verbose=0, callbacks=callbacks[:1])
    model.predict(x, batch_size=BATCH, verbose=0, callbacks=callbacks[:1])
    return model, history


def run_keras(callbacks, epochs=EPOCHS, lr=0.05):
    keras = keras_or_skip()
    x, y = data()
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 1)  # the same initial weights as fitkit's run
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.set_weights([reference.weight.detach().numpy().T, reference.bias.detach().numpy()])
    model.compile(keras.optimizers.SGD(learning_rate=lr), "mse", metrics=["mean_absolute_error"])
    history = model.fit(x.numpy(), y.numpy(), batch_size=BATCH, epochs=epochs, shuffle=False,
                        validation_data=(x[:20].numpy(), y[:20].numpy()), callbacks=callbacks, verbose=0)
    model.evaluate(x.numpy(), y.numpy(), batch_size=BATCH, verbose=0, callbacks=callbacks[:1])
    model.predict(x.numpy(), batch_size=BATCH, verbose=0, callbacks=callbacks[:1])
    return model, history


def recorded_sequence(epochs=EPOCHS, steps=3, val_steps=2, eval_steps=3, predict_steps=3):
    """What Keras 3.15 calls, in order, for `run_keras` (recorded from it): name, index, logs keys."""
    values, val = ["loss", "mean_absolute_error"], ["val_loss", "val_mean_absolute_error"]
    calls = [("on_train_begin", None, [])]
    for epoch in range(epochs):
        calls.append(("on_epoch_begin", epoch, []))
        for b in range(steps):
            calls += [("on_train_batch_begin", b, []), ("on_train_batch_end", b, values)]
        calls.append(("on_test_begin", None, []))
        for b in range(val_steps):
            calls += [("on_test_batch_begin", b, []), ("on_test_batch_end", b, values)]
        calls += [("on_test_end", None, values), ("on_epoch_end", epoch, values + val)]
    calls.append(("on_train_end", None, values + val))
    calls.append(("on_test_begin", None, []))
    for b in range(eval_steps):
        calls += [("on_test_batch_begin", b, []), ("on_test_batch_end", b, values)]
    calls += [("on_test_end", None, values), ("on_predict_begin", None, [])]
    for b in range(predict_steps):
        calls += [("on_predict_batch_begin", b, []), ("on_predict_batch_end", b, ["outputs"])]
    return calls + [("on_predict_end", None, [])]


# -- the guide -------------------------------------------------------------------------------------------------------------
def test_custom_callback_sees_the_calls_and_logs_keys_keras_makes():
    custom, *_ = guide_callbacks(Callback)
    mine = custom()
    run_fitkit([mine])
    assert mine.calls == recorded_sequence()
    if "keras" in sys.modules or _keras_installed():
        keras = keras_or_skip()
        theirs = guide_callbacks(keras.callbacks.Callback)[0]()
        run_keras([theirs])
        assert mine.calls == theirs.calls


def _keras_installed():
    import importlib.util

    return importlib.util.find_spec("keras") is not None


def test_loss_printing_early_stopping_and_scheduler_match_keras_and_history():
    _, printing, early, scheduler = guide_callbacks(Callback)
    mine = [printing(), early(patience=1), scheduler(halve_from_epoch_one)]
    model, history = run_fitkit(mine, epochs=4)
    epochs = [e for e, _, _ in mine[0].epochs]
    assert [loss for _, loss, _ in mine[0].epochs] == pytest.approx(history.history["loss"], rel=1e-6)
    assert [mae for _, _, mae in mine[0].epochs] == pytest.approx(history.history["mean_absolute_error"], rel=1e-6)
    assert epochs == history.epoch
    assert mine[2].rates == pytest.approx([0.05 * 0.5 ** e for e in epochs])
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(mine[2].rates[-1])

    keras = keras_or_skip()
    _, printing_k, early_k, scheduler_k = guide_callbacks(keras.callbacks.Callback)
    theirs = [printing_k(), early_k(patience=1), scheduler_k(halve_from_epoch_one)]
    run_keras(theirs, epochs=4)
    assert [b for b, _ in mine[0].batch_losses] == [b for b, _ in theirs[0].batch_losses]
    assert [v for _, v in mine[0].batch_losses] == pytest.approx([v for _, v in theirs[0].batch_losses], rel=1e-4)
    assert [v for _, v in mine[0].test_losses] == pytest.approx([v for _, v in theirs[0].test_losses], rel=1e-4)
    assert [e for e, _, _ in mine[0].epochs] == [e for e, _, _ in theirs[0].epochs]
    assert [v for row in mine[0].epochs for v in row[1:]] == pytest.approx(
        [v for row in theirs[0].epochs for v in row[1:]], rel=1e-4)
    assert mine[1].stopped_epoch == theirs[1].stopped_epoch
    assert mine[2].rates == pytest.approx(theirs[2].rates)


def test_early_stopping_restores_the_best_weights_and_stops():
    _, _, early, _ = guide_callbacks(Callback)

    class Worsening(Callback):  # the loss goes up from epoch 1: weights are pushed away each epoch
        def on_epoch_begin(self, epoch, logs=None):
            if epoch:
                self.model.set_weights([w + 5.0 for w in self.model.get_weights()])

    stopper = early(patience=1)
    model, history = run_fitkit([Worsening(), stopper], epochs=6)
    assert stopper.stopped_epoch == 1 and history.epoch == [0, 1]
    assert all(np.allclose(a, b) for a, b in zip(model.get_weights(), stopper.best_weights))


# -- keras.callbacks.Callback subclasses, LambdaCallback ---------------------------------------------------------------
def test_a_keras_callback_subclass_stops_training_through_the_model():
    keras = keras_or_skip()

    class StopAfterTwo(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.seen = (self.params["epochs"], self.params["steps"], self.model.__class__)
            if epoch == 1:
                self.model.stop_training = True

    cb = StopAfterTwo()
    model, history = run_fitkit([cb], epochs=5)
    assert history.epoch == [0, 1]
    assert cb.seen == (5, 3, Model) and isinstance(cb.model, Model)


def test_lambda_callback_with_keras_signatures_records_running_means():
    running, raw, epochs = [], [], []

    class RawLosses(TrainerCallback):
        def on_step_end(self, args, state, control, batch=None, loss=None, **kwargs):
            raw.append((float(loss), len(batch[0])))

    record = LambdaCallback(on_train_batch_end=lambda batch, logs: running.append((batch, logs["loss"])),
                            on_epoch_end=lambda epoch, logs: epochs.append((epoch, logs["loss"])))
    _, history = run_fitkit([RawLosses(), record], epochs=2)
    expected = []
    for epoch in range(2):
        losses = raw[3 * epoch: 3 * epoch + 3]
        for b in range(3):
            seen = losses[: b + 1]
            expected.append((b, sum(v * n for v, n in seen) / sum(n for _, n in seen)))
    assert [b for b, _ in running] == [b for b, _ in expected]
    assert [v for _, v in running] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert all(type(v) is float for _, v in running)
    assert [v for _, v in epochs] == pytest.approx(history.history["loss"], rel=1e-6)


# -- self.model -----------------------------------------------------------------------------------------------------------
def test_the_model_offers_what_keras_callbacks_use(tmp_path):
    seen = {}

    class Probe(Callback):
        def on_epoch_end(self, epoch, logs=None):
            m = self.model
            seen["history"] = m.history.history.get("loss")
            seen["evaluate"] = m.evaluate(*data(), verbose=0, return_dict=True)["loss"]
            seen["predict"] = tuple(m.predict(data()[0][:5], verbose=0).shape)
            m.save_weights(str(tmp_path / "w.pt"))
            seen["lr"] = m.optimizer.learning_rate
            m.optimizer.learning_rate = 0.0  # every group: no later step moves the weights

    model, history = run_fitkit([Probe()], epochs=2)
    assert seen["history"] == history.history["loss"]  # the run's History, current during fit (2nd epoch's end)
    assert math.isfinite(seen["evaluate"]) and seen["predict"] == (5, 1)
    assert seen["lr"] == 0.0 and (tmp_path / "w.pt").exists()
    assert all(g["lr"] == 0.0 for g in model.optimizer.param_groups)
    with pytest.raises(ValueError, match="learning_rate"):
        from fitkit.facade.keras_api import OptimizerView

        OptimizerView(model.optimizer.wrapped, model.runtime).learning_rate = "fast"


def test_keras_callback_state_is_checkpointed_like_any_stateful_callback(tmp_path):
    class Counter(Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def state(self):
            return {"batches": self.batches}

        def load_state(self, state):
            self.batches = state["batches"]

    first = Counter()
    x, y = data()
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
    model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[first], verbose=0, output_dir=str(tmp_path),
              save_strategy="epoch")
    again = Counter()
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
    model.fit(x, y, batch_size=BATCH, epochs=3, callbacks=[again], verbose=0, output_dir=str(tmp_path),
              resume_from_checkpoint=True)
    assert first.batches == 6 and again.batches == 9


# -- Keras-style by type, never by signature ------------------------------------------------------------------------------
def test_keras_methods_are_called_positionally_whatever_their_parameters_are_named():
    seen = []

    class OddNames(Callback):  # Keras calls (epoch, logs) positionally: any names work
        def on_train_begin(self, l=None):
            seen.append(("begin", l))

        def on_epoch_end(self, e, l=None):
            seen.append(("epoch", e, sorted(l)))

        def on_batch_end(self, b, values):  # the alias, without a default
            seen.append(("batch", b, sorted(values)))

    record = LambdaCallback(on_epoch_end=lambda e, l: seen.append(("lambda", e, l["loss"])),
                            on_batch_end=lambda b, l: seen.append(("alias", b)))  # Keras' alias of on_train_batch_end
    _, history = run_fitkit([OddNames(), record], epochs=1)
    assert [s[1] for s in seen if s[0] == "alias"] == [0, 1, 2]
    assert seen[0] == ("begin", {})
    assert [s[1] for s in seen if s[0] == "batch"] == [0, 1, 2]
    assert ("epoch", 0, ["loss", "mean_absolute_error", "val_loss", "val_mean_absolute_error"]) in seen
    assert [s[2] for s in seen if s[0] == "lambda"] == pytest.approx(history.history["loss"])


def test_an_object_with_keras_only_methods_is_keras_style_and_a_trainer_callback_with_them_is_warned():
    class Duck:  # no base class: Keras' method names make it Keras-style
        def __init__(self):
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(logs["loss"])

        def on_epoch_end(self, epoch, logs=None):
            self.losses.append(("epoch", epoch))

    duck = Duck()
    run_fitkit([duck], epochs=2)
    assert len(duck.losses) == 8 and duck.losses[3] == ("epoch", 0) and isinstance(duck.losses[0], float)

    class Mixed(TrainerCallback):  # a TrainerCallback's methods are HF's events: Keras' names are never called
        def on_train_batch_end(self, args, state, control, **kwargs):
            raise AssertionError("not called")

    with pytest.warns(UserWarning, match=r"Mixed\.on_train_batch_end.*fitkit\.callbacks\.Callback.*on_step_end"):
        run_fitkit([Mixed()], epochs=1)


def test_the_handler_knows_nothing_of_keras_and_a_callback_without_overrides_costs_nothing():
    import ast

    import fitkit.events.handler as handler_module
    from fitkit.callbacks.keras.adapter import KerasAdapter
    from fitkit.events.handler import CallbackHandler

    with open(handler_module.__file__) as source:
        tree = ast.parse(source.read())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not [m for m in imported if "keras" in m] and not [n for n in names if "keras" in n.lower()]

    class EpochOnly(Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    handler = CallbackHandler([KerasAdapter(EpochOnly()), KerasAdapter(Callback())])
    listening = {e for e in ("on_step_begin", "on_step_end", "on_prediction_step", "on_prediction_step_begin",
                             "on_epoch_begin", "on_epoch_summary", "on_log", "on_evaluate") if handler.has_listeners(e)}
    assert listening == {"on_epoch_summary"}
    assert not KerasAdapter(EpochOnly()).takes_batch


def test_one_rule_tells_a_base_class_empty_hook_everywhere():
    """fitkit's `no_op`, Keras' `utils.default` and transformers' own hooks are a base class's empty
    methods by one rule (`is_base_default`), which the handler, the Keras names and the adapter share:
    no other module of fitkit reads the markers."""
    import pathlib

    import transformers

    import fitkit
    from fitkit.events.base_defaults import is_base_default

    keras = keras_or_skip()

    class Own(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            pass

    class Marked:  # a marker's attribute set to something else than True is no marker
        def on_log(self, *args):
            pass

    Marked.on_log._is_default = "yes"
    assert is_base_default(TrainerCallback().on_log) and is_base_default(Callback().on_epoch_end)
    assert is_base_default(keras.callbacks.Callback().on_epoch_end)
    assert is_base_default(transformers.TrainerCallback().on_log)
    assert is_base_default(transformers.TrainerCallback.on_step_end)  # a function read on the class
    assert not is_base_default(Own().on_log) and not is_base_default(Marked().on_log)
    package = pathlib.Path(fitkit.__file__).parent
    markers = ("__fitkit_no_op__", '"_is_default"', 'getattr(hf, "TrainerCallback"')  # how each is read
    readers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if any(m in p.read_text(encoding="utf-8") for m in markers))
    assert readers == ["events/base_defaults.py"]


# -- cost -----------------------------------------------------------------------------------------------------------------
def test_running_averages_cost_one_host_read_per_batch_and_nothing_otherwise(monkeypatch):
    from test_core_lean import _SyncCounter

    class BatchEnd(Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.last = logs["loss"]

    class EpochEnd(Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.last = logs["loss"]

    def reads(callbacks, epochs):
        x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
        y = torch.arange(256) % 3
        model = Model(torch.nn.Linear(8, 3)).compile("adam", "cross_entropy")
        model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # warm-up
        counter = _SyncCounter(monkeypatch)
        model.fit(x, y, epochs=epochs, batch_size=8, verbose=0, callbacks=callbacks)
        monkeypatch.undo()
        return counter.count

    plain = reads([], 2)
    assert reads([EpochEnd()], 2) == plain  # epoch logs reuse the epoch's one read
    assert reads([BatchEnd()], 2) == plain + 2 * 32  # 32 steps an epoch: one read each
    assert reads([BatchEnd(), BatchEnd()], 2) == plain + 2 * 32  # shared by every callback of the batch


def test_self_model_is_the_model_itself_with_keras_optimizer_and_history():
    # Keras sets the model itself on its callbacks: identity and type, `optimizer.learning_rate`, the
    # run's `history` while it runs
    seen = {}

    class Watch(Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.setdefault("model", []).append(self.model)
            seen["history"] = self.model.history
            seen["rate"] = float(self.model.optimizer.learning_rate)
            self.model.optimizer.learning_rate = 0.025

    x, y = data()
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse", learning_rate=0.05)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[Watch()])
    assert all(m is model for m in seen["model"]) and type(seen["model"][0]) is Model
    assert seen["history"] is history is model.history
    assert seen["rate"] == pytest.approx(0.025)  # the second epoch read what the first assigned
    assert model.optimizer is model.optimizer and float(model.optimizer.learning_rate) == pytest.approx(0.025)
    assert all(g["lr"] == pytest.approx(0.025) for g in model.optimizer.param_groups)
