"""The examples run as a newcomer runs them."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, cwd):
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_digits_demo(tmp_path):
    out = _run(os.path.join(ROOT, "examples", "digits.py"), cwd=tmp_path)
    accuracy = float(out.split("final validation accuracy: ")[1].split()[0])
    assert accuracy >= 0.95
    assert "Total params" in out and "search: best of 4 trials" in out


@pytest.mark.slow
def test_search_example_with_a_persistent_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'digits.db'}"
    script = os.path.join(ROOT, "examples", "search.py")
    first = _run(script, "--trials", "3", "--storage", storage, cwd=tmp_path)
    assert "3 trials in" in first
    second = _run(script, "--trials", "5", "--storage", storage, cwd=tmp_path)  # continues the study
    assert "5 trials in" in second and "optuna-dashboard" in second
