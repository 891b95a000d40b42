"""report_to names, availability, masking of secrets and the CSV step logger."""

import csv
import dataclasses
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import mlp

from fitkit import Model, TrainerControl, TrainerState, TrainingArguments
from fitkit.integrations import (
    MissingIntegrationError,
    available_integrations,
    callbacks_for,
    looks_secret,
    mask_secrets,
)
from fitkit.integrations._common import MASK, run_params
from fitkit.integrations.csv import CSVStepLogger

HEAVY = ("tensorboard", "mlflow", "wandb", "comet_ml", "codecarbon")


def _pretend_missing(monkeypatch, *missing):
    """Make `find_spec` report the packages in `missing` as not installed."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name.split(".")[0] in missing:
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _fit(tmp_path, blobs, **options):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
    model.fit(x, y, epochs=2, batch_size=60, validation_split=0.25, verbose=0, output_dir=str(tmp_path), **options)
    return model


# -- names ------------------------------------------------------------------------------------


def test_integration_modules_import_no_tracking_library():
    code = (
        "import sys, fitkit, fitkit.integrations\n"
        "from fitkit.integrations import callbacks_for, TensorBoardCallback, MLflowCallback, CSVStepLogger\n"
        "import fitkit.integrations.wandb, fitkit.integrations.comet_ml, fitkit.integrations.codecarbon\n"
        "cbs = callbacks_for(['csv'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_none_and_empty_give_no_callbacks():
    assert callbacks_for("none") == [] and callbacks_for(None) == [] and callbacks_for([]) == []
    assert callbacks_for(["none"]) == []


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as err:
        callbacks_for(["csv", "tensorbord"])
    message = str(err.value)
    assert "'tensorbord'" in message
    for name in ("tensorboard", "csv", "mlflow", "wandb", "comet_ml", "codecarbon", "all", "none"):
        assert name in message


def test_unknown_name_fails_fit_before_training(tmp_path, blobs):
    with pytest.raises(ValueError, match="valid names"):
        _fit(tmp_path, blobs, report_to="neptune")


def test_missing_package_names_the_pip_extra(monkeypatch):
    _pretend_missing(monkeypatch, "mlflow", "wandb")
    with pytest.raises(MissingIntegrationError) as err:
        callbacks_for("mlflow")
    assert isinstance(err.value, ImportError)
    assert 'pip install "fitkit[mlflow]"' in str(err.value)
    with pytest.raises(ImportError, match=r"fitkit\[wandb\]"):
        callbacks_for(["csv", "wandb"])


def test_missing_package_fails_fit_with_the_extra(monkeypatch, tmp_path, blobs):
    _pretend_missing(monkeypatch, "comet_ml")
    with pytest.raises(ImportError, match=r"fitkit\[comet_ml\]"):
        _fit(tmp_path, blobs, report_to=["comet_ml"])


def test_all_picks_only_installed_integrations(monkeypatch):
    _pretend_missing(monkeypatch, "mlflow", "wandb", "comet_ml", "codecarbon", "tensorboard")
    assert available_integrations() == ["csv"]
    assert [type(cb).__name__ for cb in callbacks_for("all")] == ["CSVStepLogger"]


def test_all_runs_the_installed_ones(monkeypatch, tmp_path, blobs):
    pytest.importorskip("tensorboard")
    _pretend_missing(monkeypatch, "mlflow", "wandb", "comet_ml", "codecarbon")
    assert [type(cb).__name__ for cb in callbacks_for("all")] == ["CSVStepLogger", "TensorBoardCallback"]
    model = _fit(tmp_path, blobs, report_to="all")
    assert os.path.isfile(tmp_path / "logs.csv")
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "runs"))
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "wandb").exists()
    assert [type(cb).__name__ for cb in model.callbacks] == ["DefaultFlowCallback"]  # per fit, not kept


def test_all_and_names_are_deduplicated(monkeypatch):
    _pretend_missing(monkeypatch, "mlflow", "wandb", "comet_ml", "codecarbon", "tensorboard")
    assert [type(cb).__name__ for cb in callbacks_for(["csv", "all", "CSV"])] == ["CSVStepLogger"]


def test_report_to_rejects_non_names():
    with pytest.raises(TypeError, match="callbacks"):
        callbacks_for([CSVStepLogger()])


# -- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["hub_token", "api_key", "apiKey", "password", "db_passwd", "client_secret",
                                 "AWS_SECRET_ACCESS_KEY", "hubtoken", "auth", "credentials", "private_key"])
def test_secret_looking_keys(key):
    assert looks_secret(key)


@pytest.mark.parametrize("key", ["learning_rate", "output_dir", "tokenizer_name", "num_tokens", "monkey",
                                 "keep_best", "seed", "report_to"])
def test_ordinary_keys(key):
    assert not looks_secret(key)


def test_mask_secrets_walks_nested_values_and_urls():
    value = {
        "learning_rate": 0.1,
        "hub_token": "hf_abc",
        "nested": {"api_key": "k-123", "name": "x", "list": [{"password": "p"}]},
        "storage": "postgresql://bob:hunter2@db.example:5432/optuna",
        "unset_token": None,
    }
    masked = mask_secrets(value)
    assert masked["learning_rate"] == 0.1 and masked["nested"]["name"] == "x"
    assert masked["hub_token"] == MASK and masked["nested"]["api_key"] == MASK
    assert masked["nested"]["list"][0]["password"] == MASK
    assert masked["storage"] == f"postgresql://bob:{MASK}@db.example:5432/optuna"
    assert masked["unset_token"] is None
    assert "hunter2" not in repr(masked) and value["hub_token"] == "hf_abc"  # the input is not changed


@dataclasses.dataclass(frozen=True)
class ArgsWithSecrets(TrainingArguments):
    hub_token: str | None = None
    wandb_api_key: str | None = None


def test_run_params_are_sanitized_and_masked():
    args = ArgsWithSecrets(hub_token="hf_SECRET", wandb_api_key="0123abcd", learning_rate=0.01)
    state = TrainerState(is_hyper_param_search=True, trial_params={"learning_rate": 0.02, "hidden": 8})
    params = run_params(args, state)
    assert params["hub_token"] == MASK and params["wandb_api_key"] == MASK
    assert params["learning_rate"] == 0.02 and params["hidden"] == 8  # the trial's values
    assert all(isinstance(v, (bool, int, float, str)) for v in params.values())
    assert set(params) == set(args.to_dict()) | {"hidden"}
    assert "hf_SECRET" not in repr(params) and "0123abcd" not in repr(params)


# -- CSV step logger ----------------------------------------------------------------------------


def _read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def _same(row, record):
    """A CSV row holds exactly the record (numbers as text), other columns empty."""
    for key, text in row.items():
        if key in record:
            assert math.isclose(float(text), float(record[key]), rel_tol=1e-12), (key, text, record[key])
        else:
            assert text == "", (key, text)


def test_csv_step_logger_writes_every_record(tmp_path, blobs):
    model = _fit(tmp_path, blobs, report_to="csv", logging_strategy="steps", logging_steps=1)
    header, rows = _read_csv(tmp_path / "logs.csv")
    history = model.state.log_history
    assert len(rows) == len(history) > 4  # every step, the epoch averages and the evaluations
    assert header[0] == "step"
    assert set(header) == {k for record in history for k in record}
    for row, record in zip(rows, history):
        _same(row, record)
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def _drive(cb, args, records, world_zero=True):
    state, control = TrainerState(is_world_process_zero=world_zero), TrainerControl()
    cb.on_train_begin(args, state, control)
    for step, logs in records:
        state.global_step = step
        state.log_history.append({**logs, "step": step})
        cb.on_log(args, state, control, logs=dict(logs))
    cb.on_train_end(args, state, control)
    return state


def test_csv_header_widens_when_new_keys_appear(tmp_path):
    path = tmp_path / "sub" / "steps.csv"
    cb = CSVStepLogger(path)
    args = TrainingArguments(output_dir=str(tmp_path))
    records = [(1, {"loss": 1.5}), (2, {"loss": 1.25, "note": "warm"}), (2, {"val_loss": 2.0}), (3, {"loss": 1.0})]
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control)
    headers = []
    for step, logs in records:
        state.global_step = step
        cb.on_log(args, state, control, logs=dict(logs))
        headers.append(_read_csv(path)[0])  # the file is complete after every record
    cb.on_train_end(args, state, control)
    assert headers == [["step", "loss"], ["step", "loss", "note"], ["step", "loss", "note", "val_loss"],
                       ["step", "loss", "note", "val_loss"]]
    _, rows = _read_csv(path)
    assert rows == [
        {"step": "1", "loss": "1.5", "note": "", "val_loss": ""},
        {"step": "2", "loss": "1.25", "note": "warm", "val_loss": ""},
        {"step": "2", "loss": "", "note": "", "val_loss": "2.0"},
        {"step": "3", "loss": "1.0", "note": "", "val_loss": ""},
    ]
    assert sorted(os.listdir(path.parent)) == ["steps.csv"]  # no temporary file left


def test_csv_final_record_completed_at_train_end(tmp_path):
    """Values added to the final record at train end (CodeCarbon does) complete its row."""
    cb = CSVStepLogger()
    args = TrainingArguments(output_dir=str(tmp_path))
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control)
    state.global_step = 4
    state.log_history.append({"loss": 0.5, "step": 4})
    cb.on_log(args, state, control, logs={"loss": 0.5})
    state.log_history[-1]["emissions"] = 1e-6
    cb.on_train_end(args, state, control)
    header, rows = _read_csv(tmp_path / "logs.csv")
    assert header == ["step", "loss", "emissions"]
    assert rows == [{"step": "4", "loss": "0.5", "emissions": "1e-06"}]


def test_loggers_write_nothing_off_world_zero(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path / "out"))
    _drive(CSVStepLogger(), args, [(1, {"loss": 1.0})], world_zero=False)
    assert not (tmp_path / "out").exists()


def test_tracked_values_reach_the_loggers_from_callbacks_with_lower_order(tmp_path, blobs):
    from fitkit import TrainerCallback

    class AddsValue(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs["twice_loss"] = 2 * logs.get("loss", 0.0)

    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path), report_to="csv",
              callbacks=[AddsValue()])
    _, rows = _read_csv(tmp_path / "logs.csv")
    assert float(rows[0]["twice_loss"]) == pytest.approx(2 * float(rows[0]["loss"]))


def test_torch_scalars_count_as_numbers(tmp_path):
    from fitkit.integrations._common import as_number

    assert as_number(torch.tensor(2.5)) == 2.5 and as_number(torch.tensor([3])) == 3
    assert as_number(True) == 1 and as_number("1.0") is None and as_number(torch.ones(2)) is None
    assert as_number(None) is None


def test_report_to_does_not_add_a_tracker_given_as_a_callback(tmp_path, blobs):
    from fitkit import Model
    from fitkit.integrations import CSVStepLogger

    x, y = blobs
    mine = CSVStepLogger(str(tmp_path / "mine.csv"))
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, verbose=0, output_dir=str(tmp_path), report_to="csv", callbacks=[mine])
    assert (tmp_path / "mine.csv").exists() and not (tmp_path / "logs.csv").exists()
