"""Real processes: SIGTERM checkpoints and stops cleanly; SIGKILL at any moment leaves a usable
checkpoint; every rerun with resume_from_checkpoint=True continues exactly.

Every rerun meant to resume starts from other initial weights than the reference run and is
told to fail when it finds no checkpoint (`--expect-resume`): only a real resume ends equal."""

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


def _resume(out, init_seed):
    """A rerun that must resume (other initial weights; it fails if it finds no checkpoint)."""
    return _run(out, "--expect-resume", "--init-seed", str(init_seed))


def _result(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, stdout
    return json.loads(lines[-1][len("RESULT "):])


def _start(out, *extra):
    return subprocess.Popen([sys.executable, SCRIPT, str(out), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for(proc, done):
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if done(line):
            return seen
    raise AssertionError("the process ended first:\n" + "".join(seen))


def _newest(out):
    return max((int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-")), default=0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _result(_run(tmp_path_factory.mktemp("reference")).stdout)


@pytest.mark.slow
def test_sigterm_checkpoints_stops_cleanly_and_resumes_exactly(tmp_path, reference):
    # The run waits at the end of step 7 until the signal has arrived: no race with training.
    proc = _start(tmp_path, "--resume", "--wait-for-sigterm-at", "7")
    seen = _wait_for(proc, lambda line: line.startswith("WAITING"))
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    output = "".join(seen) + rest
    assert proc.returncode == 0, output
    assert "RESULT" not in output  # it stopped, it did not run to the end
    lines = output.splitlines()
    assert lines.index("SAVE 7") < lines.index("TRAIN_END 7") and "STEP 8" not in lines
    assert _newest(tmp_path) == 7  # the SIGTERM checkpoint, between the periodic ones (save_steps=3)

    resumed = _resume(tmp_path, init_seed=99)
    assert "TRAIN_BEGIN 7" in resumed.stdout.splitlines()
    assert _result(resumed.stdout) == reference


@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes(tmp_path, reference):
    rng = random.Random(1234)
    for attempt in range(3):
        last = _newest(tmp_path)
        # the first start finds nothing and starts fresh, as the reference; the next ones must resume
        extra = ("--expect-resume", "--init-seed", str(100 + attempt)) if last else ("--resume",)
        proc = _start(tmp_path, "--sleep", "0.02", *extra)
        target = min(last + rng.randint(2, 8), TOTAL_STEPS - 2)
        _wait_for(proc, lambda line, target=target: line.startswith("STEP ") and int(line.split()[1]) >= target)
        proc.kill()  # SIGKILL: no handler, no cleanup, possibly in the middle of a save
        proc.wait(timeout=30)
    assert _newest(tmp_path) > 0
    final = _result(_resume(tmp_path, init_seed=77).stdout)
    assert final["global_step"] == TOTAL_STEPS
    assert final == reference


@pytest.mark.slow
def test_a_rerun_meant_to_resume_fails_when_it_finds_no_checkpoint(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path), "--expect-resume"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3 and "NOT RESUMED" in proc.stdout, proc.stdout + proc.stderr
