"""Asynchronous checkpoints (`save_async=True`): the loop waits only for a host copy of the state;
the write, digests and commit happen on a background thread. A checkpoint exists (for resume,
rotation, `on_save`) only once committed, `fit` returns after the last commit, a kill -9 during a
background write leaves the previous checkpoint verified, and a failed write is a clear error."""

import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch
from helpers import STRESS, Crash, training_records

from fitkit import Model, TrainerCallback
from fitkit.engine.checkpoint import layout, listing, loading, verify, writing
from fitkit.engine.checkpoint.async_save import BackgroundWriter, HostCopy
from fitkit.engine.checkpoint.background import BackgroundCheckpointWriter

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "integrity_run.py")


def _model(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))
    return Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)



class _Record(TrainerCallback):
    """What each `on_save` finds on disk; the checkpoints listed after each step; a crash."""

    def __init__(self, out, crash_at=None):
        self.out, self.crash_at, self.saves, self.listed = str(out), crash_at, [], []

    def on_save(self, args, state, control, **kwargs):
        self.saves.append((state.global_step, [os.path.basename(p) for p in listing.list_checkpoints(self.out)]))

    def on_step_end(self, args, state, control, **kwargs):
        self.listed.append((state.global_step, [os.path.basename(p) for p in listing.list_checkpoints(self.out)]))
        if state.global_step == self.crash_at:
            raise Crash()


def _fit(out, model=None, crash_at=None, **options):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    model = model or _model()
    record = _Record(out, crash_at)
    options = {"save_strategy": "steps", "save_steps": 4, "save_async": True, **options}
    callbacks = [record, *options.pop("callbacks", [])]
    model.fit(x, y, batch_size=8, epochs=2, seed=3, verbose=0, output_dir=str(out), logging_strategy="steps",
              logging_steps=1, callbacks=callbacks, **options)
    return model, record


def _equal(a, b, where="payload"):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters()))


def test_asynchronous_checkpoints_resume_bit_identically(tmp_path):
    full, record = _fit(tmp_path / "full")
    assert [found[-1] for _, found in record.saves] == [f"checkpoint-{s}" for s in range(4, 25, 4)]
    with pytest.raises(Crash):
        _fit(tmp_path / "cut", crash_at=10)
    assert sorted(os.listdir(tmp_path / "cut")) == ["checkpoint-4", "checkpoint-8"]  # committed, lock released
    resumed, _ = _fit(tmp_path / "cut", model=_model(5), resume_from_checkpoint=True)
    assert resumed.state.global_step == 24 and _same_weights(resumed, full)
    assert training_records(resumed.state.log_history)[-10:] == training_records(full.state.log_history)[-10:]


def test_a_commit_noticed_at_the_next_saves_step_does_not_cancel_that_save(tmp_path, monkeypatch):
    """The previous write's `on_save` fires between the step's end and its save: the save the
    step asked for still happens (a busy machine once lost checkpoint-12 this way)."""
    step = {"now": 0}

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step["now"] = state.global_step

    done = BackgroundWriter.done

    def done_only_at_save_steps(self):  # the write ended; the loop notices only at a save's step
        if step["now"] % 4:
            return False
        if self._thread is not None:
            self._thread.join()
        return done(self)

    monkeypatch.setattr(BackgroundWriter, "done", done_only_at_save_steps)
    _, record = _fit(tmp_path, callbacks=[Steps()])
    assert sorted(os.listdir(tmp_path), key=lambda n: int(n.split("-")[1])) == \
        [f"checkpoint-{s}" for s in range(4, 25, 4)]
    assert len(record.saves) == 6


class _OnSaveChecks(TrainerCallback):
    """In every `on_save`: `checkpoint-{state.global_step}` exists, verifies, is the newest committed
    checkpoint and `state` is the `TrainerState` its `trainer_state.json` records."""

    def __init__(self):
        self.saved, self.live, self.steps = [], None, []

    def on_step_end(self, args, state, control, **kwargs):
        self.live = state
        self.steps.append(state.global_step)

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        assert checkpoint == path and verify.verified(path) == path
        assert listing.list_checkpoints(args.output_dir)[-1] == path  # the newest committed
        assert _as_json(state) == _as_json(loading.saved_state(path))
        self.saved.append((state.global_step, state is self.live, self.live.global_step))
        state.log_history.append({"added by on_save": 1.0})  # with save_async: the checkpoint's copy only


def _as_json(state):
    return json.loads(json.dumps(dataclasses.asdict(state), sort_keys=True))


def _fit_with_on_save_checks(out, save_async, *callbacks):
    checks = _OnSaveChecks()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(160, 8, generator=g), torch.randint(0, 3, (160,), generator=g)
    val = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    model = _model()
    model.fit(x, y, batch_size=8, epochs=1, seed=3, verbose=0, output_dir=str(out), save_strategy="steps",
              save_steps=3, eval_strategy="steps", eval_steps=3, validation_data=val, logging_strategy="steps",
              logging_steps=1, save_async=save_async, callbacks=[checks, *callbacks])
    assert [step for step, _, _ in checks.saved] == [3, 6, 9, 12, 15, 18, 20]  # and at the end, as HF
    assert checks.steps == list(range(1, 21)) and model.state.global_step == 20
    assert model.state.best_model_checkpoint == str(out / f"checkpoint-{model.state.best_global_step}")
    return checks, model


def test_on_save_receives_the_state_of_the_checkpoint_just_committed(tmp_path, monkeypatch):
    """Each background commit is held until the step after its save has ended, so every `on_save`
    comes while the live run is past its checkpoint's step: `checkpoint-{state.global_step}` is
    still the one just committed (as with synchronous saves), and the live state is not changed by
    the event: the run logs what the synchronous one logs."""
    synchronous, sync_model = _fit_with_on_save_checks(tmp_path / "sync", save_async=False)
    assert all(live and now == step for step, live, now in synchronous.saved)  # the live state, at its step

    reached, latest = threading.Condition(), [0]
    commit = writing.commit

    def commit_after_the_next_step(tmp, final, *args, **kwargs):
        step = int(final.rsplit("-", 1)[1])
        with reached:  # checkpoint-N commits once step N + 1 has ended (the last one at once)
            assert reached.wait_for(lambda: latest[0] > step or step == 20, timeout=30)
        return commit(tmp, final, *args, **kwargs)

    class NextStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with reached:
                latest[0] = state.global_step
                reached.notify_all()

    monkeypatch.setattr(writing, "commit", commit_after_the_next_step)
    background, async_model = _fit_with_on_save_checks(tmp_path / "async", True, NextStep())
    # a copy taken at the save, while the live run had gone on
    assert all(not live for _, live, _ in background.saved)
    assert all(now > step for step, _, now in background.saved[:-1])
    added = [r for r in sync_model.state.log_history if "added by on_save" in r]
    assert len(added) == 7 and not [r for r in async_model.state.log_history if "added by on_save" in r]
    assert training_records(async_model.state.log_history) == [
        r for r in training_records(sync_model.state.log_history) if "added by on_save" not in r]


def test_a_write_noticed_only_at_the_next_save_is_announced_before_that_write_starts(tmp_path, monkeypatch):
    """When the loop notices a commit only at the next save (its poll never sees the write end),
    that checkpoint's `on_save` still fires before the next write is handed over, so inside it the
    checkpoint is the newest committed one."""
    events = []
    write = BackgroundCheckpointWriter.write

    def recorded(self, job):
        events.append(("write", job.state.global_step))
        return write(self, job)

    class Saves(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            events.append(("on_save", state.global_step))

    monkeypatch.setattr(BackgroundCheckpointWriter, "write", recorded)
    monkeypatch.setattr(BackgroundWriter, "done", lambda self: False)
    _fit(tmp_path, max_steps=12, callbacks=[Saves()])
    assert events == [("write", 4), ("on_save", 4), ("write", 8), ("on_save", 8), ("write", 12), ("on_save", 12)]


def test_the_files_equal_a_synchronous_checkpoints(tmp_path):
    """Same weights, optimizer, RNG and loop record as `fabric.save` writes (the payload compared)."""
    _fit(tmp_path / "a", max_steps=4)
    _fit(tmp_path / "s", max_steps=4, save_async=False)
    a = torch.load(tmp_path / "a" / "checkpoint-4" / "state.pt", weights_only=True)
    s = torch.load(tmp_path / "s" / "checkpoint-4" / "state.pt", weights_only=True)
    assert sorted(a) == sorted(s)
    _equal(a, s)
    assert verify.verified(str(tmp_path / "a" / "checkpoint-4"))


def test_the_weights_are_copied_during_the_next_forward_and_before_the_next_optimizer_step(tmp_path, monkeypatch):
    """On a CPU the weights and optimizer state are copied on the writer thread: the next step's
    forward runs meanwhile, its optimizer step waits, and the checkpoint still equals a
    synchronous one (the copy is slowed here, so a step that did not wait would leak into it)."""
    from fitkit.engine.checkpoint.async_save import PendingCopy

    events = []
    finish = PendingCopy.finish

    def slow_finish(self):
        time.sleep(0.4)
        result = finish(self)
        events.append(("copied", time.perf_counter()))
        return result

    monkeypatch.setattr(PendingCopy, "finish", slow_finish)
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(
        lambda *_: events.append(("optimizer step", time.perf_counter())))
    model = _model()
    model.module.register_forward_pre_hook(lambda *_: events.append(("forward", time.perf_counter())))
    try:
        _fit(tmp_path / "a", model=model, max_steps=8)
    finally:
        handle.remove()
    _fit(tmp_path / "s", max_steps=8, save_async=False)
    for step in (4, 8):
        a = torch.load(tmp_path / "a" / f"checkpoint-{step}" / "state.pt", weights_only=True)
        s = torch.load(tmp_path / "s" / f"checkpoint-{step}" / "state.pt", weights_only=True)
        _equal(a, s)
    names = [name for name, _ in sorted(events, key=lambda e: e[1])]
    first = names.index("copied")  # step 4's copy: after step 5's forward, before its optimizer step
    assert names[first - 1] == "forward" and names[first - 2] == "optimizer step"
    assert names[first + 1] == "optimizer step"
    assert names.count("optimizer step") == 8


def test_the_host_copys_buffers_are_reserved_on_the_writer_thread_after_the_first_step(tmp_path, monkeypatch):
    """Fresh memory is slow to fault in: after the first optimizer step the writer thread
    allocates the buffers the first save then copies into (the same ones), and the checkpoints
    stay equal to synchronous ones. A run that saves nothing reserves nothing."""
    seen = []
    reserve, take = HostCopy.reserve, HostCopy.take

    def spy_reserve(self, tree):
        seen.append(("reserve", threading.current_thread().name))
        reserve(self, tree)

    def spy_take(self, tree, defer=None):
        before = [b.data_ptr() for b in self._buffers]
        pending = take(self, tree, defer)
        seen.append(("take", before, [b.data_ptr() for b in self._buffers]))
        return pending

    monkeypatch.setattr(HostCopy, "reserve", spy_reserve)
    monkeypatch.setattr(HostCopy, "take", spy_take)
    _fit(tmp_path / "a", max_steps=8)
    assert seen[0] == ("reserve", "fitkit-checkpoint-writer") and [e[0] for e in seen] == ["reserve", "take", "take"]
    _, before, after = seen[1]
    n_state = 4 + 3 * 4  # the module's 4 tensors; Adam's step and 2 moments for each of its 4 parameters
    assert len(before) >= n_state and after[:len(before)] == before  # the reserved buffers, reused
    _fit(tmp_path / "s", max_steps=8, save_async=False)
    for step in (4, 8):
        _equal(torch.load(tmp_path / "a" / f"checkpoint-{step}" / "state.pt", weights_only=True),
               torch.load(tmp_path / "s" / f"checkpoint-{step}" / "state.pt", weights_only=True))
    seen.clear()
    _fit(tmp_path / "n", max_steps=8, save_strategy="no")
    assert seen == []


def test_a_callback_changing_the_weights_waits_for_the_copy(tmp_path, monkeypatch):
    """A callback may change the weights before the next optimizer step (here at `on_step_begin`):
    it runs only once the copy is complete, so the checkpoint does not see the change."""
    from fitkit.engine.checkpoint.async_save import PendingCopy

    finish = PendingCopy.finish
    monkeypatch.setattr(PendingCopy, "finish", lambda self: (time.sleep(0.3), finish(self))[1])

    class Nudge(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)

    _fit(tmp_path / "a", max_steps=5, callbacks=[Nudge()])
    _fit(tmp_path / "s", max_steps=5, callbacks=[Nudge()], save_async=False)
    a = torch.load(tmp_path / "a" / "checkpoint-4" / "state.pt", weights_only=True)
    s = torch.load(tmp_path / "s" / "checkpoint-4" / "state.pt", weights_only=True)
    _equal(a, s)


def test_the_loop_goes_on_while_the_write_runs_and_on_save_sees_a_committed_checkpoint(tmp_path, monkeypatch):
    later = threading.Event()
    commit = writing.commit

    def held_commit(*args, **kwargs):  # the first commit waits until training reached step 6
        assert later.wait(timeout=30), "the loop waited for the background write"
        return commit(*args, **kwargs)

    class Two(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 6:
                later.set()

    monkeypatch.setattr(writing, "commit", held_commit)
    model = _model()
    model_cb = Two()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    record = _Record(tmp_path)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, output_dir=str(tmp_path), save_strategy="steps", save_steps=4,
              callbacks=[record, model_cb], save_async=True)
    listed = dict(record.listed)
    assert listed[5] == [] and listed[6] == []  # step 4's checkpoint not committed: not listed yet
    # on_save fires once its checkpoint is committed
    assert [found[-1] for _, found in record.saves] == ["checkpoint-4", "checkpoint-8", "checkpoint-12"]
    # fit returned after the last commit
    assert [os.path.basename(p) for p in listing.list_checkpoints(str(tmp_path))] == [
        "checkpoint-4", "checkpoint-8", "checkpoint-12"]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(layout.TMP_PREFIX)]


def _slow_commits(monkeypatch, seconds):
    """Each background commit (JSON files, manifest, rename) starts `seconds` late."""
    commit = writing.commit

    def slow_commit(*args, **kwargs):
        time.sleep(seconds)
        return commit(*args, **kwargs)

    monkeypatch.setattr(writing, "commit", slow_commit)


def test_fit_returns_only_after_the_last_commit(tmp_path, monkeypatch):
    _slow_commits(monkeypatch, 0.5)
    model, record = _fit(tmp_path, max_steps=8)
    assert [os.path.basename(p) for p in listing.list_checkpoints(str(tmp_path))] == ["checkpoint-4", "checkpoint-8"]
    assert model.last_checkpoint == str(tmp_path / "checkpoint-8")
    assert len(record.saves) == 2 and record.saves[-1][1] == ["checkpoint-4", "checkpoint-8"]


def test_rotation_never_deletes_the_newest_committed_or_the_best_while_a_write_runs(tmp_path, monkeypatch):
    _slow_commits(monkeypatch, 0.2)
    g = torch.Generator().manual_seed(1)
    val = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    model, record = _fit(tmp_path, save_total_limit=1, eval_strategy="steps", eval_steps=4, validation_data=val,
                         load_best_model_at_end=True)
    best = model.state.best_model_checkpoint
    assert best and os.path.isdir(best)
    first = next(i for i, (_, found) in enumerate(record.listed) if found)
    assert all(found for _, found in record.listed[first:])  # a committed checkpoint is always there
    final = [os.path.basename(p) for p in listing.list_checkpoints(str(tmp_path))]
    assert final[-1] == "checkpoint-24" and os.path.basename(best) in final and len(final) <= 2


def test_rotate_ignores_a_checkpoint_being_written(tmp_path):
    for step in (4, 8):
        path = tmp_path / f"checkpoint-{step}"
        path.mkdir()
        (path / "state.pt").write_bytes(b"x")
        (path / "trainer_state.json").write_text("{}")
        writing.write_manifest(str(path), writing.manifest_fields(step, None))
    (tmp_path / f"{layout.TMP_PREFIX}12-abc").mkdir()  # in flight
    assert writing.rotate(str(tmp_path), 1, keep=[None, str(tmp_path / "checkpoint-4")]) == []
    assert writing.rotate(str(tmp_path), 1) == [str(tmp_path / "checkpoint-4")]
    assert os.path.isdir(tmp_path / f"{layout.TMP_PREFIX}12-abc")


def test_host_copy_is_a_copy_and_reuses_its_buffers():
    w = torch.ones(3)
    copy = HostCopy()
    first = copy.take({"w": w, "n": 1, "l": [w]}).finish()
    w.add_(1)  # the next optimizer step
    assert first["w"].tolist() == [1.0, 1.0, 1.0] and first["n"] == 1 and first["l"][0].tolist() == [1.0] * 3
    second = copy.take({"w": w, "n": 1, "l": [w]}).finish()
    assert second["w"].data_ptr() == first["w"].data_ptr() and second["w"].tolist() == [2.0] * 3


def test_background_writer_runs_one_job_at_a_time_and_raises_its_error():
    writer, order = BackgroundWriter(), []
    writer.submit(lambda: (time.sleep(0.2), order.append(1)))
    writer.submit(lambda: order.append(2))  # waits for the first
    writer.wait()
    assert order == [1, 2]

    def fail():
        raise OSError(28, "No space left on device")

    writer.submit(fail)
    with pytest.raises(OSError, match="No space"):
        writer.wait()
    writer.wait()  # raised once


# -- in other processes: disk full, kill -9 -------------------------------------------------------------
def _run(out, *args, **popen):
    return subprocess.Popen([sys.executable, SCRIPT, str(out), "--async", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _result(proc):
    import json

    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    return {k: v for k, v in result.items() if k != "first_step"}, result["first_step"]


@pytest.mark.slow
def test_a_full_disk_during_a_background_write_is_a_clear_error_and_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    stdout, stderr = _run(out, "--fsize-after-first-save", "4000").communicate(timeout=300)
    saved = [line for line in stdout.splitlines() if line.startswith("SAVE ")]
    error = stderr.strip().splitlines()[-1]
    assert error.startswith("fitkit.engine.checkpoint.layout.CheckpointWriteError: could not write the checkpoint")
    listed = sorted(os.listdir(out), key=lambda n: int(n.rsplit("-", 1)[1]))  # no temporary directory, no lock
    assert len(saved) == len(listed) >= 1 and all(n.startswith("checkpoint-") for n in listed)  # on_save: committed
    for part in ("File too large", "its incomplete files were removed", f"{listed[-1]}', is intact",
                 "resume_from_checkpoint=True"):
        assert part in error, part
    assert all(verify.verified(str(out / name)) for name in listed)


@pytest.mark.slow
@pytest.mark.stress
def test_kill_9_during_background_writes_always_leaves_a_verified_checkpoint(tmp_path):
    reference, _ = _result(_run(tmp_path / "ref"))
    rng = random.Random(29)
    for trial, step in enumerate((8, 12, 20) if STRESS else (12,)):  # `make stress`: three moments
        out = tmp_path / f"trial-{trial}"
        proc = _run(out, "--slow-write", "0.3")
        for line in proc.stdout:
            if line.startswith(f"WRITING {step}"):
                break
        time.sleep(rng.uniform(0.0, 0.35))  # somewhere in the write, before or after its commit
        proc.kill()
        proc.communicate(timeout=60)
        found = listing.list_checkpoints(str(out))
        assert found and all(verify.verified(p) for p in found)
        result, first = _result(_run(out, "--resume", "--seed", "2"))
        assert first == (int(found[-1].rsplit("-", 1)[1]) if found else 0)
        assert result == reference
        assert not [n for n in os.listdir(out) if n.startswith(layout.TMP_PREFIX)]  # what the kill left: tidied
