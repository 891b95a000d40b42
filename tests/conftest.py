import os
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
def _quiet_fabric():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        yield
