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
