"""Searches run wide: several worker processes on one study in a real PostgreSQL server (started
by the `postgres_server` fixture) or a JournalStorage file; workers killed, preempted, and the
server stopped under them. Nothing is mocked: the workers are `tests/scripts/search_worker.py`."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "scripts", "search_worker.py")
ROOT = os.path.dirname(HERE)
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
pytestmark = pytest.mark.slow


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}


def start(storage, output_dir, *args):
    return subprocess.Popen([sys.executable, WORKER, storage, str(output_dir), *map(str, args)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def wait_for(proc, word, timeout=240):
    """Read the worker's output until a line starting with `word`; the lines so far."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker ended before {word!r}:\n" + "".join(lines))
        lines.append(line)
        if line.startswith(word):
            return lines
    raise AssertionError(f"no {word!r} in time:\n" + "".join(lines))


def finished(study):
    return [t for t in study.trials if t.state in FINISHED]


def evals(out, run):
    """(epoch, step) of each evaluation the worker made in `run`'s directory."""
    return [(float(p[2]), int(p[3])) for p in (line.split() for line in out.splitlines())
            if p and p[0] == "EVAL" and p[1] == run]


def test_three_workers_on_an_empty_database_run_exactly_n_trials(postgres_url, tmp_path):
    procs = [start(postgres_url, tmp_path / "runs", "--n-trials", 6, "--epochs", 1) for _ in range(3)]
    results = [finish(p) for p in procs]
    for rc, out in results:
        assert rc == 0, out
    study = optuna.load_study(study_name="search", storage=postgres_url)
    done = finished(study)
    assert len(done) == 6, [(t.number, t.state) for t in study.trials]
    # Two workers may take the last slot at the same instant (likelier on a busy machine): the later
    # trial yields at once, recorded as FAIL with `fitkit_surplus`, before any training (docs/search.md).
    others = [t for t in study.trials if t not in done]
    assert all(t.state == optuna.trial.TrialState.FAIL and t.user_attrs.get("fitkit_surplus")
               and "output_dir" not in t.user_attrs for t in others), [(t.number, t.state, t.user_attrs) for t in others]
    assert len(others) <= 2  # at most one per other worker
    assert len({t.params["learning_rate"] for t in done}) == 6  # each parameter set ran once
    assert sum("BEGIN" in out for _, out in results) >= 2  # the workers shared the trials
    begun = [line.split()[1] for _, out in results for line in out.splitlines() if line.startswith("BEGIN")]
    assert len(begun) == 6, begun  # a surplus trial trained nothing


def test_a_preempted_then_killed_trial_resumes_from_its_checkpoints(postgres_url, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    # the trials are tracked (MLflow in SQLite, TensorBoard): each re-run continues its trial's run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "search")
    tracked = ("--report-to", "mlflow,tensorboard")
    # 96 training samples, batches of 16: 6 steps an epoch, 3 epochs; checkpoints every 4 steps
    first = start(postgres_url, runs, "--n-trials", 2, "--hold", 9, *tracked)
    wait_for(first, "HOLD")
    first.terminate()  # SIGTERM at step 9 (mid-epoch 2): checkpoint-9, trial queued again, exit 143
    rc, out = finish(first)
    assert rc == 143, out
    assert os.path.isdir(runs / "run-0" / "checkpoint-9")
    study = optuna.load_study(study_name="search", storage=postgres_url)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]

    second = start(postgres_url, runs, "--n-trials", 2, "--hold", 14, *tracked)
    lines = wait_for(second, "HOLD")
    second.kill()  # kill -9 at step 14 (mid-epoch 3), after checkpoint-12: trial 1 stays RUNNING
    second.communicate()
    assert "BEGIN run-0 9\n" in lines  # the re-run started from the SIGTERM checkpoint
    assert evals("".join(lines), "run-0")[0][1] > 9  # and reported nothing before it

    rc, out = finish(start(postgres_url, runs, "--n-trials", 2, *tracked))  # heartbeats: trial 1 goes stale
    assert rc == 0, out
    assert "BEGIN run-0 12\n" in out
    study = optuna.load_study(study_name="search", storage=postgres_url)
    done = finished(study)
    assert len(done) == 2
    resumed = next(t for t in done if t.user_attrs.get("resumed_from") is not None)
    assert resumed.user_attrs["output_dir"] == str(runs / "run-0")
    assert sorted(resumed.intermediate_values) == [1, 2, 3]  # each epoch reported once
    _assert_one_tracked_run_per_trial(tmp_path / "mlflow.db", runs)

    # the same configuration uninterrupted, in this process: the same weights and reports
    sys.path.insert(0, os.path.dirname(WORKER))
    try:
        import search_worker
    finally:
        sys.path.pop(0)
    ref_storage = f"sqlite:///{tmp_path / 'ref.db'}"
    search_worker.main([ref_storage, str(tmp_path / "ref"), "--n-trials", "1",
                        "--enqueue", json.dumps({"learning_rate": resumed.params["learning_rate"]})])
    reference = optuna.load_study(study_name="search", storage=ref_storage).trials[0]
    assert resumed.intermediate_values == pytest.approx(reference.intermediate_values, rel=1e-6)
    got, want = torch.load(runs / "run-0" / "final.pt"), torch.load(tmp_path / "ref" / "run-0" / "final.pt")
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-6, atol=1e-7)


def _assert_one_tracked_run_per_trial(database, runs):
    """Preempted, killed and re-run, trial run-0 is one MLflow run (FINISHED) and one TensorBoard
    folder, each evaluation once; the other finished trial is another run."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("search")
    trials = [r for r in client.search_runs([experiment.experiment_id]) if "fitkit.trial" in r.data.tags]
    names = [r.info.run_name for r in trials]
    assert len(names) == 2 and names.count("run-0") == 1  # the other trial's number is the study's to pick
    assert {r.info.status for r in trials} == {"FINISHED"}
    run0 = next(r for r in trials if r.info.run_name == "run-0")
    assert [m.step for m in client.get_metric_history(run0.info.run_id, "val_loss")] == [6, 12, 18]
    acc = EventAccumulator(str(runs / "run-0" / "runs"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("val_loss")] == [6, 12, 18]


def test_the_search_rides_out_a_server_outage(postgres_server, postgres_url, tmp_path):
    worker = start(postgres_url, tmp_path / "runs", "--n-trials", 3, "--sleep", 0.05, "--grace", 30)
    lines = wait_for(worker, "EVAL run-1")
    postgres_server.stop()
    try:
        time.sleep(5)
    finally:
        postgres_server.restart()
    rc, out = finish(worker)
    assert rc == 0, "".join(lines) + out
    study = optuna.load_study(study_name="search", storage=postgres_url)
    assert len(finished(study)) == 3 and len(study.trials) == 3
    assert len({t.params["learning_rate"] for t in study.trials}) == 3


def test_a_server_that_never_comes_back_is_a_clear_error_in_bounded_time(postgres_server, postgres_url, tmp_path):
    from fitkit import Model, TrainerCallback
    from fitkit.search import StorageError

    class Outage(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            if not self.__dict__.get("stopped"):
                self.stopped = time.monotonic()
                postgres_server.stop()

    outage = Outage()
    x = torch.randn(64, 8)
    y = (x[:, 0] > 0).long()
    model = Model(model_init=lambda t: torch.nn.Linear(8, 2)).compile("sgd", "cross_entropy")
    try:
        with pytest.raises(StorageError) as raised:
            model.hyperparameter_search(x, y, validation_split=0.25, n_trials=2, storage=postgres_url, verbose=0,
                                        study_name="gone", callbacks=[outage], storage_retry_timeout=3,
                                        storage_connect_timeout=2, output_dir=str(tmp_path))
        took = time.monotonic() - outage.stopped
    finally:
        postgres_server.restart()
    message = str(raised.value)
    assert "`storage`" in message and "storage_retry_timeout" in message
    assert "connection" in message.lower() and "refused" in message.lower()
    assert took < 3 + 2 * 2 + 10, took  # the bound, a connect timeout, backoff slack


def test_an_unresponsive_host_fails_fast_and_before_fabric_starts(tmp_path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does) and never answers
    port = silent.getsockname()[1]
    script = f"""
import sys, time, torch
from fitkit import Model
from fitkit.search import StorageError
model = Model(model_init=lambda t: torch.nn.Linear(2, 2)).compile("sgd", "mse")
start = time.monotonic()
try:
    model.hyperparameter_search(torch.randn(8, 2), torch.randn(8, 2), n_trials=1, storage_retry_timeout=0,
                                storage="postgresql+psycopg2://u:secret@127.0.0.1:{port}/db", storage_connect_timeout=1)
except StorageError as error:
    print("ERROR", round(time.monotonic() - start, 1), "lightning_fabric" in sys.modules, error)
"""
    try:
        out = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True,
                             timeout=120).stdout
    finally:
        silent.close()
    assert out.startswith("ERROR"), out
    _, took, fabric_imported, *message = out.split()
    assert float(took) < 10 and fabric_imported == "False", out
    assert "`storage`" in out and "secret" not in out and "timeout" in out.lower()


def test_journal_storage_two_workers_exact_count(tmp_path):
    journal = str(tmp_path / "journal.log")
    procs = [start(journal, tmp_path / "runs", "--journal", "--n-trials", 4, "--epochs", 1) for _ in range(2)]
    for proc in procs:
        rc, out = finish(proc)
        assert rc == 0, out
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
    study = optuna.load_study(study_name="search", storage=storage)
    assert len(finished(study)) == 4 and len(study.trials) == 4
