"""HF's `save_on_each_node`: checkpoints written by the local rank 0 of every node (the Trainer's
`args.should_save`), not only by the global rank 0. Two nodes are simulated on loopback, each with
its own `output_dir` (as nodes without a shared disk)."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import reserved_port

from fitkit import TrainingArguments
from fitkit.engine.checkpoint import verified
from fitkit.engine.checkpoint.node_writers import writes_checkpoints

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "save_each_node.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("on", [True, False])
def test_the_writers_are_each_nodes_local_zero_or_the_global_zero(on):
    """Two nodes of two processes: (node, local rank) -> global rank node * 2 + local rank."""
    args = TrainingArguments(save_on_each_node=on)
    writers = [(node, local) for node in (0, 1) for local in (0, 1)
               if writes_checkpoints(SimpleNamespace(local_rank=local, is_global_zero=node * 2 + local == 0), args)]
    assert writers == ([(0, 0), (1, 0)] if on else [(0, 0)])


def test_save_on_each_node_with_save_async_is_refused_naming_both():
    with pytest.raises(ValueError, match="save_on_each_node.*save_async=False"):
        TrainingArguments(save_on_each_node=True, save_async=True)


def _two_nodes(tmp_path, mode):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    with reserved_port() as port:
        procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                                   f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", SCRIPT,
                                   mode, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for node in (0, 1)]
        outputs = [proc.communicate(timeout=240) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, out[-3000:] + err[-3000:]


def _checkpoints(directory):
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


@pytest.mark.slow
def test_every_node_writes_its_checkpoints_with_save_on_each_node(tmp_path):
    _two_nodes(tmp_path / "on", "on")
    nodes = [tmp_path / "on" / f"node-{n}" for n in (0, 1)]
    kept = ["checkpoint-2", "checkpoint-4"]  # 16 samples a node by 4: 4 steps, saved every 2, 2 kept
    assert [c for c in _checkpoints(nodes[0]) if c.startswith("checkpoint")] == kept
    assert [c for c in _checkpoints(nodes[1]) if c.startswith("checkpoint")] == kept
    for name in kept:
        first, second = (torch.load(os.path.join(verified(str(n / name)), "state.pt"), weights_only=False)
                         for n in nodes)
        for key, value in first["model"].items():
            assert torch.equal(value, second["model"][key]), (name, key)


@pytest.mark.slow
def test_only_the_global_zero_writes_without_it(tmp_path):
    _two_nodes(tmp_path / "off", "off")
    assert [c for c in _checkpoints(tmp_path / "off" / "node-0") if c.startswith("checkpoint")] == \
        ["checkpoint-2", "checkpoint-4"]
    assert not [c for c in _checkpoints(tmp_path / "off" / "node-1") if c.startswith("checkpoint")]
