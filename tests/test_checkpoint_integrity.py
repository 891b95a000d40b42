"""Checkpoints that can be trusted: tampering and corruption are refused before anything is
loaded, a resume falls back past a damaged checkpoint, callback state sets only declared data,
one run writes into an output_dir at a time, and a full disk loses nothing."""

import builtins
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch
from helpers import Crash, training_records

from fitkit import Model, TrainerCallback
from fitkit.engine.checkpoint import layout, listing, run_lock, verify, writing
from fitkit.engine.checkpoint.layout import CheckpointError
from fitkit.engine.checkpoint.writing import file_digest
from fitkit.events.handler import CallbackHandler, TrainerControl

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "integrity_run.py")



class _Watch(TrainerCallback):
    """Records the step a run starts from; raises at `crash_at`."""

    def __init__(self, crash_at=None):
        self.crash_at, self.first_step = crash_at, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.first_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.crash_at:
            raise Crash(f"simulated crash at step {self.crash_at}")


def _model(seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))
    return Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)


def _fit(out, seed=0, crash_at=None, model=None, callbacks=(), **options):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    model = model or _model(seed)
    watch = _Watch(crash_at)
    model.fit(x, y, batch_size=8, epochs=1, seed=3, verbose=0, output_dir=str(out), save_strategy="steps",
              save_steps=4, logging_strategy="steps", logging_steps=1, callbacks=[watch, *callbacks], **options)
    return model, watch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run, and one that crashed at step 10 after checkpoints 4 and 8."""
    base = tmp_path_factory.mktemp("runs")
    full, _ = _fit(base / "full")
    with pytest.raises(Crash):
        _fit(base / "cut", crash_at=10)
    assert sorted(os.listdir(base / "cut")) == ["checkpoint-4", "checkpoint-8"]  # lock released by the crash
    return {"full": full, "cut": base / "cut"}


def _copy(runs, tmp_path):
    out = tmp_path / "cut"
    shutil.copytree(runs["cut"], out)
    return out


def _manifest(path):
    return json.loads((path / layout.MANIFEST).read_text())


def _rewrite(path, name, data, *, digest=True, version=None):
    """Replace a file and record its new size (and digest) in the manifest: an edit a size-only
    manifest would accept."""
    (path / name).write_bytes(data)
    manifest = _manifest(path)
    manifest["files"][name] = len(data)
    if digest:
        manifest["digests"][name] = file_digest(str(path / name))
    if version == 1:  # as written before digests existed
        manifest.pop("digests"), manifest.pop("digest")
        manifest["version"] = 1
    (path / layout.MANIFEST).write_text(json.dumps(manifest))


def _same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters()))


def _refused(out, path, match):
    """Resume from `path`: a CheckpointError matching `match`, and the model keeps its weights."""
    model = _model(5)
    before = [p.detach().clone() for p in model.module.parameters()]
    with pytest.raises(CheckpointError, match=match) as info:
        _fit(out, model=model, resume_from_checkpoint=str(path))
    assert all(torch.equal(a, b) for a, b in zip(before, model.module.parameters()))
    return info.value


# -- corruption and tampering ------------------------------------------------------------------
def test_a_flipped_byte_inside_a_tensor_is_refused_naming_state_pt(runs, tmp_path):
    out = _copy(runs, tmp_path)
    path = out / "checkpoint-8"
    weights = path / "state.pt"
    size = weights.stat().st_size
    tensor = torch.load(weights, weights_only=True)["model"]["0.weight"]
    data = bytearray(weights.read_bytes())
    at = data.find(tensor.contiguous().numpy().tobytes())
    assert at > 0
    data[at + 1] ^= 0x40
    weights.write_bytes(bytes(data))
    # same size, still loadable: only the digest tells the weights changed
    assert weights.stat().st_size == size and listing.is_complete(str(path))
    assert not torch.equal(torch.load(weights, weights_only=True)["model"]["0.weight"], tensor)
    _refused(out, path, r"checkpoint-8.* corrupted: the sha256 digest of state\.pt differs")


def test_an_edited_global_step_is_a_digest_mismatch(runs, tmp_path):
    path = _copy(runs, tmp_path) / "checkpoint-8"
    state = json.loads((path / "trainer_state.json").read_text())
    state["global_step"] = 4
    (path / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    _refused(path.parent, path, r"digest of trainer_state\.json differs.*resume_from_checkpoint=True")


def test_manifest_paths_outside_the_checkpoint_are_refused_unread(runs, tmp_path, monkeypatch):
    path = _copy(runs, tmp_path) / "checkpoint-8"
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of any checkpoint")
    os.symlink(secret, path / "link.txt")
    original = _manifest(path)
    for name in ("../secret.txt", "../../etc/hostname", str(secret), "link.txt"):
        manifest = json.loads(json.dumps(original))
        manifest["files"][name] = secret.stat().st_size  # size and digest match: only the place is wrong
        manifest["digests"][name] = file_digest(str(secret))
        (path / layout.MANIFEST).write_text(json.dumps(manifest))
        touched = []
        real_open, real_stat = builtins.open, os.stat
        monkeypatch.setattr(builtins, "open", lambda f, *a, touched=touched, real_open=real_open, **k: touched.append(str(f)) or real_open(f, *a, **k))
        monkeypatch.setattr(os, "stat", lambda f, *a, touched=touched, real_stat=real_stat, **k: touched.append(str(f)) or real_stat(f, *a, **k))
        try:
            complete = listing.is_complete(str(path))
            with pytest.raises(CheckpointError, match=r"outside the checkpoint directory: refused") as info:
                verify.resolve(str(path), str(tmp_path))
        finally:
            monkeypatch.undo()
        assert not complete and repr(name) in str(info.value)
        assert not [t for t in touched if "secret" in t or "hostname" in t], touched


def test_truncation_and_invalid_json_are_the_same_clear_error(runs, tmp_path):
    out = _copy(runs, tmp_path)
    path = out / "checkpoint-8"
    pristine = {name: (path / name).read_bytes() for name in ("state.pt", "trainer_state.json", layout.MANIFEST)}

    def damage(name, data, **how):
        for each, content in pristine.items():
            (path / each).write_bytes(content)
        _rewrite(path, name, data, **how)

    half = pristine["state.pt"][: len(pristine["state.pt"]) // 2]
    damage("state.pt", half, digest=False)  # a truncated state.pt whose new size is in the manifest
    _refused(out, path, r"digest of state\.pt differs")
    damage("state.pt", half, version=1)  # a manifest without digests (no released version wrote one)
    err = _refused(out, path, r"records no digests it can check")
    assert not str(err).startswith("[Errno")
    damage("trainer_state.json", pristine["trainer_state.json"][:40])  # invalid JSON, with a digest that matches it
    _refused(out, path, r"damaged: trainer_state\.json is not a valid JSON object")
    damage("state.pt", pristine["state.pt"])
    (path / "state.pt.extra").write_bytes(b"x")  # a file added after the checkpoint was written
    _refused(out, path, r"holds state\.pt\.extra, which its manifest does not list")


def test_a_manifest_without_digests_is_passed_over_by_a_resume(runs, tmp_path, caplog):
    out = _copy(runs, tmp_path)
    path = out / "checkpoint-8"
    manifest = _manifest(path)
    manifest.pop("digests"), manifest.pop("digest")
    manifest["version"] = 1
    (path / layout.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"records no digests it can check"):
        verify.verify(str(path))
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        resumed, watch = _fit(out, seed=7, resume_from_checkpoint=True)
    assert watch.first_step == 4 and _same_weights(resumed, runs["full"])  # from the checkpoint before it
    assert _manifest(out / "checkpoint-12")["version"] == layout.FORMAT_VERSION == 2  # new ones have digests


def test_file_digests_on_python_3_10_without_hashlib_file_digest(tmp_path, monkeypatch):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(3 << 17))  # more than one read block
    expected = {name: hashlib.new(name, path.read_bytes()).hexdigest() for name in ("sha256", "blake2b")}
    monkeypatch.delattr(hashlib, "file_digest", raising=False)  # new in 3.11 (was: AttributeError on 3.10)
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    assert {name: file_digest(str(path), name) for name in expected} == expected


def test_a_manifest_with_digests_it_cannot_check_is_refused(runs, tmp_path):
    path = _copy(runs, tmp_path) / "checkpoint-8"
    manifest = {**_manifest(path), "version": 1}  # digests kept: they must be checkable (was: TypeError)
    for edit in ({"digest": None}, {"digests": ["state.pt"]}):
        (path / layout.MANIFEST).write_text(json.dumps({**manifest, **edit}))
        with pytest.raises(CheckpointError, match=r"records no digests it can check"):
            verify.verify(str(path))


def test_resume_true_falls_back_past_a_corrupted_newest_checkpoint(runs, tmp_path, caplog):
    out = _copy(runs, tmp_path)
    weights = out / "checkpoint-8" / "state.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        resumed, watch = _fit(out, seed=7, resume_from_checkpoint=True)  # other starting weights
    assert "skipping checkpoint" in caplog.text and "checkpoint-8, which fails verification" in caplog.text
    assert watch.first_step == 4  # from the checkpoint before it, not from scratch
    assert resumed.state.global_step == 12
    assert training_records(resumed.state.log_history) == training_records(runs["full"].state.log_history)
    assert _same_weights(resumed, runs["full"])
    assert verify.verified(str(out / "checkpoint-8"))  # the damaged one, written again whole


def test_resume_true_when_no_checkpoint_verifies_raises(runs, tmp_path):
    out = _copy(runs, tmp_path)
    for step in (4, 8):
        _rewrite(out / f"checkpoint-{step}", "training_args.json", b"{}", digest=False)
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints .* verifies"):
        _fit(out, resume_from_checkpoint=True)


# -- callback state ---------------------------------------------------------------------------
class _Exportable(TrainerCallback):
    """HF's ExportableState shape: `state()` declares `counter`, no `load_state`."""

    def __init__(self):
        self.counter, self.note, self._secret = 0, "as built", "kept"

    def on_step_end(self, args, state, control, **kwargs):
        self.counter += 1

    def state(self):
        return {"args": {}, "attributes": {"counter": self.counter}}

    @property
    def shown(self):
        return self.counter


def test_callback_state_sets_only_declared_data_attributes(caplog):
    cb = _Exportable()
    handler, control = CallbackHandler([cb]), TrainerControl()
    method = cb.on_step_end
    hostile = {"counter": 5, "__class__": "str", "__dict__": {}, "on_step_end": None, "state": None, "shown": 9,
               "note": "changed", "_secret": "changed", "unknown": 1}
    states = {"_Exportable": {"args": {}, "attributes": hostile},
              "TrainerControl": {"args": {"should_log": True, "__class__": "str", "should_training_stop": True}}}
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        handler.load_states(states, control)
    assert cb.counter == 5 and type(cb) is _Exportable and cb.on_step_end == method and callable(cb.state)
    assert cb.note == "as built" and cb._secret == "kept" and not hasattr(cb, "unknown") and cb.shown == 5
    assert control.should_log is True and control.should_training_stop is False and type(control) is TrainerControl
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("not restoring")]
    assert len(warned) == 1
    for key in ("__class__", "on_step_end", "shown", "note", "_secret", "unknown"):
        assert repr(key) in warned[0]


def test_hostile_callback_state_in_a_checkpoint_changes_nothing_else(runs, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(Crash):
        _crash_with(out, _Exportable())
    path = out / "checkpoint-4"
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["_Exportable"]["attributes"] == {"counter": 4}
    state["stateful_callbacks"]["_Exportable"]["attributes"].update({"__class__": "x", "on_step_end": 0,
                                                                      "unknown": 1, "note": "changed"})
    _rewrite(path, "trainer_state.json", json.dumps(state).encode())  # digest rewritten: verified, then loaded
    cb = _Exportable()
    _resume_with(out, path, cb)
    assert cb.counter == 12 and type(cb) is _Exportable and cb.note == "as built" and not hasattr(cb, "unknown")


def _crash_with(out, cb):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    Model(torch.nn.Linear(8, 3)).compile("sgd", "cross_entropy").fit(
        x, y, batch_size=8, epochs=1, verbose=0, output_dir=str(out), save_strategy="steps", save_steps=4,
        callbacks=[cb, _Watch(crash_at=6)])


def _resume_with(out, path, cb):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    Model(torch.nn.Linear(8, 3)).compile("sgd", "cross_entropy").fit(
        x, y, batch_size=8, epochs=1, verbose=0, output_dir=str(out), save_strategy="steps", save_steps=4,
        resume_from_checkpoint=str(path), callbacks=[cb])


# -- one writer per output_dir ------------------------------------------------------------------
def _child(out, *options):
    return subprocess.Popen([sys.executable, SCRIPT, str(out), *options], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc, stdin=None):
    stdout, stderr = proc.communicate(stdin, timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads([line for line in stdout.splitlines() if line.startswith("RESULT ")][-1][7:])


def _paused(proc):
    """Wait for the child's PAUSED line (it then holds its output_dir until it reads a line)."""
    for line in proc.stdout:
        if line.startswith("PAUSED "):
            return int(line.split()[1])
    raise AssertionError("the child ended before pausing: " + proc.stderr.read()[-3000:])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The script's run, uninterrupted."""
    return _result(_child(tmp_path_factory.mktemp("reference") / "out"))


def test_lock_in_one_process_names_the_holder_and_goes_on_release(tmp_path):
    lock = run_lock.acquire(str(tmp_path))
    record = json.loads((tmp_path / run_lock.LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname() and record["started"]
    with pytest.raises(run_lock.DirectoryInUseError, match=rf"pid {os.getpid()} on host .*this very process"):
        run_lock.acquire(str(tmp_path))
    lock.release()
    assert not (tmp_path / run_lock.LOCK_FILE).exists()
    run_lock.acquire(str(tmp_path)).release()


@pytest.mark.slow
def test_a_second_run_on_one_output_dir_is_refused_and_the_first_is_unharmed(tmp_path, reference):
    out = tmp_path / "out"
    first = _child(out, "--pause-at", "6")
    try:
        pid = _paused(first)  # it has written checkpoint-4 and holds out/.fitkit.lock
        before = sorted(os.listdir(out))
        with pytest.raises(run_lock.DirectoryInUseError) as info:
            _fit(out, resume_from_checkpoint=True)
        message = str(info.value)
        assert f"pid {pid} on host {socket.gethostname()}" in message and "`output_dir`" in message
        assert "Pass another `output_dir`, or wait for that run to finish" in message
        assert sorted(os.listdir(out)) == before == [".fitkit.lock", "checkpoint-4"]  # nothing written
        result = _result(first, stdin="go\n")
    finally:
        first.kill()
    assert result == reference  # every logged value and weight
    assert sorted(os.listdir(out)) == ["checkpoint-12", "checkpoint-16", "checkpoint-20", "checkpoint-24",
                                       "checkpoint-4", "checkpoint-8"]
    for name in os.listdir(out):
        verify.verified(str(out / name))


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
    out = tmp_path / "out"
    holder = ("import os, sys; from fitkit.engine.checkpoint import run_lock; run_lock.acquire(sys.argv[1]); "
              "print('PAUSED', os.getpid(), flush=True); sys.stdin.readline()")
    dead = subprocess.Popen([sys.executable, "-c", holder, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pid = _paused(dead)
    with pytest.raises(run_lock.DirectoryInUseError, match=f"pid {pid} "):
        run_lock.acquire(str(out))
    os.kill(pid, signal.SIGKILL)
    dead.communicate(timeout=60)
    assert json.loads((out / run_lock.LOCK_FILE).read_text())["pid"] == pid  # left behind
    (out / ".tmp-checkpoint-8-0badc0de").mkdir()  # and a checkpoint being written
    seen = []

    class Holder(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.append(json.loads((out / run_lock.LOCK_FILE).read_text())["pid"])

    with caplog.at_level(logging.WARNING, logger="fitkit"):
        model, _ = _fit(out, callbacks=[Holder()])
    assert seen == [os.getpid()] and model.state.global_step == 12
    assert "removing" in caplog.text and ".tmp-checkpoint-8-0badc0de" in caplog.text
    assert sorted(os.listdir(out)) == ["checkpoint-12", "checkpoint-4", "checkpoint-8"]  # lock released


def test_leftovers_of_an_interrupted_run_are_recovered_or_removed(runs, tmp_path, caplog):
    out = _copy(runs, tmp_path)
    os.replace(out / "checkpoint-8", out / ".tmp-checkpoint-8-0badc0de")  # complete, not renamed yet
    shutil.copytree(out / "checkpoint-4", out / ".tmp-checkpoint-8-0badc0de-replaced")  # the one it replaces
    (out / ".tmp-checkpoint-12-0badc0de").mkdir()  # one being written
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        writing.recover(str(out))
    assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-8"]
    assert verify.verified(str(out / "checkpoint-8")) and _manifest(out / "checkpoint-8")["global_step"] == 8
    assert "recovering" in caplog.text and caplog.text.count("removing") == 2


# -- disk full ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_full_disk_loses_nothing_and_the_run_resumes_exactly(tmp_path, reference):
    out = tmp_path / "out"
    full = _child(out, "--fsize-after-first-save", "4000")  # files may not grow past 4 kB after checkpoint-4
    stdout, stderr = full.communicate(timeout=300)
    assert full.returncode != 0 and "SAVE 4" in stdout and "SAVE 8" not in stdout
    error = stderr.strip().splitlines()[-1]
    assert error.startswith("fitkit.engine.checkpoint.layout.CheckpointWriteError: could not write the checkpoint")
    for part in ("checkpoint-8", "File too large", "its incomplete files were removed", "needs about",
                 "(the size of checkpoint-4)", "checkpoint-4', is intact", "resume_from_checkpoint=True"):
        assert part in error, part
    assert sorted(os.listdir(out)) == ["checkpoint-4"]  # no temporary left, no lock
    verify.verified(str(out / "checkpoint-4"))
    # space freed: the same command, resuming, from other starting weights
    resumed = _result(_child(out, "--resume", "--seed", "2"))
    assert resumed["first_step"] == 4 and reference["first_step"] == 0
    assert {k: v for k, v in resumed.items() if k != "first_step"} == {
        k: v for k, v in reference.items() if k != "first_step"}


@pytest.mark.slow
def test_under_ddp_a_refused_lock_and_a_full_disk_stop_every_process(tmp_path):
    """No process waits for one that failed: both raise the same error and the job ends."""
    out = tmp_path / "out"
    lock = run_lock.acquire(str(out))
    try:
        refused = subprocess.run([sys.executable, SCRIPT, str(out), "--devices", "2"], capture_output=True, text=True,
                                 timeout=300)
    finally:
        lock.release()
    assert refused.returncode != 0
    assert refused.stderr.count(f"DirectoryInUseError: `output_dir` {str(out)!r} is in use by another fitkit run "
                                f"(pid {os.getpid()} on host") == 2, refused.stderr[-3000:]
    assert os.listdir(out) == []
    full = subprocess.run([sys.executable, SCRIPT, str(out), "--devices", "2", "--fsize-after-first-save", "4000"],
                          capture_output=True, text=True, timeout=300)
    assert full.returncode != 0
    assert full.stderr.count("CheckpointWriteError: could not write the checkpoint") == 2, full.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["checkpoint-4"]
    verify.verified(str(out / "checkpoint-4"))
