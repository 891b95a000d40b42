"""CometCallback in offline mode: the archive (a zip of JSON messages) is read back."""

import dataclasses
import glob
import json
import zipfile

import pytest
from helpers import mlp

pytest.importorskip("comet_ml")

from fitkit import Model, TrainingArguments
from fitkit.integrations._common import MASK


def read_archive(path):
    """{"experiment": {...}, "params": {...}, "metrics": {name: [(step, value)]}, "others": {...}}"""
    with zipfile.ZipFile(path) as z:
        experiment = json.loads(z.read("experiment.json"))
        lines = z.read("messages.json").decode().splitlines()
    params, metrics, others = {}, {}, {}
    for line in lines:
        message = json.loads(line)
        payload = message["payload"]
        if message["type"] == "parameter_msg" and payload["param"]["source"] == "manual":
            params[payload["param"]["paramName"]] = payload["param"]["paramValue"]
        elif message["type"] == "metric_msg":
            m = payload["metric"]
            metrics.setdefault(m["metricName"], []).append((m["step"], m["metricValue"]))
        elif message["type"] == "log_other":
            others[payload["key"]] = payload["value"]
    return {"experiment": experiment, "params": params, "metrics": metrics, "others": others}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("COMET_MODE", "OFFLINE")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_PROJECT_NAME", "fitkit-tests")
    monkeypatch.delenv("COMET_LOG_ASSETS", raising=False)


@dataclasses.dataclass(frozen=True)
class ArgsWithKey(TrainingArguments):
    comet_api_key: str | None = None


def test_offline_archive_holds_parameters_and_metrics(tmp_path, blobs):
    x, y = blobs
    args = ArgsWithKey(output_dir=str(tmp_path / "out"), comet_api_key="SECRET-COMET-KEY", learning_rate=0.002,
                       num_train_epochs=2, per_device_train_batch_size=60, verbose=0, report_to="comet_ml")
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
    model.fit(x, y, validation_split=0.25, args=args)
    archives = glob.glob(str(tmp_path / "comet" / "*.zip"))
    assert len(archives) == 1
    archive = read_archive(archives[0])
    assert archive["experiment"]["project_name"] == "fitkit-tests"
    assert archive["params"]["learning_rate"] == 0.002 and archive["params"]["num_train_epochs"] == 2
    assert archive["params"]["comet_api_key"] == MASK
    history = model.state.log_history
    for key in ("loss", "val_loss", "accuracy", "val_accuracy", "learning_rate"):
        logged = [(r["step"], r[key]) for r in history if key in r]
        assert archive["metrics"][key] == [(s, pytest.approx(v, rel=1e-12)) for s, v in logged], key
    with zipfile.ZipFile(archives[0]) as z:
        assert all(b"SECRET-COMET-KEY" not in z.read(name) for name in z.namelist())


def test_search_trials_are_named_experiments(tmp_path, blobs):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x, y = blobs
    model = Model(model_init=lambda trial: mlp()).compile("adam", "cross_entropy")
    model.hyperparameter_search(
        x, y, validation_split=0.25, n_trials=2,
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1)},
        report_to="comet_ml", output_dir=str(tmp_path / "search"), verbose=0, batch_size=60,
    )
    archives = [read_archive(p) for p in glob.glob(str(tmp_path / "comet" / "*.zip"))]
    assert sorted(a["others"]["Name"] for a in archives) == ["run-0", "run-1"]
    for a in archives:
        assert a["metrics"]["learning_rate"] == [(3, pytest.approx(a["params"]["learning_rate"]))]


def test_comet_disabled_writes_nothing(monkeypatch, tmp_path, blobs):
    monkeypatch.setenv("COMET_MODE", "DISABLED")
    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy").fit(
        x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path / "out"), report_to="comet_ml")
    assert not (tmp_path / "comet").exists()


def test_bad_comet_mode_is_named(monkeypatch):
    from fitkit.integrations import CometCallback

    monkeypatch.setenv("COMET_MODE", "sometimes")
    with pytest.raises(ValueError, match="COMET_MODE"):
        CometCallback()
