"""Real processes: SIGTERM checkpoints and stops cleanly; SIGKILL at any moment leaves a usable
checkpoint; every rerun with resume_from_checkpoint=True continues exactly."""

import json
import os
import random
import signal
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "preemptible.py")
TOTAL_STEPS = 40  # 160 samples / batch 8 x 2 epochs


def _run(out, *extra, timeout=120):
    proc = subprocess.run([sys.executable, SCRIPT, str(out), *extra], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _result(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, stdout
    return json.loads(lines[-1][len("RESULT "):])


def _start(out, sleep):
    return subprocess.Popen([sys.executable, SCRIPT, str(out), "--resume", "--sleep", str(sleep)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_step(proc, step):
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("STEP ") and int(line.split()[1]) >= step:
            return seen
    raise AssertionError("process ended before step %d:\n%s" % (step, "".join(seen)))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _result(_run(tmp_path_factory.mktemp("reference")).stdout)


@pytest.mark.slow
def test_sigterm_checkpoints_stops_cleanly_and_resumes_exactly(tmp_path, reference):
    proc = _start(tmp_path, sleep=0.05)
    seen = _wait_for_step(proc, 7)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    assert "RESULT" not in output  # it stopped, it did not run to the end
    stopped_at = int([l for l in output.splitlines() if l.startswith("TRAIN_END")][-1].split()[1])
    assert f"SAVE {stopped_at}" in output and stopped_at < TOTAL_STEPS
    lines = output.splitlines()
    assert lines.index(f"SAVE {stopped_at}") < lines.index(f"TRAIN_END {stopped_at}")
    assert os.path.isdir(tmp_path / f"checkpoint-{stopped_at}")

    resumed = _result(_run(tmp_path, "--resume").stdout)
    assert resumed == reference


@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes(tmp_path, reference):
    rng = random.Random(1234)
    for _ in range(3):
        proc = _start(tmp_path, sleep=0.02)
        last = max((int(n.split("-")[1]) for n in os.listdir(tmp_path) if n.startswith("checkpoint-")), default=0)
        _wait_for_step(proc, min(last + rng.randint(2, 8), TOTAL_STEPS - 2))
        proc.kill()  # SIGKILL: no handler, no cleanup, possibly in the middle of a save
        proc.wait(timeout=30)
    final = _result(_run(tmp_path, "--resume").stdout)
    assert final["global_step"] == TOTAL_STEPS
    assert final == reference
