"""Checkpoints in object storage (`output_dir="s3://..."`), against a real S3 server on loopback
(moto's server mode, `tests/s3_server.py`), through s3fs as a user's run reaches it."""

import json
import logging
import os
import shutil

import pytest
import torch
from helpers import Crash, CrashAt

from fitkit import Model, TrainerCallback
from fitkit.callbacks import BackupAndRestore, ModelCheckpoint
from fitkit.engine.checkpoint import bucket_lock, layout, store, writing
from fitkit.engine.checkpoint.run_lock import DirectoryInUseError

FILES = ["fitkit_checkpoint.json", "state.pt", "trainer_state.json", "training_args.json"]


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)


def _model(seed=0):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))
    return Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)


def _fit(out, epochs=4, seed=0, **options):
    x, y = _data()
    model = _model(seed)
    options.setdefault("save_strategy", "epoch")
    model.fit(x, y, epochs=epochs, batch_size=16, output_dir=out, verbose=0, **options)
    return model


class _FirstStep(TrainerCallback):
    """Records the step a run starts at and whether any step ran."""

    start, stepped = None, False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = state.global_step

    def on_step_begin(self, args, state, control, **kwargs):
        self.stepped = True


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The test's working directory, and a staging folder of its own (both must stay empty)."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("FITKIT_STAGING_DIR", str(tmp_path / "staging"))
    return tmp_path


def _local_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("save_async", [False, True])
def test_checkpoints_go_to_the_bucket_and_nothing_local(s3_server, workdir, save_async):
    url = s3_server.bucket() + "/run1"
    _fit(url, epochs=3, save_total_limit=2, save_async=save_async)
    # 4 steps an epoch; rotation kept the two newest, the lock object is gone with the run
    assert s3_server.keys(url) == [f"checkpoint-{n}/{f}" for n in (12, 8) for f in FILES]
    assert _local_files(workdir) == []  # no `s3:` folder, no staging left over
    manifest = json.loads(s3_server.fs().cat_file(url[5:] + "/checkpoint-12/fitkit_checkpoint.json"))
    assert manifest["global_step"] == 12 and set(manifest["files"]) == set(FILES) - {"fitkit_checkpoint.json"}


@pytest.mark.parametrize("save_async", [False, True])
def test_a_run_resumed_from_the_bucket_ends_as_an_uninterrupted_one(s3_server, workdir, save_async):
    reference = _fit(str(workdir / "ref"), save_strategy="no")
    url = s3_server.bucket() + "/run"
    with pytest.raises(Crash):
        _fit(url, save_async=save_async, callbacks=[CrashAt(10)])  # after the saves of steps 4 and 8
    first = _FirstStep()
    resumed = _fit(url, seed=5, resume_from_checkpoint=True, save_async=save_async, callbacks=[first])
    assert first.start == 8
    for a, b in zip(reference.module.state_dict().values(), resumed.module.state_dict().values()):
        assert torch.equal(a, b)


def test_a_damaged_newest_checkpoint_is_never_loaded(s3_server, workdir, caplog):
    url = s3_server.bucket() + "/run"
    _fit(url, epochs=2)
    fs, key = s3_server.fs(), url[5:] + "/checkpoint-8/state.pt"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size: only the digest can tell
    fs.pipe_file(key, bytes(data))
    first = _FirstStep()
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        _fit(url, epochs=2, resume_from_checkpoint=True, callbacks=[first])
    assert first.start == 4  # the one before it
    assert f"{url}/checkpoint-8" in caplog.text and "digest" in caplog.text
    with pytest.raises(layout.CheckpointError, match=f"{url}/checkpoint-4.*digest"):
        fs.pipe_file(url[5:] + "/checkpoint-4/state.pt", bytes(data))
        _fit(url, epochs=2, resume_from_checkpoint=f"{url}/checkpoint-4")


def test_an_upload_cut_short_is_no_checkpoint_and_is_tidied(s3_server, workdir):
    url = s3_server.bucket() + "/run"
    _fit(url, epochs=2)
    fs = s3_server.fs()
    fs.rm(url[5:] + "/checkpoint-8/fitkit_checkpoint.json")  # what a kill before the manifest leaves
    first = _FirstStep()
    _fit(url, epochs=1, save_strategy="no", resume_from_checkpoint=True, callbacks=[first])
    assert first.start == 4
    assert not any(k.startswith("checkpoint-8/") for k in s3_server.keys(url))  # removed by the next run


def test_rotation_cut_short_on_a_bucket_leaves_no_complete_looking_checkpoint(s3_server, workdir, monkeypatch):
    url = s3_server.bucket() + "/run"
    _fit(url, epochs=3)
    calls = []
    real = store.Store._rm

    def dies_after_the_manifest(self, names):
        calls.append(names)
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed between the manifest's removal and the objects'
        return real(self, names)

    monkeypatch.setattr(store.Store, "_rm", dies_after_the_manifest)
    with pytest.raises(KeyboardInterrupt):
        writing.rotate(url, 1)
    assert calls[0] == [f"checkpoint-4/{layout.MANIFEST}"]
    assert [os.path.basename(p) for p in writing.list_checkpoints(url)] == ["checkpoint-8", "checkpoint-12"]
    monkeypatch.setattr(store.Store, "_rm", real)
    writing.recover_store(store.Store.open(url))
    assert not any(k.startswith("checkpoint-4/") for k in s3_server.keys(url))


def test_rotation_cut_short_on_disk_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    _fit(out, epochs=3)
    real = shutil.rmtree

    def dies_midway(path, *args, **kwargs):
        os.remove(os.path.join(path, "state.pt"))  # part of it gone, then the process is killed
        raise KeyboardInterrupt

    monkeypatch.setattr(writing.shutil, "rmtree", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        writing.rotate(out, 1)
    monkeypatch.setattr(writing.shutil, "rmtree", real)
    named = sorted(n for n in os.listdir(out) if layout.CHECKPOINT_NAME.match(n))
    assert named == ["checkpoint-12", "checkpoint-8"]  # every final-named one complete
    assert all(writing.is_complete(os.path.join(out, n)) for n in named)
    writing.recover(out)  # the next run's tidying
    assert sorted(os.listdir(out)) == ["checkpoint-12", "checkpoint-8"]


def test_two_writers_on_one_prefix_are_refused(s3_server, workdir):
    url = s3_server.bucket() + "/run"
    held = bucket_lock.acquire(url)
    try:
        first = _FirstStep()
        with pytest.raises(DirectoryInUseError, match=f"`output_dir` '{url}' is in use .*pid {os.getpid()}"):
            _fit(url, epochs=1, callbacks=[first])
        assert not first.stepped
    finally:
        held.release()
    assert s3_server.keys(url) == []


def test_a_lock_left_by_a_dead_process_is_taken_over(s3_server, workdir):
    url = s3_server.bucket() + "/run"
    dead = {"run": "x", "pid": 2 ** 22 + 17, "host": __import__("socket").gethostname(), "started": "then"}
    s3_server.fs().pipe_file(url[5:] + "/.fitkit.lock", json.dumps(dead).encode())
    _fit(url, epochs=1)
    assert s3_server.keys(url) == [f"checkpoint-4/{f}" for f in FILES]


def test_the_lock_object_is_created_only_when_absent(s3_server):
    url = s3_server.bucket()
    where = store.Store.open(url)
    where.put_bytes("x", b"1", exclusive=True)
    with pytest.raises(FileExistsError):
        where.put_bytes("x", b"2", exclusive=True)  # S3's If-None-Match: *, refused by the server
    assert s3_server.fs().cat_file(url[5:] + "/x") == b"1"


# -- bad input: a clear error before the first step, nothing written locally ------------------------
def _refused(workdir, url, match):
    first = _FirstStep()
    with pytest.raises(store.StoreError, match=match):
        _fit(url, epochs=1, callbacks=[first])
    assert not first.stepped and _local_files(workdir) == []


def test_a_bucket_that_does_not_exist(s3_server, workdir):
    _refused(workdir, "s3://no-such-bucket-fitkit/run", r"'s3://no-such-bucket-fitkit/run'.*bucket "
                                                         r"'no-such-bucket-fitkit' does not exist.*create it")


def test_a_protocol_without_its_package(workdir, monkeypatch):
    import sys

    registry = sys.modules["fsspec.registry"]  # (the package's `registry` name is a mapping)
    monkeypatch.setitem(registry.known_implementations, "gs",
                        {"class": "gcsfs_missing.GCSFileSystem", "err": "Please install gcsfs"})
    monkeypatch.delitem(registry._registry, "gs", raising=False)
    _refused(workdir, "gs://bucket/run", r"`output_dir`='gs://bucket/run'.*pip install \"fitkit\[gcs\]\"")


def test_an_unknown_protocol(workdir):
    _refused(workdir, "nosuch://bucket/run", "nosuch://.*use a protocol fsspec knows")


@pytest.fixture
def fresh_s3fs():
    """s3fs filesystems built anew (fsspec caches them per process, with the environment of
    their first use), before and after the test."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_an_endpoint_that_does_not_answer(s3_server, workdir, monkeypatch, fresh_s3fs):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    _refused(workdir, "s3://ckpts/run", "'s3://ckpts/run' cannot be reached .*endpoint")


def test_refused_credentials(s3_server, workdir, monkeypatch, fresh_s3fs):
    from moto import settings

    url = s3_server.bucket() + "/run"
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the server checks keys now: "testing" is unknown
    _refused(workdir, url, "cannot be reached .*(PermissionError|InvalidAccessKeyId).*credentials")


# -- the other places a URL is accepted ----------------------------------------------------------
def test_model_save_and_load_through_a_url(s3_server, workdir):
    url = s3_server.bucket() + "/models/m.pt"
    model = _fit(str(workdir / "ref"), epochs=1, save_strategy="no")
    model.save(url)
    loaded = Model.load(url, _model(3).module)
    for a, b in zip(model.module.state_dict().values(), loaded.module.state_dict().values()):
        assert torch.equal(a, b)
    model.save_weights(url + ".weights")
    other = _model(4)
    other.load_weights(url + ".weights")
    for a, b in zip(model.module.state_dict().values(), other.module.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError, match="no object at `path`="):
        Model.load(url + ".missing", _model(3).module)
    assert _local_files(workdir / "cwd") == []


def test_model_checkpoint_and_backup_in_the_bucket(s3_server, workdir):
    url = s3_server.bucket()
    keep = ModelCheckpoint(url + "/w-{epoch}.pt", save_best_only=False)
    backup = BackupAndRestore(url + "/backup", delete_checkpoint=False)
    with pytest.raises(Crash):
        _fit(str(workdir / "out"), epochs=3, save_strategy="no", callbacks=[keep, backup, CrashAt(6)])
    assert [k for k in s3_server.keys(url) if k.startswith("w-")] == ["w-1.pt"]
    assert [k for k in s3_server.keys(url + "/backup") if k.endswith(layout.MANIFEST)] == [
        f"checkpoint-4/{layout.MANIFEST}"]
    first = _FirstStep()
    _fit(str(workdir / "out"), epochs=3, save_strategy="no", callbacks=[BackupAndRestore(url + "/backup"), first])
    assert first.start == 4
    assert s3_server.keys(url + "/backup") == []  # delete_checkpoint: removed when fit completes


# -- kill -9 mid-run, then resume ----------------------------------------------------------------
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "bucket_run.py")


def _run(args, env, kill_after=None, delay=0.0):
    """Run the script; with `kill_after`, kill -9 it `delay` s after it printed `SAVE {kill_after}`."""
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, SCRIPT, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if kill_after is not None and line.strip() == f"SAVE {kill_after}":
            time.sleep(delay)
            proc.kill()
            break
    proc.wait(timeout=300)
    return proc.returncode, "".join(lines)


@pytest.mark.slow
@pytest.mark.parametrize(("save_async", "delay"), [(False, 0.05), (True, 0.13)])
def test_kill_9_mid_run_then_resume_from_the_bucket(s3_server, tmp_path, save_async, delay):
    env = {**os.environ, **s3_server.env, "FITKIT_STAGING_DIR": str(tmp_path / "staging")}
    code, out = _run([str(tmp_path / "ref"), str(tmp_path / "ref.pt")], env)
    assert code == 0, out
    url = s3_server.bucket() + "/run"
    extra = ["--save-async"] if save_async else []
    code, out = _run([url, str(tmp_path / "a.pt"), "--sleep", "0.05", *extra], env, kill_after=6, delay=delay)
    assert code == -9 and "DONE" not in out, out
    code, out = _run([url, str(tmp_path / "b.pt"), "--resume", *extra], env)
    assert code == 0, out
    assert int(out.split("TRAIN_BEGIN ")[1].split()[0]) >= 6
    reference, resumed = torch.load(tmp_path / "ref.pt"), torch.load(tmp_path / "b.pt")
    assert all(torch.equal(reference[k], resumed[k]) for k in reference)
    assert not os.path.exists(tmp_path / "a.pt")
    assert _local_files(tmp_path / "staging") == []


# -- the endpoint stops answering mid-run ----------------------------------------------------------
class _StopServerAt(TrainerCallback):
    """Stops the S3 server once the checkpoint of `step` is committed (its `on_save`), and starts
    it again `back_after` seconds later (None: not during the run). Records the saves announced."""

    def __init__(self, server, step, back_after):
        self.server, self.step, self.back_after, self.saved = server, step, back_after, []

    def on_save(self, args, state, control, **kwargs):
        import threading

        self.saved.append(state.global_step)
        if state.global_step == self.step:
            self.server.stop()
            if self.back_after is not None:
                threading.Timer(self.back_after, self.server.restart).start()


def test_an_endpoint_down_for_a_while_is_survived(s3_server, workdir):
    url = s3_server.bucket() + "/run"
    stop = _StopServerAt(s3_server, 4, back_after=1.5)
    _fit(url, epochs=3, save_strategy="steps", save_steps=4, save_async=True, callbacks=[stop])
    assert stop.saved == [4, 8, 12]
    assert [k for k in s3_server.keys(url) if k.endswith(layout.MANIFEST)] == [
        f"checkpoint-{n}/{layout.MANIFEST}" for n in (12, 4, 8)]
    assert [os.path.basename(p) for p in writing.list_checkpoints(url)] == ["checkpoint-4", "checkpoint-8",
                                                                            "checkpoint-12"]


@pytest.mark.parametrize("save_async", [False, True])
def test_an_endpoint_gone_for_good_is_reported_and_nothing_committed_is_lost(s3_server, workdir, monkeypatch,
                                                                             fresh_s3fs, save_async):
    monkeypatch.setattr(store, "RETRY_DELAYS", (0.1,))
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    url = s3_server.bucket() + "/run"
    stop = _StopServerAt(s3_server, 4, back_after=None)
    try:
        with pytest.raises(layout.CheckpointWriteError, match=f"{url}/checkpoint-8.*earlier checkpoints .* intact"):
            _fit(url, epochs=3, save_strategy="steps", save_steps=4, save_async=save_async, callbacks=[stop])
    finally:
        s3_server.restart()
    assert stop.saved == [4]  # the failed one never announced
    assert [os.path.basename(p) for p in writing.list_checkpoints(url)] == ["checkpoint-4"]
    where = store.Store.open(url)
    from fitkit.engine.checkpoint.verify import verified

    shutil.rmtree(verified(f"{url}/checkpoint-4"))  # verifies whole after the run's failure
    assert where.exists(".fitkit.lock")  # the lock could not be removed with the endpoint down (a later run takes it over)


def test_a_run_on_local_disk_imports_no_fsspec(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys, torch\nfrom fitkit import Model\n"
        "m = Model(torch.nn.Linear(4, 1)).compile('sgd', 'mse')\n"
        f"m.fit(torch.randn(16, 4), torch.randn(16, 1), epochs=2, verbose=0, output_dir={str(tmp_path)!r}, "
        "save_strategy='epoch', save_total_limit=1, save_async=True)\n"
        f"m.fit(torch.randn(16, 4), torch.randn(16, 1), epochs=3, verbose=0, output_dir={str(tmp_path)!r}, "
        "save_strategy='epoch', resume_from_checkpoint=True)\n"
        "print(sorted(n for n in ('fsspec', 's3fs', 'botocore') if n in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_tracking_files_stay_local_beside_a_bucket(s3_server, workdir):
    url = s3_server.bucket() + "/run"
    _fit(url, epochs=1, report_to="csv")
    bucket = url[5:].split("/")[0]
    assert _local_files(workdir) == [f"cwd/fitkit_output/s3/{bucket}/run/logs.csv"]
    assert s3_server.keys(url) == [f"checkpoint-4/{f}" for f in FILES]


# -- FSDP: sharded checkpoints in the bucket, resumed on another number of processes ---------------
def _shard_reads(logs, rank):
    """What the process `rank` read of the DCP shard files (`__R_0.distcp`) in the bucket:
    `(files read whole, {file: [offsets of the byte ranges read]})`."""
    whole, ranges = set(), {}
    with open(logs / f"reads-rank-{rank}.txt") as f:
        for key, span in (line.split() for line in f):
            if key.endswith(".distcp"):
                if span == "whole":
                    whole.add(os.path.basename(key))
                else:
                    ranges.setdefault(os.path.basename(key), []).append(int(span[len("bytes="):].split("-")[0]))
    return sorted(whole), ranges


def _records(s3_server, checkpoint, tmp_path):
    """The records of a DCP checkpoint in the bucket: `{(file, offset): name}` (from its .metadata)."""
    from fitkit.engine.checkpoint.elastic import safe_reader

    folder = tmp_path / "metadata"
    folder.mkdir()
    s3_server.fs().get_file(f"{checkpoint[5:]}/state.pt/.metadata", str(folder / ".metadata"))
    return {(info.relative_path, info.offset): index.fqn
            for index, info in safe_reader(str(folder)).read_metadata().storage_data.items()}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_fsdp_checkpoints_in_the_bucket_resume_on_one_process_and_on_two_machines(s3_server, tmp_path):
    import subprocess
    import sys

    from test_elastic import CUT, _check_resumed, _results

    script = os.path.join(os.path.dirname(__file__), "scripts", "elastic.py")
    url = s3_server.bucket()

    def launch(name, *args, world=1):
        results, logs = tmp_path / name, tmp_path / f"reads-{name}"
        results.mkdir()
        logs.mkdir()
        proc = subprocess.run([sys.executable, script, "--results", str(results), "--output", f"{url}/{name}",
                               "--staging-per-rank", str(tmp_path / f"staging-{name}"), "--log-reads", str(logs),
                               *args], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return _results(results, 0, world), logs

    # the uninterrupted run, which leaves its checkpoint of step CUT in the bucket on its way
    writer, _ = launch("fsdp2", "--strategy", "fsdp", "--devices", "2", "--save-steps", str(CUT), world=2)
    checkpoint = f"{url}/fsdp2/0/checkpoint-{CUT}"
    shards = [k for k in s3_server.keys(f"{url}/fsdp2/0") if k.startswith(f"checkpoint-{CUT}/state.pt/__")]
    assert sorted(os.path.basename(k) for k in shards) == ["__0_0.distcp", "__1_0.distcp"]  # one per process
    # two processes, each with a staging folder of its own (two machines): each reads its own shards alone
    on2, logs = launch("on2", "--strategy", "fsdp", "--devices", "2", "--init-seed", "7", "--resume", checkpoint,
                       world=2)
    _check_resumed(writer, on2, 48)
    assert [r["end"] for r in on2] == [r["end"] for r in writer]  # the uninterrupted run's weights, bit for bit
    records = _records(s3_server, checkpoint, tmp_path)
    for rank in (0, 1):
        whole, ranges = _shard_reads(logs, rank)
        assert whole == [f"__{rank}_0.distcp"]  # its own shards; of the other's file ...
        shared = [records[(f"__{1 - rank}_0.distcp", at)] for at in ranges.get(f"__{1 - rank}_0.distcp", [])]
        # ... only what DCP writes once for every process: the optimizer's settings and step counts
        assert all(".param_groups." in name or name.endswith(".step") for name in shared), shared
    assert _shard_reads(logs, 0)[1] or _shard_reads(logs, 1)[1]  # (DCP wrote those into one of the files)
    assert _local_files(tmp_path / "staging-on2") == []  # every copy removed at the end
    # one process reads both shards; it ends as the same resume from a copy on disk does
    on1, logs = launch("on1", "--init-seed", "7", "--resume", checkpoint)
    _check_resumed(writer, on1, 48)
    assert _shard_reads(logs, 0)[0] == ["__0_0.distcp", "__1_0.distcp"]
    disk = tmp_path / "copy" / f"checkpoint-{CUT}"
    s3_server.fs().get(checkpoint[5:], str(disk), recursive=True)
    on_disk, _ = launch("disk", "--init-seed", "7", "--resume", str(disk))
    assert on1[0]["end"] == on_disk[0]["end"]
    # a record read by its byte range is checked against its own digest
    from fitkit.engine.checkpoint import shards, verify

    fs, other = s3_server.fs(), f"{checkpoint[5:]}/state.pt/__1_0.distcp"
    at = next(k[1] for k, n in records.items() if k[0] == "__1_0.distcp" and ".param_groups." in n)
    manifest = json.loads(fs.cat_file(f"{checkpoint[5:]}/{layout.MANIFEST}"))
    length = next(int(k.split("+")[1]) for k in manifest["pieces"]["state.pt/__1_0.distcp"] if int(k.split("+")[0]) == at)
    local = verify.verified(checkpoint)
    try:
        moved = shards.fetch_missing(local, {"state.pt/__1_0.distcp": [(at, length)]})
        with open(moved["state.pt/__1_0.distcp"], "rb") as f:
            f.seek(at)
            assert f.read(length) == fs.cat_file(other, start=at, end=at + length)
        assert not os.path.exists(os.path.join(local, "state.pt", "__1_0.distcp"))  # not downloaded whole
        kept = fs.cat_file(other)
        data = bytearray(kept)
        data[at + length // 2] ^= 0xFF
        fs.pipe_file(other, bytes(data))
        with pytest.raises(layout.CheckpointError, match=f"{checkpoint}.* is corrupted: state.pt/__1_0.distcp"):
            shards.fetch_missing(local, {"state.pt/__1_0.distcp": [(at, length)]})
        fs.pipe_file(other, kept)
    finally:
        store.discard([local], True)
    # a shard changed in the bucket (same size): refused by the process that reads it, before it loads
    key = f"{checkpoint[5:]}/state.pt/__0_0.distcp"
    data = bytearray(fs.cat_file(key))
    data[-8] ^= 0xFF
    fs.pipe_file(key, bytes(data))
    (tmp_path / "damaged").mkdir()
    proc = subprocess.run([sys.executable, script, "--results", str(tmp_path / "damaged"), "--output",
                           f"{url}/damaged", "--resume", checkpoint], capture_output=True, text=True, timeout=600)
    last = proc.stderr.strip().splitlines()[-1]
    assert "CheckpointException" not in proc.stderr, proc.stderr[-3000:]  # fitkit's error, not DCP's wrapper of it
    assert proc.returncode != 0 and last.startswith("fitkit.engine.checkpoint.layout.CheckpointError: checkpoint "
                                                    f"{checkpoint!r} is corrupted: state.pt/__0_0.distcp"), last


def test_sharded_saves_from_several_machines_need_a_shared_staging_folder(monkeypatch):
    from types import SimpleNamespace

    from fitkit import TrainingArguments

    monkeypatch.delenv("FITKIT_STAGING_DIR", raising=False)
    two_nodes = SimpleNamespace(world_size=4, strategy=SimpleNamespace(num_nodes=2))
    args = TrainingArguments(output_dir="s3://ckpts/run", save_strategy="steps")
    with pytest.raises(store.StoreError, match="fsdp_full_checkpoint=True or save_async=True .*FITKIT_STAGING_DIR"):
        store.check_sharded_save(args, two_nodes, "FSDPStrategy")
    store.check_sharded_save(args, two_nodes, "DDPStrategy")  # one file, written by the global-zero process
    store.check_sharded_save(TrainingArguments(output_dir="s3://ckpts/run", fsdp_full_checkpoint=True), two_nodes,
                             "FSDPStrategy")
    store.check_sharded_save(TrainingArguments(output_dir="out"), two_nodes, "FSDPStrategy")
    monkeypatch.setenv("FITKIT_STAGING_DIR", "/shared/staging")
    store.check_sharded_save(args, two_nodes, "FSDPStrategy")


def test_a_silent_lock_is_taken_over_and_a_held_one_kept_fresh(s3_server, monkeypatch):
    import time

    url = s3_server.bucket()
    elsewhere = {"run": "x", "pid": 1, "host": "another-machine", "started": "then"}
    s3_server.fs().pipe_file(url[5:] + "/.fitkit.lock", json.dumps(elsewhere).encode())
    with pytest.raises(DirectoryInUseError, match="another-machine.*not renewed for 120 s"):
        bucket_lock.acquire(url)  # written just now: its holder may be alive
    monkeypatch.setenv("FITKIT_LOCK_STALE_S", "0")
    monkeypatch.setattr(bucket_lock, "HEARTBEAT_S", 0.2)
    time.sleep(1.1)  # the store's clock counts whole seconds
    held = bucket_lock.acquire(url)  # silent for longer than FITKIT_LOCK_STALE_S: taken over
    try:
        assert json.loads(s3_server.fs().cat_file(url[5:] + "/.fitkit.lock"))["run"] == held.record["run"]
        monkeypatch.setenv("FITKIT_LOCK_STALE_S", "3")
        time.sleep(4)  # longer than that: only the heartbeat keeps it fresh
        with pytest.raises(DirectoryInUseError):
            bucket_lock.acquire(url)
    finally:
        held.release()
    assert s3_server.keys(url) == []


@pytest.mark.parametrize("save_async", [False, True])
def test_rotation_in_the_bucket_keeps_the_best_checkpoint_and_loads_it_at_the_end(s3_server, workdir, save_async):
    from helpers import Script

    url = s3_server.bucket() + "/run"
    x, y = _data()
    model = _model()
    model.fit(x, y, epochs=4, batch_size=16, validation_data=(x[:16], y[:16]), output_dir=url, verbose=0,
              save_strategy="epoch", save_total_limit=1, save_async=save_async, load_best_model_at_end=True,
              callbacks=[Script("val_loss", [0.5, 0.1, 0.4, 0.3])])
    assert model.state.best_model_checkpoint == f"{url}/checkpoint-8"
    assert [os.path.basename(p) for p in writing.list_checkpoints(url)] == ["checkpoint-8", "checkpoint-16"]
    best = torch.load(__import__("io").BytesIO(s3_server.fs().cat_file(url[5:] + "/checkpoint-8/state.pt")),
                      weights_only=True)["model"]
    assert all(torch.equal(best[k], v) for k, v in model.module.state_dict().items())
    assert _local_files(workdir) == []


def test_search_trials_write_their_checkpoints_into_the_bucket(s3_server, workdir):
    pytest.importorskip("optuna")
    url = s3_server.bucket() + "/search"
    x, y = _data()

    def model_init(trial):
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    model = Model(model_init=model_init).compile("adam", "cross_entropy")
    best = model.hyperparameter_search(
        x, y, validation_split=0.25, n_trials=2, epochs=2, batch_size=16, verbose=0, output_dir=url,
        save_strategy="epoch", hp_space=lambda trial: {"learning_rate": trial.suggest_float("lr", 1e-3, 1e-2)},
        storage=f"sqlite:///{workdir / 'study.db'}", study_name="bucket")
    keys = s3_server.keys(url)
    for n in (0, 1):
        assert f"run-{n}/checkpoint-6/{layout.MANIFEST}" in keys
    assert best.run_summary["output_dir"].startswith(url + "/run-")
    assert _local_files(workdir) == ["study.db"]


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_other_fsspec_protocols_hold_checkpoints_too(tmp_path, workdir, scheme):
    import uuid

    url = f"file://{tmp_path}/out" if scheme == "file" else f"memory://fitkit-{uuid.uuid4().hex[:8]}/run"
    _fit(url, epochs=2, save_total_limit=1)
    first = _FirstStep()
    _fit(url, epochs=3, save_total_limit=1, resume_from_checkpoint=True, callbacks=[first])
    assert first.start == 8
    assert [os.path.basename(p) for p in writing.list_checkpoints(url)] == ["checkpoint-12"]
    assert _local_files(workdir / "cwd") == [] and _local_files(workdir / "staging") == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_search_trial_killed_mid_run_is_resumed_from_the_bucket_by_another_worker(s3_server, tmp_path,
                                                                                      monkeypatch):
    optuna = pytest.importorskip("optuna")
    import test_search_cluster as cluster

    monkeypatch.setenv("FITKIT_STAGING_DIR", str(tmp_path / "staging"))
    monkeypatch.chdir(tmp_path)
    url, storage, final = s3_server.bucket() + "/search", f"sqlite:///{tmp_path / 'study.db'}", tmp_path / "final"
    final.mkdir()
    # 6 steps an epoch, 3 epochs, checkpoints every 4 steps: killed (-9) at step 9, after checkpoint-8
    first = cluster.start(storage, url, "--n-trials", 1, "--hold", 9, "--final", final)
    cluster.wait_for(first, "HOLD")
    first.kill()
    first.communicate()
    assert f"run-0/checkpoint-8/{layout.MANIFEST}" in s3_server.keys(url)
    code, out = cluster.finish(cluster.start(storage, url, "--n-trials", 1, "--final", final))  # trial 0 goes stale
    assert code == 0, out
    assert "BEGIN run-0 8\n" in out  # the re-run of trial 0 resumed from its checkpoint in the bucket
    study = optuna.load_study(study_name="search", storage=storage)
    resumed = next(t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    assert resumed.user_attrs["output_dir"] == f"{url}/run-0" and resumed.user_attrs["resumed_from"] is not None
    assert resumed.user_attrs["best_checkpoint"].startswith(f"{url}/run-0/checkpoint-")
    # the same trial uninterrupted, on local disk: the same reports and weights, bit for bit
    code, out = cluster.finish(cluster.start(f"sqlite:///{tmp_path / 'ref.db'}", tmp_path / "ref", "--n-trials", 1,
                                             "--enqueue", json.dumps(resumed.params)))
    assert code == 0, out
    reference = optuna.load_study(study_name="search", storage=f"sqlite:///{tmp_path / 'ref.db'}").trials[0]
    assert resumed.intermediate_values == reference.intermediate_values
    got, want = torch.load(final / "run-0.pt"), torch.load(tmp_path / "ref" / "run-0" / "final.pt")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert not os.path.exists(tmp_path / "s3:") and _local_files(tmp_path / "staging") == []
