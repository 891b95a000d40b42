"""What the trackers show across a crash and a resume, read back with their own readers:
TensorBoard's EventAccumulator, MLflow's MlflowClient over a SQLite store, the CSV files.

One uninterrupted run is the reference. Three runs are interrupted at step 7 (an exception
raised from a callback; SIGTERM sent in-process; SIGKILL in a child process, tests/scripts/
tracked_kill.py) and resumed with `resume_from_checkpoint`.
Steps 1-7 and 8-12 train bit-identical weights, so every logged value equals the reference's:
each tracker must hold one run, each step once, the reference's values, and the right status.
"""

import csv
import glob
import os
import signal
import subprocess
import sys

import pytest
import torch

from fitkit import Model, TrainerCallback
from fitkit.callbacks import CSVLogger
from tests.helpers import blobs, mlp

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

STEPS = 12  # 2 epochs of 6 steps
LOGGED = [2, 4, 6, 8, 10, 12]  # logging_steps=2


class Interrupt(TrainerCallback):
    """At the end of step `step`: raise, or send SIGTERM (as a scheduler would) or SIGKILL to
    this process."""

    def __init__(self, how, step=7):
        self.how, self.step = how, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            if self.how == "exception":
                raise RuntimeError("boom at step 7")
            os.kill(os.getpid(), signal.SIGKILL if self.how == "kill" else signal.SIGTERM)


def _fit(out, uri, experiment, *, callbacks=(), resume=False):
    os.environ["MLFLOW_TRACKING_URI"] = uri
    os.environ["MLFLOW_EXPERIMENT_NAME"] = experiment
    x, y = blobs(24, seed=0)
    model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, batch_size=4, epochs=2, seed=3, verbose=0, output_dir=str(out), logging_strategy="steps",
              logging_steps=2, save_strategy="steps", save_steps=4, report_to=["tensorboard", "mlflow", "csv"],
              callbacks=[CSVLogger(str(out / "epochs.csv")), *callbacks], resume_from_checkpoint=resume)
    return model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The reference run and the two interrupted-then-resumed ones, with the MLflow status each
    interrupted run had before its resume."""
    tmp = tmp_path_factory.mktemp("tracking")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as env:  # _fit sets MLflow's variables; undone on leaving
        env.setenv("MLFLOW_TRACKING_URI", "")  # records the variable's state, so leaving undoes what the test sets
        env.delenv("MLFLOW_TRACKING_URI")
        env.setenv("MLFLOW_EXPERIMENT_NAME", "")  # records the variable's state, so leaving undoes what the test sets
        env.delenv("MLFLOW_EXPERIMENT_NAME")
        found = {"reference": (tmp / "reference", _fit(tmp / "reference", uri, "reference"), None)}
        client = MlflowClient(tracking_uri=uri)
        for how, stop in (("exception", RuntimeError), ("sigterm", SystemExit)):
            out = tmp / how
            with pytest.raises(stop):
                _fit(out, uri, how, callbacks=[Interrupt(how)])
            (interrupted,) = _mlflow_runs(client, how)
            model = _fit(out, uri, how, resume=True)
            found[how] = (out, model, interrupted.info.status)
        out = tmp / "kill"
        script = os.path.join(os.path.dirname(__file__), "scripts", "tracked_kill.py")
        proc = subprocess.run([sys.executable, script, str(out), uri, "kill"], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
        (interrupted,) = _mlflow_runs(client, "kill")
        found["kill"] = (out, _fit(out, uri, "kill", resume=True), interrupted.info.status)
    return uri, found


def _mlflow_runs(client, experiment):
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id])


def _tb(out, tag):
    acc = EventAccumulator(str(out / "runs"), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _reference_losses(runs):
    out, model, _ = runs[1]["reference"]
    return [(r["step"], r["loss"]) for r in model.state.log_history if "loss" in r]


def test_one_record_per_logging_step_in_an_uninterrupted_run(runs):
    """logging_strategy="steps": each logging step once, no epoch-mean record at an epoch's last step."""
    out, model, _ = runs[1]["reference"]
    losses = _reference_losses(runs)
    assert [step for step, _ in losses] == LOGGED
    assert [step for step, _ in _tb(out, "loss")] == LOGGED
    assert [step for step, _ in _tb(out, "learning_rate")] == LOGGED


@pytest.mark.parametrize("how, status", [("exception", "FAILED"), ("sigterm", "KILLED"), ("kill", "RUNNING")])
def test_mlflow_continues_the_run_once_per_step(runs, how, status):
    uri, found = runs
    _, model, before = found[how]
    assert before == status  # ended as it ended, in this very process (kill -9 leaves it RUNNING)
    client = MlflowClient(tracking_uri=uri)
    (run,) = _mlflow_runs(client, how)  # the resume continued it: still one run
    assert run.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert history == [(step, pytest.approx(value, abs=1e-6)) for step, value in _reference_losses(runs)]
    assert model.state.global_step == STEPS


@pytest.mark.parametrize("how", ["exception", "sigterm", "kill"])
def test_tensorboard_holds_each_step_once_with_the_reference_values(runs, how):
    uri, found = runs
    out, model, _ = found[how]
    reference_dir = found["reference"][0]
    for tag in ("loss", "learning_rate"):
        got, want = _tb(out, tag), _tb(reference_dir, tag)
        assert [s for s, _ in got] == [s for s, _ in want] == LOGGED, tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-6), tag


@pytest.mark.parametrize("how", ["exception", "sigterm", "kill"])
def test_csv_files_equal_the_uninterrupted_run(runs, how):
    uri, found = runs
    out, _, _ = found[how]
    reference_dir = found["reference"][0]

    def rows(path, drop=()):
        with open(path, newline="") as f:
            return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]

    # one row per epoch (Keras), and one per log record (report_to="csv"), as in the reference
    assert rows(out / "epochs.csv") == rows(reference_dir / "epochs.csv")
    closing = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss")
    mine = [r for r in rows(out / "logs.csv", closing) if r.get("loss")]
    theirs = [r for r in rows(reference_dir / "logs.csv", closing) if r.get("loss")]
    assert [r["step"] for r in mine] == [str(s) for s in LOGGED]
    assert [float(r["loss"]) for r in mine] == pytest.approx([float(r["loss"]) for r in theirs], abs=1e-6)


def test_the_checkpoint_records_each_trackers_run(runs):
    import json

    uri, found = runs
    out, _, _ = found["exception"]
    with open(out / "checkpoint-4" / "trainer_state.json") as f:
        saved = json.load(f)["stateful_callbacks"]
    (run,) = _mlflow_runs(MlflowClient(tracking_uri=uri), "exception")
    assert saved["MLflowCallback"]["run"]["run_id"] == run.info.run_id
    assert saved["TensorBoardCallback"]["run"]["log_dir"] == str((out / "runs").resolve())


def test_weights_equal_the_uninterrupted_run(runs):
    _, found = runs
    reference = found["reference"][1]
    for how in ("exception", "sigterm", "kill"):
        for a, b in zip(found[how][1].module.parameters(), reference.module.parameters()):
            assert torch.equal(a, b), how


def test_wandb_and_comet_offline_continue_the_run_and_mark_the_failure(tmp_path, monkeypatch):
    """Offline W&B and Comet: the resumed run has the interrupted run's id / experiment key; the
    interrupted one ended as failed (W&B exit code 1, Comet's `fitkit_status`)."""
    pytest.importorskip("wandb")
    pytest.importorskip("comet_ml")
    from wandb.proto import wandb_internal_pb2

    from tests.test_integrations_comet import read_archive
    from tests.test_integrations_wandb import _records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("COMET_MODE", "OFFLINE")
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # no error reports over the network
    for name in ("WANDB_DIR", "WANDB_RUN_ID", "WANDB_DISABLED", "COMET_EXPERIMENT_KEY", "COMET_OFFLINE_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    x, y = blobs(24, seed=0)

    def fit(**options):
        model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=1e-2)
        model.fit(x, y, batch_size=4, epochs=2, seed=3, verbose=0, output_dir=str(tmp_path), logging_steps=2,
                  logging_strategy="steps", save_strategy="steps", save_steps=4, report_to=["wandb", "comet_ml"],
                  **options)

    with pytest.raises(RuntimeError):
        fit(callbacks=[Interrupt("exception")])
    fit(resume_from_checkpoint=True)

    def exit_code(run_file):
        for raw in _records(run_file):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == "exit":
                return record.exit.exit_code
        return None

    run_files = sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb")), key=os.path.getmtime)
    assert {os.path.basename(f) for f in run_files} == {os.path.basename(run_files[0])}  # one run id
    if len(run_files) == 2:  # wandb reuses the folder when both start within the same second
        assert exit_code(run_files[0]) == 1
    assert exit_code(run_files[-1]) == 0

    archives = sorted(glob.glob(str(tmp_path / "comet" / "*.zip")), key=os.path.getmtime)
    read = [read_archive(a) for a in archives]
    assert len(read) == 2 and read[1]["experiment"]["offline_id"] == read[0]["experiment"]["offline_id"]
    assert read[1]["experiment"]["resume_strategy"] == "get"  # Comet's "continue this experiment"
    assert [r["others"].get("fitkit_status") for r in read] == ["failed", "finished"]


def _fit_by_epochs(out, callbacks=(), resume=False, save_steps=4):
    """Epoch logging and evaluation, TensorBoard only."""
    x, y = blobs(32, seed=0)
    model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x[:24], y[:24], validation_data=(x[24:], y[24:]), batch_size=4, epochs=2, seed=3, verbose=0,
              output_dir=str(out), logging_strategy="epoch", eval_strategy="epoch", save_strategy="steps",
              save_steps=save_steps, report_to="tensorboard", callbacks=list(callbacks), resume_from_checkpoint=resume)
    return model


@pytest.fixture(scope="module")
def by_epochs(tmp_path_factory):
    out = tmp_path_factory.mktemp("by-epochs")
    _fit_by_epochs(out)
    return out


@pytest.mark.parametrize("at", [7, 6], ids=["mid-epoch", "epoch's-last-step"])
def test_a_preempted_epoch_is_logged_and_evaluated_once_by_its_resume(by_epochs, tmp_path, at):
    """SIGTERM mid-epoch logged no partial-epoch record or evaluation at the SIGTERM step, and at an
    epoch's last step the epoch's record and evaluation came twice (before and after the resume)."""
    with pytest.raises(SystemExit):
        _fit_by_epochs(tmp_path, [Interrupt("sigterm", step=at)])
    model = _fit_by_epochs(tmp_path, resume=True)
    for tag in ("loss", "val_loss"):
        got, want = _tb(tmp_path, tag), _tb(by_epochs, tag)
        assert [s for s, _ in got] == [s for s, _ in want] == [6, 12], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-6), tag
    assert [r["step"] for r in model.state.log_history if "val_loss" in r] == [6, 12]


def test_ctrl_c_ends_the_run_killed_and_another_run_name_starts_a_fresh_one(runs, tmp_path, monkeypatch):
    uri, _ = runs
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):  # `_fit` sets them: restored after the test
        monkeypatch.setenv(name, "")

    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, uri, "fresh", callbacks=[CtrlC()])
    client = MlflowClient(tracking_uri=uri)
    (first,) = _mlflow_runs(client, "fresh")
    assert first.info.status == "KILLED"
    monkeypatch.setenv("MLFLOW_RUN_NAME", "fresh")
    _fit(tmp_path, uri, "fresh", resume=True)  # from checkpoint-4, into a new run named "fresh"
    second = next(r for r in _mlflow_runs(client, "fresh") if r.info.run_id != first.info.run_id)
    assert second.info.run_name == "fresh" and second.info.status == "FINISHED"
    assert client.get_run(first.info.run_id).info.status == "KILLED"  # left as it ended
    assert [m.step for m in client.get_metric_history(second.info.run_id, "loss")] == [6, 8, 10, 12]


def test_records_of_the_checkpoint_step_logged_after_the_checkpoint_are_there_once(by_epochs, tmp_path):
    """checkpoint-6 is written at step 6, before that epoch's end logs and evaluates at step 6; a
    crash at step 7 and the resume (which ends epoch 1 again) must leave one step-6 record."""
    with pytest.raises(RuntimeError):
        _fit_by_epochs(tmp_path, [Interrupt("exception", step=7)], save_steps=6)
    _fit_by_epochs(tmp_path, resume=True, save_steps=6)
    for tag in ("loss", "val_loss"):
        got, want = _tb(tmp_path, tag), _tb(by_epochs, tag)
        assert [s for s, _ in got] == [s for s, _ in want] == [6, 12], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-6), tag


def test_a_resumed_runs_event_file_is_read_after_the_interrupted_ones(tmp_path):
    """TensorBoard reads a folder's event files in name order (second, host, process id, counter):
    a run resumed in the same second, or by a process of a smaller id, must still come last."""
    from torch.utils.tensorboard import SummaryWriter

    from fitkit.integrations.tensorboard import _read_last

    interrupted = SummaryWriter(log_dir=str(tmp_path))
    interrupted.add_scalar("loss", 1.0, 6)
    interrupted.close()
    (earlier,) = os.listdir(tmp_path)
    os.replace(tmp_path / earlier, tmp_path / "events.out.tfevents.9999999999.host.99999.9")  # sorts after any
    resumed = SummaryWriter(log_dir=str(tmp_path), purge_step=6)
    _read_last(resumed, str(tmp_path))
    resumed.add_scalar("loss", 2.0, 6)
    resumed.add_scalar("loss", 3.0, 12)
    resumed.close()
    assert sorted(os.listdir(tmp_path))[0].endswith(".host.99999.9")  # the interrupted run's, read first
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(6, 2.0), (12, 3.0)]
