"""WandbCallback in offline mode: the run file is read back record by record.

wandb writes an offline run as `run-<id>.wandb`: a LevelDB-style log (a 7-byte `:W&B` header,
then 32 KiB blocks of records, each `crc32 | length | type` + data) whose records are wandb's
own protobuf `Record` messages. wandb ships no Python reader for it any more, so the framing
is read here and each record is parsed with `wandb.proto.wandb_internal_pb2.Record`.
"""

import dataclasses
import glob
import json
import os
import pathlib
import struct

import pytest
from helpers import mlp

pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2

from fitkit import Model, TrainerCallback, TrainingArguments
from fitkit.integrations._common import MASK

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path):
    data = pathlib.Path(path).read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def _key(item):
    return item.key or "/".join(item.nested_key)


def read_offline_run(run_dir):
    """{"run": Record.run or None (not always written), "config": {...}, "history": {step: {...}}, "summary": {...}}"""
    files = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    assert len(files) == 1, files
    out = {"run": None, "config": {}, "history": {}, "summary": {}}
    for raw in _records(files[0]):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({_key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {_key(i): json.loads(i.value_json) for i in record.history.item}
            out["history"].setdefault(record.history.step.num, {}).update(row)
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in record.summary.update})
    return out


class LiveRun(TrainerCallback):
    """The W&B run fitkit started, read while it is live (user callbacks end before the trackers):
    wandb does not always write its `run` record (project, name, group) into an offline run's
    file on a busy machine, so those are checked here, not in the file."""

    def __init__(self):
        self.runs = []

    def on_train_end(self, args, state, control, **kwargs):
        import wandb

        run = wandb.run
        self.runs.append({"project": run.project, "name": run.name, "group": run.group})


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "fitkit-tests")
    for name in ("WANDB_DIR", "WANDB_DISABLED", "WANDB_RUN_GROUP", "WANDB_WATCH"):
        monkeypatch.delenv(name, raising=False)


@dataclasses.dataclass(frozen=True)
class ArgsWithKey(TrainingArguments):
    wandb_api_key: str | None = None


def test_offline_run_holds_config_history_and_summary(tmp_path, blobs):
    x, y = blobs
    args = ArgsWithKey(output_dir=str(tmp_path), wandb_api_key="0123456789abcdef", learning_rate=0.003,
                       num_train_epochs=2, per_device_train_batch_size=60, verbose=0, report_to="wandb")
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
    live = LiveRun()
    model.fit(x, y, validation_split=0.25, args=args, callbacks=[live])
    run_dirs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(run_dirs) == 1
    run = read_offline_run(run_dirs[0])
    assert [r["project"] for r in live.runs] == ["fitkit-tests"]
    config = run["config"]
    assert config["learning_rate"] == 0.003 and config["num_train_epochs"] == 2
    assert config["wandb_api_key"] == MASK
    history = model.state.log_history
    for key in ("loss", "val_loss", "accuracy", "val_accuracy", "learning_rate"):
        logged = [(r["step"], r[key]) for r in history if key in r]
        written = [(step, row[key]) for step, row in sorted(run["history"].items()) if key in row]
        assert written == [(s, pytest.approx(v, rel=1e-12)) for s, v in logged], key
    assert sorted(run["history"]) == [3, 6]
    final = {k: v for k, v in history[-1].items() if k not in ("step", "epoch")}
    final["loss"] = [r for r in history if "loss" in r][-1]["loss"]
    for key, value in final.items():
        assert run["summary"][key] == pytest.approx(value, rel=1e-12), key
    raw = b"".join(pathlib.Path(f).read_bytes() for f in glob.glob(os.path.join(run_dirs[0], "**", "*"), recursive=True)
                   if os.path.isfile(f))
    assert b"0123456789abcdef" not in raw


def test_wandb_dir_and_search_trials_are_separate_runs(monkeypatch, tmp_path, blobs):
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    x, y = blobs
    model = Model(model_init=lambda trial: mlp()).compile("adam", "cross_entropy")
    live = LiveRun()
    model.hyperparameter_search(
        x, y, validation_split=0.25, n_trials=2,
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1)},
        report_to="wandb", output_dir=str(tmp_path / "search"), verbose=0, batch_size=60, callbacks=[live],
    )
    run_dirs = sorted(glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*")))
    assert len(run_dirs) == 2
    runs = [read_offline_run(d) for d in run_dirs]
    assert sorted(r["name"] for r in live.runs) == ["run-0", "run-1"]
    assert {r["group"] for r in live.runs} == {"search-search"}
    for r in runs:
        assert r["history"][3]["learning_rate"] == pytest.approx(r["config"]["learning_rate"])
    assert runs[0]["config"]["learning_rate"] != runs[1]["config"]["learning_rate"]


def test_wandb_disabled_writes_nothing(monkeypatch, tmp_path, blobs):
    monkeypatch.setenv("WANDB_DISABLED", "true")
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path), report_to="wandb")
    assert not (tmp_path / "wandb").exists()
    assert model.history.history["loss"]


def test_wandb_mode_disabled_writes_nothing(monkeypatch, tmp_path, blobs):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path), report_to="wandb")
    assert glob.glob(str(tmp_path / "wandb" / "*run-*")) == []
