"""TensorBoardCallback, read back with TensorBoard's own EventAccumulator."""

import csv
import dataclasses
import os
import pathlib
import warnings

import pytest
import torch
from helpers import mlp

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from fitkit import Model, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from fitkit.integrations import TensorBoardCallback
from fitkit.integrations._common import MASK


def _events(log_dir):
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _series(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _logged(history, key):
    return [(r["step"], r[key]) for r in history if key in r]


def _hparams(acc):
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    return experiment, start


def _value(hparam_value):
    kind = hparam_value.WhichOneof("kind")
    return getattr(hparam_value, kind)


@dataclasses.dataclass(frozen=True)
class ArgsWithToken(TrainingArguments):
    hub_token: str | None = None


def test_scalars_equal_the_log_history(tmp_path, blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
    model.fit(x, y, epochs=3, batch_size=60, validation_split=0.25, verbose=0, output_dir=str(tmp_path),
              report_to="tensorboard", logging_strategy="steps", logging_steps=2)
    acc = _events(tmp_path / "runs")
    history = model.state.log_history
    for tag in ("loss", "val_loss", "val_accuracy", "learning_rate"):
        got, want = _series(acc, tag), _logged(history, tag)
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag
    assert [s for s, _ in _series(acc, "val_loss")] == [3, 6, 9]  # one evaluation per epoch
    # one record per logging step, no epoch-average record (training metrics are epoch values: History)
    assert [s for s, _ in _series(acc, "loss")] == [2, 4, 6, 8]
    assert "accuracy" not in acc.Tags()["scalars"] and len(model.history.history["accuracy"]) == 3


def test_hparams_hold_the_arguments_and_final_metrics(tmp_path, blobs):
    x, y = blobs
    args = ArgsWithToken(output_dir=str(tmp_path), hub_token="hf_TOPSECRET", learning_rate=0.005,
                         num_train_epochs=2, per_device_train_batch_size=60, verbose=0, report_to="tensorboard")
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, validation_split=0.25, args=args)
    acc = _events(tmp_path / "runs")
    experiment, start = _hparams(acc)
    hp = {k: _value(v) for k, v in start.hparams.items()}
    assert hp["learning_rate"] == pytest.approx(0.005) and hp["num_train_epochs"] == 2
    assert hp["output_dir"] == str(tmp_path) and hp["report_to"] == "tensorboard"
    assert hp["hub_token"] == MASK
    assert {m.name.tag for m in experiment.metric_infos} == {
        "loss", "val_loss", "learning_rate", "train_loss", "train_runtime", "train_samples_per_second",
        "train_steps_per_second"}
    # the dashboard reads each metric's last value from its scalar series
    assert _series(acc, "val_loss")[-1][1] == pytest.approx(model.state.log_history[-2]["val_loss"], rel=1e-6)
    assert _series(acc, "train_loss")[-1][1] == pytest.approx(model.state.log_history[-1]["train_loss"], rel=1e-6)
    raw = b"".join(pathlib.Path(tmp_path, "runs", f).read_bytes() for f in os.listdir(tmp_path / "runs"))
    assert b"hf_TOPSECRET" not in raw


def test_non_numbers_are_dropped_with_one_warning(tmp_path, blobs):
    class AddsText(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs["phase"] = "train"

    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, epochs=2, batch_size=60, validation_split=0.25, verbose=0, output_dir=str(tmp_path),
                  report_to="tensorboard", callbacks=[AddsText()])
    mine = [w for w in caught if "TensorBoardCallback" in str(w.message)]
    assert len(mine) == 1 and "phase" in str(mine[0].message)
    acc = _events(tmp_path / "runs")
    assert "phase" not in acc.Tags()["scalars"]
    assert len(_series(acc, "loss")) == 2 and len(_series(acc, "val_loss")) == 2  # 4 records, 4 logged


def test_explicit_log_dir_and_world_zero_only(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path / "out"))
    control = TrainerControl()
    for world_zero, log_dir in ((False, tmp_path / "rank1"), (True, tmp_path / "tb")):
        cb = TensorBoardCallback(log_dir=log_dir)
        state = TrainerState(is_world_process_zero=world_zero)
        cb.on_train_begin(args, state, control)
        state.global_step = 5
        state.log_history.append({"loss": 0.25, "step": 5})
        cb.on_log(args, state, control, logs={"loss": 0.25, "score": torch.tensor(0.5)})
        cb.on_train_end(args, state, control)
    assert not (tmp_path / "rank1").exists() and not (tmp_path / "out").exists()
    acc = _events(tmp_path / "tb")
    assert _series(acc, "loss") == [(5, 0.25)] and _series(acc, "score") == [(5, 0.5)]


def test_search_writes_each_trial_under_its_own_run_dir(tmp_path, blobs):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x, y = blobs

    def model_init(trial):
        return mlp()

    model = Model(model_init=model_init).compile("adam", "cross_entropy")
    model.hyperparameter_search(
        x, y, validation_split=0.25, n_trials=2,
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1)},
        report_to=["tensorboard"], output_dir=str(tmp_path), verbose=0, batch_size=60, epochs=2,
    )
    rates = []
    for n in (0, 1):
        acc = _events(tmp_path / f"run-{n}" / "runs")
        assert [s for s, _ in _series(acc, "val_loss")] == [3, 6]
        assert [s for s, _ in _series(acc, "loss")] == [3, 6]
        _, start = _hparams(acc)
        lr = _value(start.hparams["learning_rate"])
        # the scalars of this dir are this trial's: its learning rate is the one it logged
        assert [v for _, v in _series(acc, "learning_rate")] == pytest.approx([lr, lr], rel=1e-6)
        rates.append(lr)
    assert rates[0] != rates[1]
    assert not (tmp_path / "runs").exists()


def test_resumed_run_replaces_what_was_logged_after_the_checkpoint(tmp_path, blobs):
    x, y = blobs
    options = dict(batch_size=60, validation_split=0.25, verbose=0, output_dir=str(tmp_path),
                   report_to=["tensorboard", "csv"], save_strategy="epoch")
    Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, **options)
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=2, resume_from_checkpoint=str(tmp_path / "checkpoint-3"), **options)
    history = model.state.log_history
    assert [r["step"] for r in history] == [3, 3, 6, 6, 6]  # ..., the closing summary
    acc = _events(tmp_path / "runs")
    for tag in ("loss", "val_loss"):  # step 6 once: the first run's step-6 values were purged
        got, want = _series(acc, tag), _logged(history, tag)
        assert [s for s, _ in got] == [3, 6]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
    with open(tmp_path / "logs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [3, 3, 6, 6, 6]  # restored history, the resumed records, summary
    assert float(rows[-2]["val_loss"]) == history[-2]["val_loss"]
