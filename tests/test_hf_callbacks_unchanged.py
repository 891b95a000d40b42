"""transformers' own callbacks run unchanged in `fit`, each checked by what it produced.

They see HF-shaped `args` (every field of HF's `TrainingArguments`) and HF-named values
(`eval_loss`, `eval_accuracy`), through the one view `CallbackHandler` puts in front of any
callback whose class comes from transformers; fitkit's `History` keeps Keras names."""

import dataclasses
import glob
import json
import time

import pytest
from helpers import blobs, mlp

from fitkit import Model
from fitkit.callbacks import CallbackHandler, TrainerCallback
from fitkit.events.hf_view import from_transformers

transformers = pytest.importorskip("transformers")


def _model(lr=0.05):
    return Model(mlp()).compile("sgd", "cross_entropy", ["accuracy"], learning_rate=lr)


def _fit(model, callbacks, **options):
    x, y = blobs(64, 0)
    options = {"epochs": 2, "batch_size": 16, "validation_split": 0.25, "verbose": 0, "seed": 0, **options}
    return model.fit(x, y, callbacks=callbacks, **options)


# -- EarlyStoppingCallback ----------------------------------------------------------------------
@pytest.mark.parametrize("metric", ["loss", "eval_loss", "val_loss", "accuracy", "eval_accuracy", "val_accuracy"])
def test_transformers_early_stopping_stops_with_the_metric_spelled_any_way(metric):
    # learning rate 0: no evaluation improves on the first, so patience 2 stops after epoch 3 of 10
    model = _model(lr=0.0)
    stopper = transformers.EarlyStoppingCallback(early_stopping_patience=2)
    history = _fit(model, [stopper], epochs=10, metric_for_best_model=metric)
    assert model.state.epoch == 3.0
    assert stopper.early_stopping_patience_counter == 2
    key = "val_loss" if metric.endswith("loss") else "val_accuracy"
    assert len(history.history[key]) == 3
    assert model.state.best_metric == pytest.approx(history.history[key][0])


def test_transformers_early_stopping_lets_an_improving_run_finish():
    model = _model(lr=0.05)
    stopper = transformers.EarlyStoppingCallback(early_stopping_patience=1)
    history = _fit(model, [stopper], epochs=4, metric_for_best_model="eval_loss")
    losses = history.history["val_loss"]
    assert all(b < a for a, b in zip(losses, losses[1:]))  # improved at every evaluation
    assert model.state.epoch == 4.0 and stopper.early_stopping_patience_counter == 0


# -- PrinterCallback and ProgressCallback -------------------------------------------------------
def test_transformers_printer_prints_hf_named_records(capsys):
    model = _model()
    history = _fit(model, [transformers.PrinterCallback()])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    evals = [line for line in printed if "'eval_loss'" in line]
    trains = [line for line in printed if "'loss'" in line and "'learning_rate'" in line]
    assert len(evals) == 2 and len(trains) == 2
    assert "'eval_accuracy'" in evals[0] and "'val_loss'" not in "".join(printed)
    assert f"{history.history['val_loss'][-1]:.4g}" in evals[-1]  # HF's format of a float
    assert "val_loss" in history.history and "eval_loss" not in history.history


def test_transformers_progress_callback_draws_its_bar_and_writes_the_logs(capsys):
    model = _model()
    _fit(model, [transformers.ProgressCallback()])
    out, err = capsys.readouterr()
    assert f"{model.state.max_steps}/{model.state.max_steps}" in err  # tqdm's bar ran to max_steps
    assert out.count("'eval_loss'") == 2 and "'eval_accuracy'" in out  # on_log writes the records (tqdm.write)


# -- trackers -------------------------------------------------------------------------------------
def test_transformers_tensorboard_callback_writes_event_files(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    model = _model()
    history = _fit(model, [transformers.integrations.TensorBoardCallback()], output_dir=str(tmp_path / "out"))
    files = glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert files
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert [e.value for e in acc.Scalars("eval/loss")] == pytest.approx(history.history["val_loss"])
    assert [e.value for e in acc.Scalars("eval/accuracy")] == pytest.approx(history.history["val_accuracy"])
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx(history.history["loss"])
    assert [e.step for e in acc.Scalars("eval/loss")] == [3, 6]  # 48 training samples, 16 a batch


def test_transformers_mlflow_callback_logs_to_a_sqlite_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_RUN_ID", "MLFLOW_TAGS", "MLFLOW_RUN_NAME", "HF_MLFLOW_LOG_ARTIFACTS", "MLFLOW_NESTED_RUN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "hf-unchanged")
    model = _model()
    history = _fit(model, [transformers.integrations.MLflowCallback()], output_dir=str(tmp_path / "out"),
                   run_name="hf-run")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("hf-unchanged")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "hf-run" and run.info.status == "FINISHED"
    eval_loss = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval_loss"))
    assert eval_loss == [(3, pytest.approx(history.history["val_loss"][0])),
                         (6, pytest.approx(history.history["val_loss"][1]))]
    params = run.data.params
    assert params["per_device_train_batch_size"] == "16" and params["run_name"] == "hf-run"
    assert params["output_dir"] == str(tmp_path / "out") and params["num_train_epochs"] == "2"


def test_transformers_wandb_callback_writes_an_offline_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "fitkit-hf-tests")
    for name in ("WANDB_DISABLED", "WANDB_RUN_GROUP", "WANDB_WATCH", "WANDB_LOG_MODEL"):
        monkeypatch.delenv(name, raising=False)
    model = _model()
    history = _fit(model, [transformers.integrations.WandbCallback()], output_dir=str(tmp_path / "out"),
                   run_name="hf-wandb")
    wandb.finish()  # HF leaves the run open at train end; a script's exit (or this) closes it
    (run_dir,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    from test_integrations_wandb import read_offline_run  # the .wandb records, as written

    run = read_offline_run(run_dir)
    # The summary record comes from wandb's service process at finish, and on a busy machine it is
    # sometimes not in the file yet (seen once in a full run): wait for it a little, then judge the
    # history rows, which the callback's own logging wrote.
    for _ in range(50):
        if "eval/loss" in run["summary"]:
            break
        time.sleep(0.1)
        run = read_offline_run(run_dir)
    if run["summary"]:
        assert run["summary"]["eval/loss"] == pytest.approx(history.history["val_loss"][-1])
        assert run["summary"]["train/loss"] == pytest.approx(history.history["loss"][-1])
    train_rows = [row for row in run["history"].values() if "train/loss" in row]
    assert train_rows and train_rows[-1]["train/loss"] == pytest.approx(history.history["loss"][-1])
    eval_rows = [row for row in run["history"].values() if "eval/loss" in row]
    assert [row["eval/loss"] for row in eval_rows] == pytest.approx(history.history["val_loss"])
    assert run["config"]["per_device_train_batch_size"] == 16 and run["config"]["run_name"] == "hf-wandb"


# -- the view itself ------------------------------------------------------------------------------
class Recorder(transformers.TrainerCallback):
    """A user's subclass of transformers' TrainerCallback: it gets the HF view too."""

    def __init__(self):
        self.args, self.metrics, self.logs = None, [], []

    def on_train_begin(self, args, state, control, **kwargs):
        self.args = args

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.append(metrics)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(logs)


class FitkitRecorder(TrainerCallback):
    def __init__(self):
        self.args, self.metrics = None, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.args = args

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.append(metrics)


def test_a_transformers_callback_sees_every_hf_argument_with_fitkit_values(tmp_path):
    hf_cb, own = Recorder(), FitkitRecorder()
    model = _model()
    _fit(model, [hf_cb, own], output_dir=str(tmp_path), metric_for_best_model="val_accuracy", logging_dir="tb",
         run_name="r1", learning_rate=0.05)
    args = hf_cb.args
    for f in dataclasses.fields(transformers.TrainingArguments):
        assert hasattr(args, f.name), f.name
    assert (args.output_dir, args.per_device_train_batch_size, args.num_train_epochs) == (str(tmp_path), 16, 2)
    assert args.learning_rate == 0.05 and args.eval_strategy == "epoch" and args.save_strategy == "no"
    assert args.metric_for_best_model == "eval_accuracy" and args.greater_is_better is True
    assert (args.logging_dir, args.run_name, args.report_to) == ("tb", "r1", [])
    assert args.adam_beta1 == 0.9 and args.hub_strategy == "every_save"  # HF's defaults for the rest
    assert args.train_batch_size == 16 and args.world_size == 1 and args.should_log and args.should_save
    assert json.loads(args.to_json_string())["per_device_train_batch_size"] == 16
    assert args.to_sanitized_dict()["train_batch_size"] == 16
    assert [sorted(m) for m in hf_cb.metrics] == [["eval_accuracy", "eval_loss"]] * 2
    assert [sorted(m) for m in own.metrics] == [["val_accuracy", "val_loss"]] * 2  # fitkit's own: Keras names
    assert own.args.metric_for_best_model == "val_accuracy"
    training = [logs for logs in hf_cb.logs if "loss" in logs]
    assert training and {"loss", "learning_rate", "epoch"} <= set(training[0])
    assert "on_train_begin" not in vars(hf_cb)  # nothing patched on the callback


def test_the_view_is_built_once_per_run_and_only_for_transformers_callbacks():
    hf_cb, own = Recorder(), FitkitRecorder()
    handler = CallbackHandler([hf_cb, own])
    assert from_transformers(hf_cb, "on_log") and from_transformers(transformers.PrinterCallback(), "on_log")
    assert not from_transformers(own, "on_log")
    # fitkit's callback is called directly, the transformers one through the view
    listeners = handler.listeners("on_evaluate")
    assert listeners[1] == own.on_evaluate and listeners[0].__wrapped__ == hf_cb.on_evaluate
    seen = []

    class Watch(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(args)

    model = _model()
    _fit(model, [Watch()], epochs=1)
    _fit(model, [Watch()], epochs=1)
    assert len(seen) == 2 * model.state.max_steps
    views = {id(a) for a in seen}
    assert len(views) == 2  # one view per run, not one per event
