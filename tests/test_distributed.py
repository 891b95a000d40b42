"""Several processes on CPU (gloo): real Fabric strategies in real processes.

Fabric's "ddp" launcher re-runs the whole script in each child, so these tests run small
scripts as subprocesses and check what every process printed, not only the exit code.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import STRESS, reserved_port, stress_only

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "distributed.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import distributed as script  # noqa: E402

pytestmark = pytest.mark.slow


def _results(proc, directory, expected):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(os.listdir(directory))
    assert len(names) == expected, f"{names}\n{proc.stdout}{proc.stderr}"
    results = []
    for name in names:
        with open(os.path.join(directory, name)) as f:
            results.append(json.load(f))
    return sorted(results, key=lambda r: r["rank"])


def _run(*extra, launcher=(), expected=2, timeout=240):
    import tempfile

    cmd = [*launcher] if launcher else [sys.executable]
    with tempfile.TemporaryDirectory() as directory, reserved_port() as port:
        proc = subprocess.run([*cmd, SCRIPT, "--results", directory, *extra], capture_output=True, text=True,
                              timeout=timeout, env=_with_port(port))
        return proc, _results(proc, directory, expected)


def _with_port(port):
    """The environment with a reserved MASTER_PORT: Fabric's launcher would pick a free port and
    close it, and another process could take it before the rendezvous binds it."""
    return dict(os.environ, MASTER_PORT=str(port))


# torchrun without a fixed port: its agent binds port 0 for the rendezvous and tells the workers
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _single_process_view(result):
    """Evaluate and predict with the trained weights in this process, the reference."""
    x, y = script.data()
    net = script.net()
    for p, w in zip(net.parameters(), result["weights"]):
        p.data = torch.tensor(w, dtype=torch.float32).reshape(p.shape)
    net.eval()
    with torch.no_grad():
        out = net(x)
    loss = torch.nn.functional.cross_entropy(out, y).item()
    accuracy = (out.argmax(1) == y).float().mean().item()
    return out, loss, accuracy


def _check_agreement(results):
    a, b = results
    assert a["world"] == b["world"] == 2
    assert (a["zero"], b["zero"]) == (True, False) and a["local_zero"]
    assert a["history"] == b["history"] and a["log_history"] == b["log_history"]
    assert a["evaluate"] == b["evaluate"] and a["predict"] == b["predict"]
    assert a["weights"] == b["weights"]
    out, loss, accuracy = _single_process_view(a)
    assert len(a["predict"]) == 203  # every row once, none repeated by padding
    torch.testing.assert_close(torch.tensor(a["predict"]), out, rtol=1e-5, atol=1e-5)
    assert a["evaluate"]["loss"] == pytest.approx(loss, rel=1e-5)
    assert a["evaluate"]["accuracy"] == pytest.approx(accuracy, abs=1e-6)


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory):
    """Whole runs (saving every 4 steps), one per strategy, run once: the references several
    tests compare with."""
    runs = {}

    def run(strategy):
        if strategy not in runs:
            runs[strategy] = _run("--strategy", strategy, "--output", str(tmp_path_factory.mktemp(strategy)))
        return runs[strategy]

    return run


def test_ddp_through_the_fabric_launcher(full_runs):
    proc, results = full_runs("ddp")
    _check_agreement(results)
    # The other process was started before this one began importing Lightning (early_start), so
    # the two imports of several seconds each ran at once, not one after the other.
    began, started = results[0]["lightning_import_began"], results[1]["started"]
    assert started <= began + 0.02, f"process 1 started {started - began:.2f} s after process 0 began importing"
    assert proc.stdout.count("Epoch 1/3") == 1  # only the world-zero process prints
    assert results[0]["shards"] == [(16, 8), (16,), (2, 16), (2,)] or results[0]["shards"] == [[16, 8], [16], [2, 16], [2]]
    _check_padded(results)


def _check_padded(results):
    """Outputs of varying length: padded with -100 across batches and the two processes, as one
    process pads them (positions past a sample's own length hold the model's output or -100 by
    the batch it fell in, as under HF's Trainer: they are compared where labels are kept)."""
    import padded_ddp  # tests/scripts, on the path as `distributed` is

    from fitkit import Model

    one = padded_ddp.calls(Model(padded_ddp.PerPosition()).compile(accelerator="cpu"))
    a, b = results[0]["padded"], results[1]["padded"]
    assert a == b
    for name in ("width", "rows", "kept", "kept_logits", "padded"):
        assert a["evaluate"][name] == pytest.approx(one["evaluate"][name], rel=1e-6), name
    ours, theirs = torch.tensor(a["predict"]), torch.tensor(one["predict"])
    assert ours.shape == theirs.shape == (21, 7, 2)
    kept = torch.tensor([[j < len(r["x"]) for j in range(7)] for r in padded_ddp.ROWS])
    torch.testing.assert_close(ours[kept], theirs[kept])


def test_ddp_through_torchrun():
    proc, results = _run("--strategy", "ddp", launcher=TORCHRUN)
    _check_agreement(results)


def test_fsdp_shards_parameters_and_matches_ddp(full_runs):
    _, ddp = full_runs("ddp")
    _, fsdp = full_runs("fsdp")
    _check_agreement(fsdp)
    assert [list(s) for s in fsdp[0]["shards"]] == [[8, 8], [8], [1, 16], [1]]  # each rank holds half
    for w_fsdp, w_ddp in zip(fsdp[0]["weights"], ddp[0]["weights"]):
        torch.testing.assert_close(torch.tensor(w_fsdp), torch.tensor(w_ddp), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy, extra", [("ddp", ()), ("fsdp", ()), stress_only("fsdp", ("--full-checkpoint",))])
def test_resume_under_several_processes_is_exact(tmp_path, full_runs, strategy, extra):
    _, full = _run("--strategy", strategy, "--output", str(tmp_path / "full"), *extra) if extra else \
        full_runs(strategy)
    out = str(tmp_path / "cut")
    _run("--strategy", strategy, "--output", out, "--max-steps", "5", "--save-steps", "5", *extra)
    saved = os.path.join(out, "checkpoint-5", "state.pt")
    assert os.path.isdir(saved) if strategy == "fsdp" and not extra else os.path.isfile(saved)
    # other initial weights, and a failure if no checkpoint is found: only a real resume ends equal
    _, resumed = _run("--strategy", strategy, "--output", out, "--expect-resume", "--init-seed", "7", *extra)
    for a, b in zip(full, resumed):
        assert b["log_history"] == a["log_history"]
        assert b["weights"] == a["weights"]


def test_sigterm_to_every_process_checkpoints_once_and_resumes_exactly(tmp_path, full_runs):
    import signal

    _, full = full_runs("ddp")
    out = str(tmp_path / "cut")
    # Both processes wait at the end of step 6 until their SIGTERM has arrived (a handshake, not
    # timing): the signal is in before the step-10 agreement however slow the machine is.
    with reserved_port() as port:
        proc = subprocess.Popen([sys.executable, SCRIPT, "--results", str(tmp_path), "--strategy", "ddp",
                                 "--output", out, "--save-steps", "1000", "--wait-for-sigterm-at", "6"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                env=_with_port(port))
        seen, waiting = [], 0
        try:
            for line in proc.stdout:
                seen.append(line)
                waiting += line.startswith("WAITING")
                if waiting == 2:
                    os.killpg(proc.pid, signal.SIGTERM)  # as SLURM does: every task of the job
                    break
            rest, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:  # a failed run leaves no process behind
                os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    saves = [int(l.split("step=")[1]) for l in output.splitlines() if l.startswith("SAVE")]
    assert saves == [10, 10], output  # both processes, at the agreed step
    assert not [n for n in os.listdir(tmp_path) if n.startswith("rank-")]  # it stopped before the end
    assert os.listdir(out) == ["checkpoint-10"]
    _, resumed = _run("--strategy", "ddp", "--output", out, "--save-steps", "1000", "--expect-resume",
                      "--init-seed", "7")
    for a, b in zip(full, resumed):
        assert b["log_history"] == a["log_history"] and b["weights"] == a["weights"]


def test_two_nodes_simulated_on_loopback(tmp_path):
    procs = []
    with reserved_port() as port:  # both nodes must know it in advance: reserved, not picked and released
        for node in range(2):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                   f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", SCRIPT,
                   "--results", str(tmp_path), "--strategy", "ddp", "--devices", "1", "--num-nodes", "2"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outputs = [proc.communicate(timeout=240) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, out + err
    results = _results(subprocess.CompletedProcess([], 0, "", ""), tmp_path, 2)
    assert [r["rank"] for r in results] == [0, 1]
    _check_agreement(results)  # both nodes end with identical weights
    assert results[1]["local_zero"]  # the only process of its node


def test_search_under_ddp_trains_the_same_configuration_on_every_rank(tmp_path):
    _, results = _run("--mode", "search", "--output", str(tmp_path))
    a, b = results
    assert len(a["trials"]) == 3 and a["trials"] == b["trials"]  # same parameters, same trained weights
    assert a["best"] == b["best"]
    import optuna

    study = optuna.load_study(study_name="ddp", storage=f"sqlite:///{tmp_path}/study.db")
    assert len(study.trials) == 3  # only rank 0 wrote to the storage


# The smallest DDP fit; each process writes DONE (one write: lines cannot interleave). After
# fitkit's exit teardown each process also reports the distributed threads still alive (gloo's,
# the rendezvous store's: none may live into interpreter finalization) and, under Fabric's
# launcher, the first one the exit codes of the processes it started (the job's own code is
# only the first process's).
TINY = """
import atexit, os
import torch
from fitkit import Model

def after_teardown():  # registered before fit, so it runs after fitkit's exit teardown
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # a thread that just ended
            pass
    left = sorted(n for n in names if n.startswith(("gloo", "pt_gloo", "pt_tcpstore")))
    os.write(1, f"THREADS {rank} {left}\\n".encode())
    codes = [p.poll() for p in getattr(launcher, "procs", None) or ()]
    if codes:
        os.write(1, f"CHILDREN {codes}\\n".encode())

atexit.register(after_teardown)
x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
m = Model(torch.nn.Linear(4, 2)).compile("sgd", "cross_entropy", strategy="ddp", devices=2, accelerator="cpu")
m.fit(x, y, max_steps=1, batch_size=8, verbose=0)
rank, launcher = m.fabric.global_rank, getattr(m.fabric.strategy, "launcher", None)
os.write(1, f"DONE {rank}\\n".encode())
"""


# The default run makes 2 consecutive runs (one per launcher); `make stress` (FITKIT_STRESS=1) makes the full forty.
CONSECUTIVE_RUNS = 40 if STRESS else 2


@pytest.mark.stress
@pytest.mark.timeout(1200)  # up to 40 runs of two processes, each importing torch and Lightning
def test_consecutive_runs_end_cleanly_with_a_busy_core(tmp_path):
    tiny = tmp_path / "tiny.py"
    tiny.write_text(TINY)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core taken, as on a shared node
    try:
        for i in range(CONSECUTIVE_RUNS):
            torchrun = i % 2 == 1
            with reserved_port() as port:
                proc = subprocess.run([*TORCHRUN, str(tiny)] if torchrun else [sys.executable, str(tiny)],
                                      capture_output=True, text=True, timeout=180, env=_with_port(port))
            output = f"run {i} ({'torchrun' if torchrun else 'Fabric launcher'}):\n{proc.stdout}{proc.stderr}"
            assert "terminate called" not in output and "Abort" not in output and "SIGABRT" not in output, output
            assert proc.returncode == 0, output  # torchrun: 0 only when every rank exited 0
            lines = proc.stdout.splitlines()
            assert sorted(l for l in lines if l.startswith("DONE")) == ["DONE 0", "DONE 1"], output
            assert sorted(l for l in lines if l.startswith("THREADS")) == ["THREADS 0 []", "THREADS 1 []"], output
            if not torchrun:
                assert "CHILDREN [0]" in lines, output
    finally:
        busy.kill()
        busy.wait()


def test_ddp_spawn_brings_the_trained_weights_back(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(SCRIPT), "spawned.py"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["changed"] and result["global_step"] == 3 * 2  # 100 samples / (2 x 32) per step
    assert len(result["history"]["accuracy"]) == 3
    assert result["evaluate"]["accuracy"] == pytest.approx(result["local_accuracy"], abs=1e-6)
    torch.testing.assert_close(torch.tensor(result["predict"]), torch.tensor(result["local"]), rtol=1e-5, atol=1e-5)


def test_ddp_spawn_takes_fitkit_arguments_and_steps_each_process_own_parameters(tmp_path):
    # a frozen TrainingArguments failed in Lightning's launcher; the module inside the Model stayed in
    # the memory the processes shared, and each step was applied by both
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(SCRIPT), "spawn_args.py"), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["ddp_spawn"]["steps"] == result["auto"]["steps"] == 2 * 4
    for spawned, alone in zip(result["ddp_spawn"]["weights"], result["auto"]["weights"]):
        torch.testing.assert_close(torch.tensor(spawned), torch.tensor(alone), rtol=0, atol=1e-6)


def test_trackers_write_only_from_the_world_zero_process(tmp_path):
    _, results = _run("--strategy", "ddp", "--output", str(tmp_path), "--save-steps", "1000", "--report-to", "csv")
    import csv

    with open(tmp_path / "logs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    records = results[0]["log_history"]  # every record but the closing summary
    assert [int(r["step"]) for r in rows] == [r["step"] for r in records] + [records[-1]["step"]]  # each once
