"""TerminateOnNaN, CSVLogger and LambdaCallback on real fits."""

import copy
import csv
import json
import math
import os
import subprocess
import sys

import pytest
from helpers import blobs as data
from helpers import mlp

from fitkit import Model, TrainerControl, TrainerState, TrainingArguments
from fitkit.callbacks import CallbackHandler, CSVLogger, LambdaCallback, TerminateOnNaN
from fitkit.events.handler import EVENTS


def compiled(metrics=("accuracy",)):
    return Model(mlp()).compile("adam", "cross_entropy", list(metrics), learning_rate=0.01)


# -- TerminateOnNaN ------------------------------------------------------------------------------------------
def nan_data(row):
    x, y = data(64)
    x[row] = float("nan")
    return x, y


def test_stops_at_the_step_whose_loss_is_nan():
    x, y = nan_data(40)  # batch_size 16, no shuffle: row 40 is in the 3rd step
    stop = TerminateOnNaN()
    model = compiled()
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, logging_strategy="steps", logging_steps=1,
                        callbacks=[stop], verbose=0, seed=0)
    assert stop.stopped_step == 3
    assert model.state.global_step == 3
    assert model.state.epoch < 1
    assert math.isnan(history.history["loss"][-1])


def test_finite_losses_do_not_stop():
    stop = TerminateOnNaN()
    model = compiled()
    model.fit(*data(64), batch_size=16, epochs=2, logging_strategy="steps", logging_steps=1, callbacks=[stop],
              verbose=0, seed=0)
    assert stop.stopped_step is None and model.state.global_step == 8


def test_without_step_logging_it_still_stops_after_the_nan_batch():
    x, y = nan_data(5)  # the first batch
    stop = TerminateOnNaN()
    model = compiled()
    history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, callbacks=[stop], verbose=0, seed=0)
    assert stop.stopped_step == 1 and model.state.global_step == 1
    assert len(history.history["loss"]) == 1 and math.isnan(history.history["loss"][0])  # the epoch's record


def test_a_logged_loss_that_is_not_finite_stops_too():
    """The check of the logged losses stays (it covers values a callback or a step override logs)."""
    def poison(args, state, control, logs=None, **kwargs):
        if state.global_step == 5 and "loss" in logs:
            logs["loss"] = float("inf")

    stop = TerminateOnNaN()
    model = compiled()
    model.fit(*data(64), batch_size=16, epochs=3, logging_strategy="steps", logging_steps=1,
              callbacks=[LambdaCallback(on_log=poison), stop], verbose=0, seed=0)
    assert stop.stopped_step == 5 and model.state.global_step == 5


def test_with_gradient_accumulation_a_nan_micro_batch_stops_its_optimizer_step():
    x, y = nan_data(20)  # micro-batch 2 of 4 (batch_size 16): the first optimizer step of 2 micro-batches
    stop = TerminateOnNaN()
    model = compiled()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, gradient_accumulation_steps=2, callbacks=[stop],
              verbose=0, seed=0)
    assert stop.stopped_step == 1 and model.state.global_step == 1


def test_raise_error_names_the_step():
    x, y = nan_data(20)
    with pytest.raises(RuntimeError, match="step 2"):
        compiled().fit(x, y, batch_size=16, epochs=1, shuffle=False, logging_strategy="steps", logging_steps=1,
                       callbacks=[TerminateOnNaN(raise_error=True)], verbose=0, seed=0)


@pytest.mark.slow
def test_every_process_stops_at_the_step_one_of_them_saw_nan(tmp_path):
    """2-process DDP on CPU: the loss is NaN on rank 1 only; both stop at that step (the step's
    loss is summed over the processes before it is read), none is left waiting."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "terminate_on_nan.py")
    proc = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = []
    for rank in (0, 1):
        with open(tmp_path / f"rank-{rank}.json") as f:
            results.append(json.load(f))
    assert results == [{"rank": r, "stopped_step": 3, "global_step": 3} for r in (0, 1)]


# -- CSVLogger -----------------------------------------------------------------------------------------------
def read(path, sep=","):
    with open(path, newline="") as f:
        return list(csv.reader(f, delimiter=sep))


def test_header_and_one_row_per_epoch(tmp_path):
    path = tmp_path / "log.csv"
    model = compiled()
    history = model.fit(*data(), batch_size=16, epochs=3, validation_data=data(16, 1), callbacks=[CSVLogger(path)],
                        verbose=0, seed=0)
    rows = read(path)
    assert rows[0] == ["epoch", "accuracy", "loss", "val_accuracy", "val_loss"]  # a constant rate is no column
    assert [r[0] for r in rows[1:]] == ["0", "1", "2"]
    assert sorted(history.history) == rows[0][1:]  # the same keys as History
    for i, row in enumerate(rows[1:]):
        values = dict(zip(rows[0], row))
        for key in ("accuracy", "loss", "val_accuracy", "val_loss"):
            assert float(values[key]) == pytest.approx(history.history[key][i])


def test_each_row_is_on_disk_when_the_next_epoch_begins(tmp_path):
    path = tmp_path / "log.csv"
    seen = []
    peek = LambdaCallback(on_epoch_begin=lambda a, s, c, **k: seen.append(len(read(path)) if path.exists() else 0))
    compiled().fit(*data(), batch_size=16, epochs=3, validation_data=data(16, 1), callbacks=[CSVLogger(path), peek],
                   verbose=0, seed=0)
    assert seen == [0, 2, 3]  # empty file (no header yet), then header + 1 row, header + 2 rows


def test_append_continues_without_a_second_header(tmp_path):
    path = tmp_path / "log.csv"
    model = compiled()
    model.fit(*data(), batch_size=16, epochs=2, callbacks=[CSVLogger(path)], verbose=0, seed=0)
    model.fit(*data(), batch_size=16, epochs=3, callbacks=[CSVLogger(path, append=True)], verbose=0, seed=0)
    rows = read(path)
    assert rows[0] == ["epoch", "accuracy", "loss"]
    assert [r[0] for r in rows[1:]] == ["0", "1", "0", "1", "2"]
    model.fit(*data(), batch_size=16, epochs=1, callbacks=[CSVLogger(path)], verbose=0, seed=0)
    assert len(read(path)) == 2  # append=False starts the file again


def test_separator_and_validation_columns_missing_from_the_first_row(tmp_path):
    path = tmp_path / "log.tsv"
    # 2 steps per epoch, evaluation every 4 steps: the first epoch has no validation values
    compiled(metrics=()).fit(*data(), batch_size=16, epochs=2, validation_data=data(16, 1), eval_strategy="steps",
                             eval_steps=4, callbacks=[CSVLogger(path, separator="\t")], verbose=0, seed=0)
    rows = read(path, "\t")
    assert rows[0] == ["epoch", "loss", "val_loss"]
    assert rows[1][2] == "NA" and float(rows[2][2]) > 0


def test_load_state_cuts_rows_written_after_the_checkpoint(tmp_path):
    path = tmp_path / "log.csv"
    logger = CSVLogger(path)
    compiled().fit(*data(), batch_size=16, epochs=3, callbacks=[logger], verbose=0, seed=0)
    state = logger.state()
    assert state["epochs_written"] == 3 and state["columns"] == ["accuracy", "loss"]
    resumed = CSVLogger(path)
    resumed.load_state({**state, "epochs_written": 1})
    compiled().fit(*data(), batch_size=16, epochs=2, callbacks=[resumed], verbose=0, seed=0)
    rows = read(path)
    assert len(rows) == 1 + 1 + 2 and rows[0][0] == "epoch"
    assert resumed.epochs_written == 3


def test_only_the_world_zero_process_writes_the_csv(tmp_path):
    path = tmp_path / "log.csv"
    logger = CSVLogger(path)
    args, control = TrainingArguments(eval_strategy="no"), TrainerControl(should_log=True)
    state = TrainerState(epoch=0.0, is_world_process_zero=False)
    logger.on_train_begin(args, state, control)
    logger.on_epoch_begin(args, state, control)
    state.epoch = 1.0
    logger.on_epoch_end(args, state, control)
    logger.on_log(args, state, control, logs={"loss": 1.0})
    logger.on_train_end(args, state, control)
    assert not path.exists()


# -- LambdaCallback ------------------------------------------------------------------------------------------
def test_functions_get_their_events_arguments():
    calls = {"train_begin": 0, "epoch_end": [], "log": [], "evaluate": []}

    def on_train_begin(args, state, control, **kwargs):
        calls["train_begin"] += 1
        assert isinstance(control, TrainerControl) and isinstance(args, TrainingArguments)
        assert {"model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"} <= set(kwargs)

    cb = LambdaCallback(
        on_train_begin=on_train_begin,
        on_epoch_end=lambda args, state, control, **kw: calls["epoch_end"].append(state.epoch),
        on_log=lambda args, state, control, logs=None, **kw: calls["log"].append(dict(logs)),
        on_evaluate=lambda args, state, control, metrics=None, **kw: calls["evaluate"].append(dict(metrics)),
        on_predict=None,
    )
    compiled().fit(*data(), batch_size=16, epochs=2, validation_data=data(16, 1), callbacks=[cb], verbose=0, seed=0)
    assert calls["train_begin"] == 1
    assert calls["epoch_end"] == [1.0, 2.0]
    assert [sorted(m) for m in calls["evaluate"]] == [["val_accuracy", "val_loss"]] * 2
    assert ["loss" in r for r in calls["log"]] == [True, False, True, False, False]
    assert "train_runtime" in calls["log"][-1]  # the run's closing summary


def test_returned_control_stops_training():
    def stop_at_three(args, state, control, **kwargs):
        if state.global_step == 3:
            return TrainerControl(should_training_stop=True)
        return None

    model = compiled()
    model.fit(*data(64), batch_size=16, epochs=3, callbacks=[LambdaCallback(on_step_end=stop_at_three)], verbose=0)
    assert model.state.global_step == 3


def test_only_the_given_events_are_listened_to():
    seen = []
    cb = LambdaCallback(on_step_end=lambda *a, **k: seen.append(1), on_log=lambda *a, **k: seen.append(2))
    handler = CallbackHandler([cb])
    listening = [e for e in EVENTS if handler.has_listeners(e)]
    assert listening == ["on_step_end", "on_log"]
    assert isinstance(cb, LambdaCallback)
    clone = copy.deepcopy(cb)
    assert isinstance(clone, LambdaCallback) and CallbackHandler([clone]).has_listeners("on_log")


def test_unknown_event_name_lists_the_events():
    with pytest.raises(TypeError, match="on_epoch_end") as err:
        LambdaCallback(on_epoch_ned=lambda *a, **k: None)
    assert "on_epoch_ned" in str(err.value)
    with pytest.raises(TypeError, match="on_step_end"):  # Keras' name, HF's arguments: the event to use
        LambdaCallback(on_batch_end=lambda args, state, control, **k: None)
    with pytest.raises(TypeError, match="function"):
        LambdaCallback(on_log=3)
