"""The suite is device-aware: a test checks CPU behaviour unless it is marked `cuda`.

tests/conftest.py pins `accelerator="auto"` (fitkit's default) to the CPU through the documented
`FITKIT_ACCELERATOR` variable (and Keras' and Accelerate's own variables for the peers), so the
suite passes on a machine where CUDA is visible as on one without; a test marked `cuda` runs with
the pins lifted, and is skipped where torch sees no GPU. A visible GPU is simulated here by
patching `torch.cuda.is_available` (this machine's torch is a CPU build)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import CPU_PINS
from helpers import blobs, mlp

from fitkit import Model
from fitkit.config.arguments import TrainingArguments
from fitkit.config.devices import auto_accelerator, check_devices
from fitkit.engine.devices.local import local_device

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def visible_gpu(monkeypatch):
    """torch reports one CUDA GPU (nothing may touch it: a test that does fails on this build)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_the_suite_runs_auto_on_the_cpu_where_a_gpu_is_visible(visible_gpu):
    assert {name: os.environ.get(name) for name in CPU_PINS} == CPU_PINS
    assert auto_accelerator() == "cpu"
    assert local_device(TrainingArguments()) == torch.device("cpu")
    x, y = blobs(32)
    model = Model(mlp()).compile("sgd", "cross_entropy")  # accelerator="auto", the default
    model.fit(x, y, batch_size=8, verbose=0)
    assert model.fabric.device == torch.device("cpu")
    assert next(model.module.parameters()).device.type == "cpu"


def test_without_the_pin_auto_takes_the_visible_gpu(visible_gpu, monkeypatch):
    monkeypatch.delenv("FITKIT_ACCELERATOR")
    assert auto_accelerator() == "cuda"
    assert local_device(TrainingArguments()) == torch.device("cuda", 0)
    monkeypatch.setenv("FITKIT_ACCELERATOR", "cuda")
    assert auto_accelerator() == "cuda"


def test_the_pin_never_changes_an_explicit_accelerator(visible_gpu):
    assert local_device(TrainingArguments(accelerator="cuda")) == torch.device("cuda", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_a_bad_pin_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("FITKIT_ACCELERATOR", "tpu")
    with pytest.raises(ValueError, match=r"FITKIT_ACCELERATOR='tpu' is invalid: set it to 'cpu' or 'cuda'"):
        Model(mlp()).compile("sgd", "cross_entropy")
    monkeypatch.setenv("FITKIT_ACCELERATOR", "cuda")
    with pytest.raises(ValueError, match=r"FITKIT_ACCELERATOR='cuda' asks for a CUDA GPU, and none is available"):
        check_devices(TrainingArguments())
    monkeypatch.setenv("FITKIT_ACCELERATOR", "")  # empty: as unset
    assert auto_accelerator() == "cpu"


_INNER_TESTS = '''
import os, subprocess, sys
import pytest
import torch

PINNED = {"FITKIT_ACCELERATOR": "cpu", "KERAS_TORCH_DEVICE": "cpu", "ACCELERATE_USE_CPU": "true"}

def test_plain():
    assert {k: os.environ.get(k) for k in PINNED} == PINNED
    child = "import os; print(os.environ.get('FITKIT_ACCELERATOR'))"  # what a script the test starts inherits
    assert subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip() == "cpu"

@pytest.mark.cuda
def test_on_gpu():
    assert not any(k in os.environ for k in PINNED)

@pytest.mark.parametrize("accelerator", ["cuda"])
def test_a_parameter_named_cuda_is_no_marker(accelerator):
    assert os.environ.get("FITKIT_ACCELERATOR") == "cpu"

def test_plain_after():
    assert os.environ.get("FITKIT_ACCELERATOR") == "cpu"  # lifted for the cuda test only
'''


def _inner_run(tmp_path, fake_gpu: bool) -> str:
    """Run the inner tests above under a copy of tests/conftest.py, torch seeing a GPU or not."""
    with open(os.path.join(ROOT, "tests", "conftest.py")) as f:
        conftest = f.read()
    fake = f"import torch\ntorch.cuda.is_available = lambda: {fake_gpu}\n"  # either way, GPU machine or not
    (tmp_path / "conftest.py").write_text(fake + conftest)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(_INNER_TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    cuda: needs CUDA\n")
    env = {k: v for k, v in os.environ.items() if k not in CPU_PINS}  # as a fresh shell: the conftest sets them
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    return proc.stdout + proc.stderr


def test_the_conftest_pins_plain_tests_lifts_them_for_cuda_tests_and_skips_those_without_cuda(tmp_path):
    without = _inner_run(tmp_path, fake_gpu=False)
    assert "3 passed, 1 skipped" in without, without
    assert "needs a CUDA GPU (marked `cuda`)" in without, without
    with_gpu = _inner_run(tmp_path, fake_gpu=True)
    assert "4 passed" in with_gpu, with_gpu
