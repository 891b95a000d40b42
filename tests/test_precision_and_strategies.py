"""Precision and strategy choices on one process (the multi-process ones are in test_distributed)."""

import pytest
import torch
from helpers import mlp

from fitkit import Model


def _blobs():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 8, generator=g) * 3
    y = torch.arange(180) % 3
    return centers[y] + torch.randn(180, 8, generator=g), y


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true", "16-true", "64-true"])
def test_every_cpu_precision_trains(precision):
    x, y = _blobs()
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=1e-2, precision=precision)
    history = model.fit(x, y, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert history.history["accuracy"][-1] > 0.8
    expected = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
    assert next(model.module.parameters()).dtype == expected.get(precision, torch.float32)
    assert model.predict(x).shape == (180, 3)


def test_16_mixed_on_cpu_becomes_bf16_mixed_with_a_warning():
    x, y = _blobs()
    model = Model(mlp()).compile("adam", "cross_entropy", precision="16-mixed")
    with pytest.warns(UserWarning, match="using 'bf16-mixed' instead"):
        model.fit(x, y, verbose=0)
    assert "bf16" in type(model.fabric._precision).__name__.lower() or model.fabric._precision.precision == "bf16-mixed"


@pytest.mark.parametrize("strategy", ["deepspeed", "deepspeed_stage_2", "deepspeed_stage_3_offload", {"train_batch_size": 8}])
def test_deepspeed_on_cpu_says_it_needs_cuda_and_what_to_use(strategy):
    x, y = _blobs()
    model = Model(mlp()).compile("adam", "cross_entropy", strategy=strategy, accelerator="cpu")
    with pytest.raises(ValueError, match=r"DeepSpeed runs only on CUDA GPUs.*strategy='ddp'.*strategy='fsdp'"):
        model.fit(x, y, verbose=0)


@pytest.mark.cuda
def test_deepspeed_trains_on_gpu():  # pragma: no cover - runs where CUDA is present
    pytest.importorskip("deepspeed")
    x, y = _blobs()
    model = Model(mlp()).compile("adam", "cross_entropy", strategy="deepspeed_stage_2", accelerator="cuda",
                                 devices=1, precision="bf16-mixed")
    history = model.fit(x, y, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_a_ready_fabric_strategy_instance_passes_through():
    from lightning_fabric.strategies import SingleDeviceStrategy

    x, y = _blobs()
    strategy = SingleDeviceStrategy(device="cpu")
    model = Model(mlp()).compile("adam", "cross_entropy", strategy=strategy)
    model.fit(x, y, verbose=0)
    assert model.fabric.strategy is strategy


def test_missing_deepspeed_config_file_is_named():
    with pytest.raises(ValueError, match="looks like a DeepSpeed config file, but it does not exist"):
        Model(mlp()).compile("adam", "cross_entropy", strategy="ds_config.json")
