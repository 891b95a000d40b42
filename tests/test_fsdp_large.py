"""Large models under FSDP: `model_init` builds on the meta device and each process initializes
only its shard, layer by layer, to the values an eager build from the same seed has; a sharded
checkpoint resumes without gathering. Two-process runs on CPU (gloo) of tests/scripts/fsdp_init.py."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import reserved_port

from fitkit.engine.devices.deferred_init import build_on_meta, is_deferred, materialize_shards

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_init.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import fsdp_init as script  # noqa: E402


def _launch(tmp, name, *extra):
    results = tmp / name
    results.mkdir()
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, SCRIPT, "--results", str(results), *extra], capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, MASTER_PORT=str(port)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [json.loads((results / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    return runs, proc.stderr


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """A 2-step run writing a sharded checkpoint each step, and a run resumed from its first."""
    tmp = tmp_path_factory.mktemp("fsdp_init")
    out = tmp / "out"
    runs, _ = _launch(tmp, "runs", "--output", str(out))
    return runs, out


def _as_tensors(weights, like):
    return {n: torch.tensor(w).reshape(like[n].shape) for n, w in weights.items()}


@pytest.mark.slow
def test_model_init_runs_on_meta_and_each_process_inits_only_its_shard(launched):
    first, _ = launched
    eager = dict(script.net().named_parameters())
    for run in first:
        assert run["built_on"] == ["meta"]  # model_init made no real tensor
        assert run["most_alive"] == 1  # one layer's full weight at a time (a whole build: 3)
        assert run["local"]["0.weight"] == [8, 8] and run["local"]["5.weight"] == [1, 16]  # halves
        for name, value in _as_tensors(run["initial"], eager).items():
            assert torch.equal(value, eager[name].detach()), name  # bit for bit the eager build's


@pytest.mark.slow
def test_first_step_equals_one_process_step_from_the_same_seed(launched):
    first, _ = launched
    net = script.net()
    x, y = script.data()
    loss = torch.nn.functional.cross_entropy(net(x[:16]), y[:16])  # ranks' first batches: samples 0..15
    loss.backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= 0.1 * p.grad
    reference = dict(net.named_parameters())
    for name, value in _as_tensors(first[0]["first_step"], reference).items():
        torch.testing.assert_close(value, reference[name].detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_without_gathering(launched):
    runs, out = launched
    assert os.path.isdir(out / "checkpoint-1" / "state.pt")  # DCP shards, not one file
    for run in runs:
        assert run["resumed_step"] == 2 and run["load_gathers"] == 0
        assert run["resumed_on"] == ["meta"]
        assert run["resumed_weights"] == run["weights"]


def test_eager_build_shows_every_layer_alive_at_once():
    script.Watched.alive, script.Watched.most = [], 0
    script.net()
    assert script.Watched.most == 3  # what the launched runs' most_alive == 1 rules out


def test_replay_equals_the_eager_build_for_torch_layers():
    def build():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Embedding(5, 4, padding_idx=0),
                                   torch.nn.MultiheadAttention(16, 2), torch.nn.BatchNorm1d(4), torch.nn.Conv1d(2, 3, 3))

    eager = build()
    after_eager = torch.rand(3)
    module = build_on_meta(build)
    assert module is not None and is_deferred(module) and all(p.is_meta for p in module.parameters())
    assert torch.equal(torch.rand(3), after_eager)  # the generator advanced as the eager build's
    assert materialize_shards(module, torch.device("cpu")) and not is_deferred(module)
    for (name, value), other in zip(eager.state_dict().items(), module.state_dict().values()):
        assert torch.equal(value, other), name


class _ZerosInInit(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(3))


def _written_after_build():
    layer = torch.nn.Linear(2, 2)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    return layer


@pytest.mark.parametrize("build, named", [(_ZerosInInit, "_ZerosInInit.bias is set by no reset_parameters"),
                                          (_written_after_build, "`fill_` wrote into a tensor outside")])
def test_a_build_that_cannot_be_replayed_is_built_whole_with_a_warning(build, named):
    before = torch.random.get_rng_state()
    with pytest.warns(UserWarning, match=named):
        assert build_on_meta(build) is None
    assert torch.equal(torch.random.get_rng_state(), before)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not any(p.is_meta for p in build().parameters())  # the patched classes are restored
