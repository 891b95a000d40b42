"""Checkpoints: atomic, complete, and a resumed run continues exactly (also mid-epoch)."""

import json
import os

import pytest
import torch
from helpers import Crash, Pairs, training_records

from fitkit import Model, TrainerCallback
from fitkit.engine.checkpoint import layout, listing, verify
from fitkit.engine.checkpoint.writing import file_digest


def _net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 3))


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = torch.randint(0, 3, (96,), generator=g)
    return x, y


class _StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True



class _CrashAt(_StopAt):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Crash(f"simulated crash at step {self.step}")


class _StartStep(TrainerCallback):
    """The step a run starts from (more than 0 only when it resumed)."""

    step = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.step = state.global_step


def _fit(out, form, seed=0, callbacks=(), **options):
    x, y = _data()
    model = Model(_net(seed)).compile("adam", "cross_entropy", ["accuracy"], learning_rate=1e-2,
                                      gradient_accumulation_steps=2)
    if form == "tensors":
        data = dict(x=x, y=y)
    elif form == "dataset":
        data = dict(x=Pairs(x, y))
    else:  # a user's shuffling DataLoader: its order comes from the global RNG
        data = dict(x=torch.utils.data.DataLoader(Pairs(x, y), batch_size=8, shuffle=True))
    model.fit(**data, batch_size=8, epochs=3, seed=7, verbose=0, output_dir=str(out), logging_strategy="steps",
              logging_steps=1, validation_data=(x[:20], y[:20]), callbacks=list(callbacks), **options)
    return model


@pytest.mark.parametrize("form", ["tensors", "dataset", "dataloader"])
@pytest.mark.parametrize("save", [{"save_strategy": "steps", "save_steps": 4},  # step 8: mid-epoch 2
                                  {"save_strategy": "steps", "save_steps": 6},  # step 6: epoch boundary
                                  {"save_strategy": "epoch"}])
def test_resumed_run_equals_the_uninterrupted_one(tmp_path, form, save):
    full = _fit(tmp_path / "full", form, **save)
    with pytest.raises(Crash):
        _fit(tmp_path / "cut", form, callbacks=[_CrashAt(10)], **save)
    newest = listing.list_checkpoints(str(tmp_path / "cut"))[-1]
    start = _StartStep()
    resumed = _fit(tmp_path / "cut", form, seed=99, resume_from_checkpoint=True, callbacks=[start],  # other init
                   **save)
    assert start.step == int(newest.rsplit("-", 1)[1]) > 0  # it continued from the newest checkpoint
    assert int(newest.rsplit("-", 1)[1]) < 10
    assert resumed.state.global_step == full.state.global_step == 18
    assert training_records(resumed.state.log_history) == training_records(full.state.log_history)  # every value
    assert resumed.history.history == full.history.history
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)


def test_checkpoint_layout_and_manifest(tmp_path):
    model = _fit(tmp_path, "tensors", save_strategy="epoch")
    names = sorted(os.listdir(tmp_path))
    assert names == ["checkpoint-12", "checkpoint-18", "checkpoint-6"]
    path = tmp_path / "checkpoint-18"
    manifest = json.loads((path / layout.MANIFEST).read_text())
    assert manifest["format"] == "fitkit-checkpoint" and manifest["global_step"] == 18
    assert set(manifest["files"]) == {"state.pt", "trainer_state.json", "training_args.json"}
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["global_step"] == 18 and "TrainerControl" in state["stateful_callbacks"]
    assert json.loads((path / "training_args.json").read_text())["save_strategy"] == "epoch"
    payload = torch.load(path / "state.pt", weights_only=True)
    assert {"model", "optimizer", "rng", "loop"} <= set(payload)
    assert payload["loop"]["epoch"] == 3 and payload["loop"]["batch"] == 0
    assert model.last_checkpoint == str(path)


def test_resume_skips_incomplete_checkpoints(tmp_path, caplog):
    _fit(tmp_path, "tensors", save_strategy="epoch", callbacks=[_StopAt(12)])
    # a crash mid-save: a newer directory without manifest, and a leftover temporary one
    broken = tmp_path / "checkpoint-15"
    broken.mkdir()
    (broken / "state.pt").write_bytes(b"half a file")
    (tmp_path / ".tmp-checkpoint-16").mkdir()
    # a truncated file in a checkpoint with a manifest is not complete either
    truncated = tmp_path / "checkpoint-14"
    import shutil

    shutil.copytree(tmp_path / "checkpoint-12", truncated)
    with open(truncated / "state.pt", "r+b") as f:
        f.truncate(100)
    with caplog.at_level("WARNING", logger="fitkit"):
        path = verify.resolve(True, str(tmp_path))
    assert path == str(tmp_path / "checkpoint-12")
    assert "checkpoint-15" in caplog.text and "checkpoint-14" in caplog.text


def test_bad_resume_paths_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"`resume_from_checkpoint`=.*nope.* does not exist"):
        _fit(tmp_path, "tensors", resume_from_checkpoint=str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"is not a complete fitkit checkpoint: expected a directory holding"):
        _fit(tmp_path, "tensors", resume_from_checkpoint=str(tmp_path / "empty"))


def test_resume_true_without_checkpoints_starts_fresh(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="fitkit"):
        model = _fit(tmp_path, "tensors", resume_from_checkpoint=True)
    assert model.state.global_step == 18 and "starting fresh" in caplog.text


def test_poisoned_checkpoint_is_refused_and_its_code_never_runs(tmp_path):
    _fit(tmp_path, "tensors", save_strategy="epoch", callbacks=[_StopAt(6)])
    path = tmp_path / "checkpoint-6"
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    good = torch.load(path / "state.pt", weights_only=True)
    good["evil"] = Payload()
    torch.save(good, path / "state.pt")
    manifest = json.loads((path / layout.MANIFEST).read_text())
    manifest["files"]["state.pt"] = os.path.getsize(path / "state.pt")
    # digests guard against corruption, not an attacker who rewrites them: weights-only loading does
    manifest["digests"]["state.pt"] = file_digest(str(path / "state.pt"))
    (path / layout.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="refusing to load .*state.pt.*weights-only"):
        _fit(tmp_path, "tensors", resume_from_checkpoint=str(path))
    assert not marker.exists()


def test_rotation_keeps_the_newest_and_the_best(tmp_path):
    model = _fit(tmp_path, "tensors", save_strategy="steps", save_steps=2, save_total_limit=2)
    # HF 5.x: checkpoint-12, written at the end of epoch 2 before the evaluation that found it best, is
    # recorded as the best at the next save and kept; the newest is kept for resuming
    assert sorted(os.listdir(tmp_path), key=lambda n: int(n.split("-")[1])) == ["checkpoint-12", "checkpoint-18"]
    assert model.state.global_step == 18


class _ValueInjector(TrainerCallback):
    """Makes validation 'accuracy' follow a script, so the best epoch is known in advance."""

    order = -1

    def __init__(self, values):
        self.values = list(values)
        self.weights = {}

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics["val_score"] = self.values.pop(0)
        self.weights[state.global_step] = [p.detach().clone() for p in kwargs["model"].parameters()]


def test_best_model_is_tracked_kept_and_loaded_at_end(tmp_path):
    x, y = _data()
    injector = _ValueInjector([0.2, 0.9, 0.5, 0.4, 0.3])
    model = Model(_net(0)).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, batch_size=16, epochs=5, validation_split=0.25, verbose=0, output_dir=str(tmp_path),
              save_strategy="epoch", save_total_limit=1, load_best_model_at_end=True,
              metric_for_best_model="val_score", greater_is_better=True, callbacks=[injector])
    steps_per_epoch = 72 // 16 + 1  # 72 training samples, batch 16 -> 5 steps
    best_step = 2 * steps_per_epoch
    assert model.state.best_metric == 0.9
    assert model.state.best_model_checkpoint == str(tmp_path / f"checkpoint-{best_step}")
    # rotation keeps the best and the newest, even with save_total_limit=1
    assert sorted(os.listdir(tmp_path)) == sorted([f"checkpoint-{best_step}", f"checkpoint-{5 * steps_per_epoch}"])
    for p, q in zip(model.module.parameters(), injector.weights[best_step]):
        assert torch.equal(p, q)


def test_save_strategy_best_saves_only_improvements(tmp_path):
    x, y = _data()
    model = Model(_net(0)).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, batch_size=16, epochs=5, validation_split=0.25, verbose=0, output_dir=str(tmp_path),
              save_strategy="best", metric_for_best_model="val_score", callbacks=[_ValueInjector([5, 3, 4, 1, 2])])
    # val_score is not a loss: lower is not better unless asked; greater_is_better defaults to True
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5"]
    model.fit(x, y, batch_size=16, epochs=5, validation_split=0.25, verbose=0, output_dir=str(tmp_path / "low"),
              save_strategy="best", metric_for_best_model="val_score", greater_is_better=False,
              callbacks=[_ValueInjector([5, 3, 4, 1, 2])])
    assert sorted(os.listdir(tmp_path / "low"), key=lambda n: int(n.split("-")[1])) == [
        "checkpoint-5", "checkpoint-10", "checkpoint-20"]


def test_load_best_model_at_end_needs_saving_and_evaluation(tmp_path):
    x, y = _data()
    model = Model(_net(0)).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match="`load_best_model_at_end=True` needs evaluation"):
        model.fit(x, y, load_best_model_at_end=True, validation_split=0.2, verbose=0)
