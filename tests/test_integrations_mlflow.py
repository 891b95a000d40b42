"""MLflowCallback, read back with MLflow's own MlflowClient."""

import dataclasses
import os

import pytest
import torch
from helpers import mlp

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient

from fitkit import Model, TrainingArguments
from fitkit.integrations._common import MASK, run_params
from fitkit.integrations.mlflow import _limits, default_tracking_uri


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS", "MLFLOW_RUN_NAME",
                 "HF_MLFLOW_LOG_ARTIFACTS", "MLFLOW_LOG_ARTIFACTS", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.setenv(name, "")  # so that teardown restores the original value
        monkeypatch.delenv(name)


def _runs(uri, experiment="fitkit"):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} in {uri}"
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def _history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@dataclasses.dataclass(frozen=True)
class ArgsWithSecrets(TrainingArguments):
    hub_token: str | None = None
    notes: str = ""


def test_params_and_metrics_equal_what_was_logged(tmp_path, blobs):
    x, y = blobs
    args = ArgsWithSecrets(output_dir=str(tmp_path), hub_token="hf_TOPSECRET", notes="n" * 7000,
                           learning_rate=0.004, num_train_epochs=3, per_device_train_batch_size=60, verbose=0,
                           report_to="mlflow")
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
    model.fit(x, y, validation_split=0.25, args=args)
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # the default local store opted in
    client, runs = _runs(default_tracking_uri(str(tmp_path)))
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    max_len = _limits()[0]
    used = args.replace(eval_strategy="epoch")  # what fit ran with (validation data -> epoch evaluation)
    want = {k: str(v)[:max_len] for k, v in run_params(used).items()}
    assert run.data.params == want
    assert run.data.params["hub_token"] == MASK and run.data.params["learning_rate"] == "0.004"
    assert len(run.data.params["notes"]) == max_len < 7000
    history = model.state.log_history
    for key in ("loss", "val_loss", "accuracy", "val_accuracy", "learning_rate", "epoch"):
        want = sorted((r["step"], float(r[key])) for r in history if key in r)
        assert _history(client, run.info.run_id, key) == want, key
    assert [s for s, _ in _history(client, run.info.run_id, "val_loss")] == [3, 6, 9]


def test_tracking_uri_experiment_and_tags_from_env(monkeypatch, tmp_path, blobs):
    uri = (tmp_path / "elsewhere").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "digits")
    monkeypatch.setenv("MLFLOW_TAGS", '{"team": "vision"}')
    monkeypatch.setenv("MLFLOW_RUN_NAME", "baseline")
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path / "out"), report_to="mlflow")
    assert not (tmp_path / "out" / "mlruns").exists()
    client, runs = _runs(uri, "digits")
    assert len(runs) == 1
    assert runs[0].data.tags["team"] == "vision" and runs[0].info.run_name == "baseline"
    assert _history(client, runs[0].info.run_id, "loss") == [(4, pytest.approx(model.history.history["loss"][0]))]


def test_final_model_logged_as_artifact_when_asked(monkeypatch, tmp_path, blobs):
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path), report_to="mlflow")
    client, runs = _runs(default_tracking_uri(str(tmp_path)))
    run_id = runs[0].info.run_id
    assert [a.path for a in client.list_artifacts(run_id, "model")] == ["model/model_state_dict.pt"]
    local = client.download_artifacts(run_id, "model/model_state_dict.pt", str(tmp_path / "dl"))
    saved = torch.load(local, weights_only=True)
    current = model.module.state_dict()
    assert saved.keys() == current.keys()
    assert all(torch.equal(saved[k], current[k]) for k in current)


def test_no_artifact_by_default(tmp_path, blobs):
    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy").fit(
        x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path), report_to="mlflow")
    client, runs = _runs(default_tracking_uri(str(tmp_path)))
    assert client.list_artifacts(runs[0].info.run_id) == []


def test_search_nests_one_run_per_trial_under_a_parent(monkeypatch, tmp_path, blobs):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    uri = (tmp_path / "store").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    x, y = blobs
    model = Model(model_init=lambda trial: mlp()).compile("adam", "cross_entropy")
    model.hyperparameter_search(
        x, y, validation_split=0.25, n_trials=2,
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1)},
        report_to=["mlflow"], output_dir=str(tmp_path / "search"), verbose=0, batch_size=60,
    )
    client, runs = _runs(uri)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert sorted(c.info.run_name for c in children) == ["run-0", "run-1"]
    assert all(c.info.status == "FINISHED" for c in children)
    rates = []
    for child in children:
        lr = float(child.data.params["learning_rate"])
        assert child.data.params["output_dir"].endswith(child.info.run_name)
        assert [v for _, v in _history(client, child.info.run_id, "learning_rate")] == [pytest.approx(lr)]
        assert len(_history(client, child.info.run_id, "val_loss")) == 1
        rates.append(lr)
    assert rates[0] != rates[1]


def test_run_nests_under_the_users_active_run(monkeypatch, tmp_path, blobs):
    import mlflow

    uri = (tmp_path / "store").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        experiment_id = MlflowClient(tracking_uri=uri).create_experiment("fitkit")
        with mlflow.start_run(run_name="outer", experiment_id=experiment_id) as outer:
            x, y = blobs
            Model(mlp()).compile("adam", "cross_entropy").fit(
                x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path), report_to="mlflow")
            assert mlflow.active_run().info.run_id == outer.info.run_id  # the user's run is left alone
    finally:
        mlflow.set_tracking_uri(previous)
    _, runs = _runs(uri)
    inner = [r for r in runs if r.info.run_id != outer.info.run_id]
    assert len(runs) == 2 and len(inner) == 1
    assert inner[0].data.tags["mlflow.parentRunId"] == outer.info.run_id
    assert inner[0].info.status == "FINISHED" and "loss" in inner[0].data.metrics
