"""A run on one device in full precision needs nothing from Lightning: it runs on `LocalFabric`
without importing `lightning_fabric` (nor torchmetrics), and gives the same bits as the same
run forced through Lightning's Fabric (an explicit `strategy`); their checkpoints resume each
other."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from fitkit import Model, TrainerCallback, TrainingArguments
from fitkit.engine.devices.local import LocalFabric, LocalOptimizer, local_device
from tests.helpers import blobs, mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIT = textwrap.dedent("""
    import json, sys
    import torch
    from fitkit import Model
    from tests.helpers import blobs, mlp

    net = mlp(dropout=0.1)
    x, y = blobs(64)
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, validation_split=0.25, epochs=3, batch_size=8, seed=5, verbose=0, max_grad_norm=1.0,
              output_dir=sys.argv[1], save_strategy="epoch")
    torch.save(net.state_dict(), sys.argv[2])
    # Fabric's members beyond the loop's, none of which needs Lightning (tests/test_fabric_api.py: their results)
    fabric = model.fabric
    fabric.seed_everything(3, verbose=False)
    with fabric.rank_zero_first(), fabric.autocast(), fabric.init_tensor(), fabric.init_module(empty_init=True):
        other, opt = fabric.setup(torch.nn.Linear(8, 3), torch.optim.SGD(net.parameters(), lr=0.1))
    fabric.load_raw(sys.argv[2], net)
    fabric.log_dict({"a": torch.tensor(1.0)}); fabric.log("b", 2); fabric.call("on_anything"); fabric.run()
    assert fabric.to_device({"x": torch.ones(1)})["x"].device == fabric.device and fabric.loggers == []

    def loaded():
        return sorted(m for m in ("lightning_fabric", "lightning", "torchmetrics", "transformers", "scipy")
                      if m in sys.modules)

    before = loaded()
    strategy = type(fabric.strategy).__name__  # a Lightning object: imports Lightning now
    print(json.dumps({"fabric": type(model.fabric).__name__, "loaded": before, "strategy": strategy,
                      "then": "lightning_fabric" in sys.modules}))
""")


def _fit(strategy="auto", **options):
    if strategy == "lightning":  # a strategy given explicitly: the run goes through Lightning's Fabric
        from lightning_fabric.strategies import SingleDeviceStrategy

        strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    net = mlp(dropout=0.1)
    x, y = blobs(64)
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2, strategy=strategy)
    model.fit(x, y, validation_split=0.25, epochs=3, batch_size=8, seed=5, verbose=0, max_grad_norm=1.0, **options)
    return model


def test_a_one_device_fit_imports_no_lightning_and_equals_the_fit_through_fabric(tmp_path):
    weights = tmp_path / "weights.pt"
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", FIT, str(tmp_path / "out"), str(weights)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"fabric": "LocalFabric", "loaded": [], "strategy": "SingleDeviceStrategy", "then": True}

    through_fabric = _fit(strategy="lightning", output_dir=str(tmp_path / "fabric"), save_strategy="epoch")
    assert type(through_fabric.fabric).__name__ == "Fabric"
    local = torch.load(weights, weights_only=True)
    for name, value in through_fabric.module.state_dict().items():
        assert torch.equal(local[name], value), name
    # the checkpoints hold the same tensors too
    for step in (6, 12, 18):
        ours = torch.load(tmp_path / "out" / f"checkpoint-{step}" / "state.pt", weights_only=True)
        theirs = torch.load(tmp_path / "fabric" / f"checkpoint-{step}" / "state.pt", weights_only=True)
        assert sorted(ours) == sorted(theirs)
        for name in ours["model"]:
            assert torch.equal(ours["model"][name], theirs["model"][name])
        assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]


class SigtermAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("first, then", [("auto", "lightning"), ("lightning", "auto")])
def test_checkpoints_resume_across_local_and_lightning_fabric(tmp_path, first, then):
    reference = _fit()
    with pytest.raises(SystemExit):
        _fit(first, output_dir=str(tmp_path), save_strategy="epoch", callbacks=[SigtermAt(8)])
    resumed = _fit(then, output_dir=str(tmp_path), save_strategy="epoch", resume_from_checkpoint=True)
    assert resumed.state.global_step == reference.state.global_step == 18
    for a, b in zip(resumed.module.parameters(), reference.module.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("options, device", [
    ({}, "cpu"), ({"accelerator": "cpu", "devices": 1}, "cpu"), ({"precision": "32-true"}, "cpu"),
    ({"strategy": "ddp"}, None), ({"strategy": "single_device"}, None), ({"devices": 2}, None),
    ({"precision": "bf16-mixed"}, None), ({"precision": "64-true"}, None), ({"num_nodes": 2}, None),
])
def test_which_runs_need_lightning(options, device, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args = TrainingArguments(accelerator="cpu", **{k: v for k, v in options.items() if k != "accelerator"})
    found = local_device(args)
    assert (found.type if found is not None else None) == device


def test_a_launcher_means_lightning(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert local_device(TrainingArguments(accelerator="cpu")) is None


def test_a_local_optimizers_class_is_made_once_per_optimizer_class():
    """The wrapper's class is cached by the optimizer's class: the same class for every SGD, another
    for Adam (a class per instance cost its creation and a garbage collection per search trial)."""
    net = torch.nn.Linear(2, 2)
    sgd, other_sgd = (LocalOptimizer(torch.optim.SGD(net.parameters(), lr=0.1)) for _ in range(2))
    adam = LocalOptimizer(torch.optim.Adam(net.parameters()))
    assert type(sgd) is type(other_sgd) and type(sgd).__name__ == "LocalSGD"
    assert type(adam) is not type(sgd) and type(adam).__name__ == "LocalAdam"
    assert isinstance(adam, torch.optim.Adam) and not isinstance(adam, torch.optim.SGD)
    assert isinstance(sgd, torch.optim.SGD) and not isinstance(sgd, torch.optim.Adam)


def test_local_fabric_behaves_as_fabric_on_one_process(tmp_path):
    fabric = LocalFabric(torch.device("cpu"))
    net = fabric.setup_module(torch.nn.Linear(2, 2))
    opt = fabric.setup_optimizers(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9))
    assert isinstance(opt, torch.optim.SGD) and isinstance(opt, LocalOptimizer) and opt.param_groups[0]["lr"] == 0.1
    net(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert fabric.all_reduce(3) == torch.tensor(3) and fabric.broadcast({"a": 1}) == {"a": 1}
    fabric.save(tmp_path / "s.pt", {"model": net, "optimizer": opt, "step": 4})
    other = torch.nn.Linear(2, 2)
    other_opt = LocalOptimizer(torch.optim.SGD(other.parameters(), lr=0.5, momentum=0.9))
    state = {"model": other, "optimizer": other_opt, "step": 0}
    rest = fabric.load(tmp_path / "s.pt", state, weights_only=True)
    assert rest == {} and state["step"] == 4 and other_opt.param_groups[0]["lr"] == 0.1
    assert torch.equal(other.weight, net.weight)
    with pytest.raises(KeyError, match="does not exist in the loaded checkpoint"):
        fabric.load(tmp_path / "s.pt", {"model": other, "scheduler": None})


def test_a_compiled_module_loads_a_state_dict_as_a_module_does():
    """`CompiledModule.load_state_dict` takes `Module.load_state_dict`'s arguments, `assign` by
    position too (it took `state_dict, strict` and keywords only)."""
    from fitkit.engine.devices.local import CompiledModule

    net = torch.nn.Linear(2, 2)
    saved = {k: torch.zeros_like(v) for k, v in net.state_dict().items()}
    CompiledModule(net, net).load_state_dict(saved, True, True)  # strict, assign
    assert net.weight.data_ptr() == saved["weight"].data_ptr()  # assigned, not copied


def test_dataloader_workers_are_seeded_as_fabric_seeds_them():
    """`setup_dataloaders` after `seed_everything(workers=True)` gives a loader the `worker_init_fn`
    Fabric gives it: each worker's torch, Python and NumPy generators seeded as Lightning's
    `pl_worker_init_function` seeds them (any base seed, worker id and rank)."""
    import random

    import numpy as np

    seed = pytest.importorskip("lightning_fabric.utilities.seed")
    from fitkit.engine.devices.worker_seeds import seed_sequence, seed_worker

    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        for base in (0, 12345, 2**62 + 17, 2**63 - 5):
            for worker_id, rank in ((0, 0), (1, 0), (3, 1), (2, 7)):
                assert seed_sequence(base, worker_id, rank, 4) == seed._generate_seed_sequence(base, worker_id, rank, 4)
                drawn = []
                for init in (seed.pl_worker_init_function, seed_worker):
                    torch.manual_seed(base + worker_id)  # a worker's torch seed: the base seed plus its id
                    init(worker_id, rank=rank)
                    drawn.append((torch.rand(2).tolist(), random.random(), np.random.rand()))
                assert drawn[0] == drawn[1], (base, worker_id, rank)
    finally:  # the generators as the test found them
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])
