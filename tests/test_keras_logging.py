"""Keras 3's tests of CSVLogger, TerminateOnNaN, LambdaCallback and Callback, and the History and
callback parts of keras/src/trainers/trainer_test.py, their scenarios and expected values
re-expressed with fitkit; plus the rule that puts `learning_rate` in History and CSVLogger, and
the host reads TerminateOnNaN adds per step."""

import csv
import math
import os
import re
import warnings

import pytest
import torch
from keras_port import DOCS, class_data, dense, differs, huge_dense
from test_core_lean import _fit_counting

from fitkit import Model, TrainerCallback
from fitkit.callbacks import (
    BackupAndRestore,
    CSVLogger,
    LambdaCallback,
    LearningRateScheduler,
    ReduceLROnPlateau,
    TerminateOnNaN,
    terminate_on_nan,
)

HISTORY_NAN = "`History` keeps one value per epoch for every key"


def test_every_kept_difference_is_a_line_of_the_docs():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", DOCS), encoding="utf-8") as f:
        docs = f.read()
    found = 0
    for name in ("test_keras_backup.py", "test_keras_logging.py", "test_keras_monitors.py"):
        with open(os.path.join(here, name), encoding="utf-8") as f:
            source = f.read()
        for line in re.findall(r'^[A-Z_]+ = "(.+)"$', source, flags=re.M):  # the lines `differs` quotes
            assert line in docs, f"{name}: {line!r} is not in {DOCS}"
            found += 1
    assert found == 4


def nan_data(n=10, seed=1337):
    """Keras' data for the NaN tests: features uniform in [0, 1), one-hot targets of 2 classes."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g), torch.nn.functional.one_hot(torch.randint(0, 2, (n,), generator=g), 2).float()


# -- CSVLogger (csv_logger_test.py) --------------------------------------------------------------------------
def regression(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, generator=g), torch.rand(n, 1, generator=g)


def csv_model():
    return Model(dense(3, 2, 1)).compile("sgd", "mse", ["mse"], learning_rate=0.01)


def test_csv_logger_separator_append_and_reuse(tmp_path):
    path = tmp_path / "log.tsv"
    data = dict(batch_size=4, validation_data=regression(seed=1), verbose=0)
    csv_model().fit(*regression(), callbacks=[CSVLogger(path, separator="\t")], epochs=1, **data)
    with open(path) as f:
        assert csv.Sniffer().sniff(f.read()).delimiter == "\t"
    appending = [CSVLogger(path, separator="\t", append=True)]
    model = csv_model()
    model.fit(*regression(), callbacks=appending, epochs=1, **data)
    model.fit(*regression(), callbacks=appending, epochs=2, **data)  # the same logger again
    with open(path) as f:
        lines = f.readlines()
    assert len(lines) == 5 and all(line.count("\t") == 4 for line in lines)  # epoch, loss, mse, val_loss, val_mse
    assert " ".join(lines).count("epoch") == 1


def test_csv_logger_writes_na_on_epochs_without_validation(tmp_path):
    path = tmp_path / "log.tsv"
    history = csv_model().fit(*regression(), batch_size=4, validation_data=regression(seed=1), validation_freq=3,
                              epochs=5, callbacks=[CSVLogger(path, separator="\t")], verbose=0)
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 5
    for epoch, row in enumerate(rows, 1):
        assert row["val_loss"] == (str(history.history["val_loss"][2]) if epoch == 3 else "NA")


@differs(HISTORY_NAN)
def test_history_lists_only_the_validation_values_logged():
    history = csv_model().fit(*regression(), batch_size=4, validation_data=regression(seed=1), validation_freq=3,
                              epochs=5, verbose=0)
    assert len(history.history["val_loss"]) == 1


def test_terminate_on_nan_with_csv_logger_leaves_a_valid_csv(tmp_path):
    path = tmp_path / "csv_logger.csv"
    (x, y), val = nan_data(), nan_data(seed=1)
    model = Model(huge_dense()).compile("sgd", "mse", learning_rate=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fitkit says the first loss is not finite
        history = model.fit(x, y, batch_size=4, validation_data=val, epochs=20,
                            callbacks=[TerminateOnNaN(), CSVLogger(path)], verbose=0)
    loss = history.history["loss"]
    assert len(loss) == 1 and not math.isfinite(loss[0])
    with open(path) as f:
        rows = [row for row in csv.reader(f) if row]
    assert len(rows) == 2 and "nan" in rows[-1]


# -- learning_rate in History and CSVLogger (Keras 3: present when the rate varies) ---------------------------
@pytest.mark.parametrize("case, shown", [("constant", False), ("cosine", True), ("plateau", True), ("schedule", True)])
def test_history_and_csv_hold_the_same_keys(tmp_path, case, shown):
    path = tmp_path / "log.csv"
    compile_options = {"lr_scheduler": "cosine"} if case == "cosine" else {}
    callbacks = {"plateau": [ReduceLROnPlateau(patience=1)],
                 "schedule": [LearningRateScheduler(lambda epoch, lr: lr * 0.5)]}.get(case, [])
    model = Model(dense(3, 2, 1)).compile("sgd", "mse", ["mse"], learning_rate=0.1, **compile_options)
    history = model.fit(*regression(), batch_size=4, validation_data=regression(seed=1), epochs=3,
                        callbacks=[*callbacks, CSVLogger(path)], verbose=0)
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0][1:] == sorted(history.history)  # the same keys, from the first row on
    assert ("learning_rate" in history.history) is shown
    if shown:
        assert len(history.history["learning_rate"]) == 3
        assert [float(r[rows[0].index("learning_rate")]) for r in rows[1:]] == history.history["learning_rate"]
    if case == "schedule":
        assert history.history["learning_rate"] == [0.05, 0.025, 0.0125]
    assert all("learning_rate" in r for r in model.state.log_history if "loss" in r)  # the log keeps it always


# -- TerminateOnNaN (terminate_on_nan_test.py) --------------------------------------------------------------------
def test_terminate_on_nan_stops_in_the_first_epoch():
    (x, y), val = nan_data(), nan_data(seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = Model(huge_dense()).compile("sgd", "mse", learning_rate=0.01).fit(
            x, y, batch_size=4, validation_data=val, callbacks=[TerminateOnNaN()], epochs=20, verbose=0)
    loss = history.history["loss"]
    assert len(loss) == 1 and (math.isnan(loss[0]) or math.isinf(loss[0]))


def infinite_targets(second_only=False):
    x = torch.tensor([[1.0], [2.0]])
    y = torch.tensor([[1.0], [math.inf]]) if second_only else torch.full((2, 1), math.inf)
    return x, y


def one_dense():
    return Model(dense(1, 1)).compile("sgd", "mse", learning_rate=0.01)


def quiet_fit(model, x, y, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fitkit says the targets are not finite
        return model.fit(x, y, verbose=0, **options)


def test_terminate_on_nan_graceful_stop():
    history = quiet_fit(one_dense(), *infinite_targets(), epochs=2, batch_size=1, callbacks=[TerminateOnNaN()])
    assert len(history.history["loss"]) < 4


def test_terminate_on_nan_raise_error():
    with pytest.raises(RuntimeError, match="NaN or Inf loss encountered"):
        quiet_fit(one_dense(), *infinite_targets(), epochs=1, batch_size=1,
                  callbacks=[TerminateOnNaN(raise_error=True)])


def test_raise_error_does_not_run_on_train_end_and_keeps_the_backup(tmp_path):
    class Tracking(TrainerCallback):
        train_end_called = False

        def on_train_end(self, args, state, control, **kwargs):
            self.train_end_called = True

    backup_dir = tmp_path / "backups"
    backup_dir.mkdir()
    (backup_dir / "checkpoint.txt").write_text("dummy checkpoint")
    tracking, backup = Tracking(), BackupAndRestore(str(backup_dir))
    backup.on_train_end = lambda *args, **kwargs: None  # as Keras' test: cleaning up is not what is tested
    x, y = infinite_targets()
    with pytest.raises(RuntimeError):
        quiet_fit(one_dense(), x[:1], y[:1], epochs=1, callbacks=[tracking, backup, TerminateOnNaN(raise_error=True)])
    assert not tracking.train_end_called
    assert (backup_dir / "checkpoint.txt").read_text() == "dummy checkpoint"


@pytest.mark.parametrize("raise_error", [False, True])
def test_normal_training_is_not_stopped(raise_error):
    x = torch.tensor([[1.0], [2.0]])
    history = one_dense().fit(x, x.clone(), epochs=2, callbacks=[TerminateOnNaN(raise_error=raise_error)], verbose=0)
    assert len(history.history["loss"]) == 2


def test_raise_error_names_the_batch_of_a_later_nan():
    with pytest.raises(RuntimeError) as err:
        quiet_fit(one_dense(), *infinite_targets(second_only=True), epochs=1, batch_size=1,
                  callbacks=[TerminateOnNaN(raise_error=True)])
    assert any(f"batch {i}" in str(err.value) for i in (0, 1))


def nan_at(batch, n_batches=8, batch_size=4):
    x, y = class_data(n_batches * batch_size, dim=4, classes=3)
    x[(batch - 1) * batch_size] = math.nan  # the first row of batch `batch` (1-based)
    return x, y


def test_nan_at_batch_two_of_eight_ends_at_global_step_two():
    stop = TerminateOnNaN()
    model = Model(dense(4, 3)).compile("sgd", "cross_entropy")
    quiet_fit(model, *nan_at(2), batch_size=4, epochs=3, shuffle=False, callbacks=[stop])
    assert stop.stopped_step == 2 and model.state.global_step == 2


def test_on_a_gpu_the_flag_is_read_one_step_later(monkeypatch):
    """The CUDA reading (a non-blocking copy read at the next step's end) run on CPU tensors."""
    watch = terminate_on_nan.LossWatch
    monkeypatch.setattr(terminate_on_nan, "LossWatch", lambda device: watch(device, deferred=True))
    stop = TerminateOnNaN()
    model = Model(dense(4, 3)).compile("sgd", "cross_entropy")
    quiet_fit(model, *nan_at(2), batch_size=4, epochs=3, shuffle=False, callbacks=[stop])
    assert stop.stopped_step == 2 and model.state.global_step == 3


def test_host_reads_with_terminate_on_nan_on_cpu_are_one_per_step(monkeypatch):
    steps = 64  # 512 samples, batch_size 8
    without = _fit_counting(monkeypatch, epochs=1)
    with_it = _fit_counting(monkeypatch, epochs=1, callbacks=[TerminateOnNaN()])
    assert without < with_it <= without + steps, (without, with_it)  # a CPU value read per step, nothing more


@pytest.mark.cuda
def test_on_a_gpu_no_device_value_is_read_per_step(monkeypatch):
    reads = []
    for name in ("item", "__float__", "__bool__", "tolist", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def counting(t, *a, _original=original, _name=name, **k):
            if t.is_cuda:
                reads.append(_name)
            return _original(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    stop = TerminateOnNaN()
    model = Model(dense(4, 3)).compile("sgd", "cross_entropy", accelerator="cuda", devices=1)
    quiet_fit(model, *nan_at(5, n_batches=32), batch_size=4, epochs=1, shuffle=False, callbacks=[stop])
    assert stop.stopped_step == 5 and model.state.global_step == 6  # read one step later
    assert len(reads) <= 4, reads  # the epoch's closing reads, none per step


# -- LambdaCallback (lambda_callback_test.py) ---------------------------------------------------------------------
def lambda_fit(callback, **options):
    x, y = torch.randn(16, 2), torch.randn(16, 1)
    model = Model(dense(2, 1)).compile("sgd", "mse")
    model.fit(x, y, batch_size=4, validation_split=0.2, callbacks=[callback], epochs=5, verbose=0, **options)
    return model


def test_lambda_callback_train_and_epoch_events():
    seen = []
    lambda_fit(LambdaCallback(
        on_train_begin=lambda args, state, control, **kw: seen.append("on_train_begin"),
        on_epoch_begin=lambda args, state, control, **kw: seen.append("on_epoch_begin"),
        on_epoch_end=lambda args, state, control, **kw: seen.append("on_epoch_end"),
        on_train_end=lambda args, state, control, **kw: seen.append("on_train_end")))
    assert seen[0] == "on_train_begin" and seen[-1] == "on_train_end"
    assert seen.count("on_epoch_begin") == seen.count("on_epoch_end") == 5


def test_lambda_callback_batch_events():
    seen = []
    lambda_fit(LambdaCallback(on_step_begin=lambda args, state, control, **kw: seen.append("begin"),
                              on_step_end=lambda args, state, control, **kw: seen.append("end")))
    assert seen.count("begin") == seen.count("end") == 5 * 3  # 12 training samples, batch 4: 3 steps an epoch


def test_lambda_callback_during_evaluate_and_predict():
    seen = []
    model = lambda_fit(LambdaCallback())
    x, y = torch.randn(16, 2), torch.randn(16, 1)
    callback = LambdaCallback(on_evaluate=lambda args, state, control, **kw: seen.append("evaluate"),
                              on_predict=lambda args, state, control, **kw: seen.append("predict"))
    model.evaluate(x, y, batch_size=4, callbacks=[callback], verbose=0)
    model.predict(x, batch_size=4, callbacks=[callback])
    assert seen == ["evaluate", "predict"]


def test_lambda_callback_without_arguments_and_with_extra_ones():
    assert isinstance(LambdaCallback(), LambdaCallback)

    def custom_callback(logs):
        pass

    callback = LambdaCallback(custom_method=custom_callback, note="kept")
    assert callback.custom_method is custom_callback and callback.note == "kept"


def test_lambda_callback_extra_function_answers_a_custom_event():
    seen = []

    class Verifying(Model):
        def train_step(self, data):
            self.call_event("on_verify_batch", size=len(data[0]))
            return super().train_step(data)

    model = Verifying(dense(2, 1)).compile("sgd", "mse")
    model.fit(torch.randn(8, 2), torch.randn(8, 1), batch_size=4, verbose=0,
              callbacks=[LambdaCallback(on_verify_batch=lambda args, state, control, size=0, **kw: seen.append(size))])
    assert seen == [4, 4]


@pytest.mark.parametrize("name", ["on_train_batch_end", "on_test_begin", "on_predict_begin"])
def test_lambda_callback_takes_keras_batch_event_names(name):
    LambdaCallback(**{name: lambda *args, **kwargs: None})


# -- Callback (callback_test.py) and the callback / History parts of trainer_test.py ---------------------------------
class Counting(torch.nn.Module):
    """`Dense(units)` without bias, kernel of ones, that counts its training calls."""

    def __init__(self, d_in=4, units=3):
        super().__init__()
        self.linear = torch.nn.Linear(d_in, units, bias=False)
        torch.nn.init.ones_(self.linear.weight)
        self.register_buffer("iterations", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        if self.training:
            self.iterations += 1
        return self.linear(x)


def test_model_state_is_current_at_each_step_end():
    checked = []

    class Check(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            checked.append(int(model.iterations) == state.global_step)

    x, y = torch.rand(8, 4), torch.rand(8, 3)
    Model(Counting()).compile("sgd", "mse").fit(x, y, batch_size=2, callbacks=[Check()], verbose=0)
    assert checked == [True] * 4


def test_fit_flow_history_values():
    x, y = torch.ones(100, 4), torch.zeros(100, 3)
    model = Model(Counting()).compile("sgd", "mse", ["mse"], learning_rate=0.01)  # Keras' SGD default
    history = model.fit(x, y, batch_size=20, epochs=3, verbose=0).history
    assert set(history) == {"loss", "mse"}
    assert history["mse"] == pytest.approx([14.5, 11.5, 8.5], abs=1.0)


def test_fit_with_validation_split_history_keys():
    model = Model(Counting()).compile("sgd", "mse", ["mse"], learning_rate=0.01)
    history = model.fit(torch.ones(100, 4), torch.zeros(100, 3), batch_size=20, epochs=3, validation_split=0.2,
                        verbose=0).history
    assert {"loss", "val_loss"} <= set(history)


def test_custom_train_step_values_reach_history():
    class Custom(Model):
        def train_step(self, data):
            return {**super().train_step(data), "my_custom_metric": 10.0}

    model = Custom(Counting()).compile("sgd", "mse", ["mse"])
    history = model.fit(torch.ones(100, 4), torch.zeros(100, 3), batch_size=16, verbose=0).history
    assert "loss" in history and history["my_custom_metric"] == [10.0]


def test_recompile_changes_the_history_keys():
    model = Model(Counting(2, 3)).compile("sgd", "mse", ["mse"])
    first = model.fit(torch.ones(3, 2), torch.ones(3, 3), verbose=0).history
    model.compile("sgd", "mse", ["mae"])
    second = model.fit(torch.ones(3, 2), torch.ones(3, 3), verbose=0).history
    assert sorted(first) == ["loss", "mse"] and sorted(second) == ["loss", "mae"]


def test_epoch_end_keys():
    model = Model(Counting()).compile("adam", "mse", ["mae"])
    history = model.fit(torch.ones(16, 4), torch.zeros(16, 3), batch_size=4, validation_data=(torch.ones(16, 4),
                        torch.zeros(16, 3)), verbose=0)
    assert sorted(history.history) == ["loss", "mae", "val_loss", "val_mae"]


def test_history_params_hold_steps_per_epoch():
    history = Model(dense(20, 10)).compile("sgd", "mse").fit(torch.arange(100.0).reshape(5, 20), torch.zeros(5, 10),
                                                             epochs=10, verbose=1)
    assert history.params == {"verbose": 1, "epochs": 10, "steps": 1}
    assert list(history.history) == ["loss"]


def test_callbacks_see_every_batch_of_training_and_validation():
    class Counter(TrainerCallback):
        train = batches = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.train += 1

        def on_prediction_step(self, args, state, control, **kwargs):
            self.batches += 1

    fitting, predicting = Counter(), Counter()
    model = Model(torch.nn.Linear(3, 3)).compile("sgd", "mse", ["mse"])
    model.fit(torch.ones(4, 3), torch.ones(4, 3), callbacks=[fitting], epochs=3, batch_size=1, verbose=0,
              validation_data=(torch.ones(2, 3), torch.ones(2, 3)), validation_batch_size=1)
    assert fitting.train == 12 and fitting.batches == 6
    model.predict(torch.ones(4, 3), callbacks=[predicting], batch_size=1)
    assert predicting.batches == 4


def test_a_callback_stops_training_after_the_fifth_batch():
    class Stopper(TrainerCallback):
        counter = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.counter += 1
            if self.counter == 5:
                control.should_training_stop = True

    stopper = Stopper()
    batches = [(torch.ones(2, 2), torch.ones(2, 3))] * 1000
    Model(torch.nn.Linear(2, 3)).compile("sgd", "mse", ["mse"]).fit(batches, callbacks=[stopper], verbose=0)
    assert stopper.counter == 5


def test_max_epochs_and_steps_counted_by_callbacks():
    counts = {"epochs": 0, "steps": 0}

    class Observer(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            counts["epochs"] += 1

        def on_step_begin(self, args, state, control, **kwargs):
            counts["steps"] += 1

    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
    model.fit(torch.ones(80, 4), torch.ones(80, 1), batch_size=8, epochs=4, callbacks=[Observer()], verbose=0)
    assert counts == {"epochs": 4, "steps": 40}


# -- a frozen model trains: the loss is reported, nothing is updated (trainer_test.py) ---------------------------------
def frozen(seed=0):
    net = dense(4, 1, seed=seed)
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def test_a_frozen_model_reports_the_same_loss_for_any_batch_size():
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(100, 4, generator=g), torch.ones(100, 1)
    net = frozen()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    model = Model(net).compile("adam", "mse")
    with pytest.warns(UserWarning, match="no parameter of the module requires grad") as caught:
        loss80 = model.fit(x, y, batch_size=80, verbose=0).history["loss"]
    assert len([w for w in caught if "requires grad" in str(w.message)]) == 1  # said once per run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss100 = model.fit(x, y, batch_size=100, verbose=0).history["loss"]
    assert loss80 == pytest.approx(loss100, rel=1e-6)
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


def test_training_mode_output_is_what_fit_sees():
    class TrainingTesting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()), requires_grad=False)

        def forward(self, x):
            return x * self.scale if self.training else x * 0

    x, y = torch.ones(128, 1), torch.zeros(128, 1)
    model = Model(TrainingTesting()).compile("rmsprop", "mse")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = model.fit(x, y, batch_size=32, verbose=0)
    assert history.history["loss"] == [1.0]
    assert model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)["loss"] == 0.0
    assert torch.equal(model.predict(x), torch.zeros(128, 1))
