import os
import warnings

import pytest
import torch

os.environ.setdefault("PYTHONHASHSEED", "0")
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
