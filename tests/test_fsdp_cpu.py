"""FSDP2 on CPU without the whole-layer copies FSDP2's defaults add there (fitkit.engine.devices.
fsdp_cpu): the collectives give torch's results, the reduce-scatter frees its input, and in
backward no unit's weights are gathered before its own backward starts (FSDP2 prefetches the
next one); the gradients are those of a prefetching run. Two gloo processes of
tests/scripts/fsdp_cpu_comms.py. And glibc's side (host_allocator): the set-up's freed memory
goes back to the kernel (`release_freed_memory`), and a step's freed layer-size blocks at once
(`map_large_blocks`)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import reserved_port

from fitkit.engine.devices.host_allocator import release_freed_memory

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_cpu_comms.py")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    results = tmp_path_factory.mktemp("fsdp_cpu")
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, SCRIPT, str(results)], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, MASTER_PORT=str(port)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((results / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_the_collectives_give_torchs_results_and_free_the_reduce_input(ranks):
    for rank in ranks:
        assert rank["all_gather_equal"] and rank["reduce_scatter_equal"]
        assert rank["input_bytes_after"] == 0


@pytest.mark.slow
def test_backward_gathers_no_unit_ahead_and_gives_the_prefetching_runs_gradients(ranks):
    for rank in ranks:
        assert rank["default"]["most_gathered_ahead"] == 1  # FSDP2's prefetch of the next unit
        assert rank["lean"]["most_gathered_ahead"] == 0
        for name, grad in rank["default"]["grads"].items():
            torch.testing.assert_close(torch.tensor(rank["lean"]["grads"][name]), torch.tensor(grad)), name


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_freed_memory_returns_the_free_blocks_between_live_ones():
    blocks = [torch.ones(16 * 1024) for _ in range(3000)]  # 64 KiB each: heap blocks, not mappings
    kept = blocks[::16]  # one live block in 16: the free ones lie between them, not at the heap's top
    del blocks
    before = _resident_mib()
    assert release_freed_memory()
    assert before - _resident_mib() > 100  # of the ~176 MiB freed
    assert all(bool((k == 1).all()) for k in kept)


_FRAGMENT = """
import os, sys, torch
from fitkit.engine.devices.host_allocator import map_large_blocks
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
if sys.argv[1] == "map":
    assert map_large_blocks()
torch.ones(512 * 1024).sum()  # one 2 MiB block freed: glibc's own threshold rises to it
blocks = [torch.ones(512 * 1024) for _ in range(200)]  # 2 MiB each, as a step's layers
kept = blocks[::4]  # longer-lived blocks among them, as a step's gradient shards
del blocks
print(resident())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_map_large_blocks_returns_a_steps_freed_layers_at_once():
    def resident_after_freeing(mode):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        proc = subprocess.run([sys.executable, "-c", _FRAGMENT, mode], capture_output=True, text=True, timeout=120,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        return float(proc.stdout.split()[-1])

    assert resident_after_freeing("heap") - resident_after_freeing("map") > 200  # of the 300 MiB freed
