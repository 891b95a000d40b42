import functools
import importlib.util
import os
import sys
import tempfile
import warnings

import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")
# comet_ml, once imported, hooks other libraries (mlflow runs become Comet experiments) and
# writes offline archives into the working directory: keep it quiet and out of the checkout.
os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
os.environ.setdefault("COMET_OFFLINE_DIRECTORY", tempfile.mkdtemp(prefix="fitkit-comet-"))
torch.set_num_threads(1)

# The suite checks CPU behaviour unless a test is marked `cuda`: on a machine with a GPU,
# `accelerator="auto"` (fitkit's default) still resolves to the CPU (FITKIT_ACCELERATOR, read by
# fitkit.config.devices.auto_accelerator), and so do the peers the tests compare with: Keras on
# torch (read at its import) and the HF Trainer (Accelerate; see `_hf_trainer_pin`). Set here, before any test or
# module-scoped fixture builds a model, and inherited by the scripts the tests start
# (tests/scripts/). A test marked `cuda` runs with the variables lifted, and only where CUDA is.
CPU_PINS = {"FITKIT_ACCELERATOR": "cpu", "KERAS_TORCH_DEVICE": "cpu", "ACCELERATE_USE_CPU": "true"}
for _name, _value in CPU_PINS.items():
    os.environ[_name] = _value


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` are skipped where torch sees no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked `cuda`); torch.cuda.is_available() is False here")
    for item in items:
        if item.get_closest_marker("cuda") is not None:  # the marker, not a parameter named "cuda"
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _hf_trainer_pin():
    """transformers' `TrainingArguments` puts a one-process Trainer on cuda:0 whenever CUDA is
    visible unless `use_cpu=True` (that path does not read ACCELERATE_USE_CPU): on a machine with a
    GPU, its device resolves to the CPU while ACCELERATE_USE_CPU is set (a `cuda` test lifts it).
    Session-wide, so module-scoped fixtures' Trainers are pinned too; nothing to do without CUDA."""
    if not torch.cuda.is_available() or importlib.util.find_spec("transformers") is None:
        yield
        return
    from transformers import TrainingArguments

    original = TrainingArguments.__dict__.get("_setup_devices")
    if not isinstance(original, functools.cached_property):
        yield
        return

    def setup_devices(self):
        if os.environ.get("ACCELERATE_USE_CPU") != CPU_PINS["ACCELERATE_USE_CPU"] or self.use_cpu:
            return original.func(self)
        self.use_cpu = True  # the Trainer's own CPU path, touching no GPU; the field reads as given after
        try:
            return original.func(self)
        finally:
            self.use_cpu = False

    pinned = functools.cached_property(setup_devices)
    pinned.__set_name__(TrainingArguments, "_setup_devices")
    TrainingArguments._setup_devices = pinned
    yield
    TrainingArguments._setup_devices = original


@pytest.fixture(autouse=True)
def _device_pins(request, monkeypatch):
    """A test marked `cuda` lets `accelerator="auto"` and the peers take the GPU (the pins lifted
    for its duration); every other test runs with the CPU pins of `CPU_PINS`."""
    if request.node.get_closest_marker("cuda") is not None:
        for name in CPU_PINS:
            monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def blobs():
    """A separable 3-class problem: 240 samples, 8 features."""
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 8, generator=g) * 3
    y = torch.arange(240) % 3
    x = centers[y] + torch.randn(240, 8, generator=g)
    return x, y


@pytest.fixture(autouse=True)
def _fresh_wandb():
    """wandb reads its settings (`WANDB_DIR`, ...) once per process, at its first run: a test that
    sets them must not find the settings of another test's run (tests share worker processes)."""
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()


@pytest.fixture(autouse=True)
def _quiet_fabric():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        yield


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the whole session (loopback, a free port), stopped at the
    end; skipped when no server binaries are installed. Each test asks it for its own database."""
    pytest.importorskip("psycopg2", reason="psycopg2 (psycopg2-binary) is needed to talk to PostgreSQL")
    from postgres import PostgresServer, find_binaries

    if find_binaries() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl, postgres) in /usr/lib/postgresql/*/bin or on "
                    "PATH (apt-get install postgresql, or set FITKIT_PG_BIN)")
    server = PostgresServer.start()
    yield server
    server.shutdown()


@pytest.fixture
def postgres_url(postgres_server):
    """The URL of a fresh, empty database on the session's PostgreSQL server."""
    return postgres_server.new_database()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server on loopback (moto's server mode, `tests/s3_server.py`), shared by the session."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from s3_server import S3Server

    server = S3Server.start()
    yield server
    server.stop()
