"""FSDP2 on CPU with fitkit's lean units (`fitkit.engine.devices.fsdp_cpu`), for
tests/test_fsdp_cpu.py: two gloo processes; each writes RESULTS/rank-N.json with what it saw.

usage: fsdp_cpu_comms.py RESULTS     (MASTER_PORT in the environment)

- the broadcast all-gather and the all-reduce reduce-scatter against torch's own collectives,
  and whether the reduce-scatter's input was freed;
- one step of a 4-layer MLP (one FSDP unit per layer) with FSDP2's backward prefetch and with
  lean units, from the same weights and batch: the gradient shards, and the most all-gathers
  issued in backward ahead of the layers whose backward had started, when a layer's ended.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fitkit.engine.devices.fsdp_cpu import AllReduceReduceScatter, BroadcastAllGather, lean_cpu_units

WIDTH, LAYERS = 8, 4


def collectives(rank: int, world: int) -> dict:
    g = torch.Generator().manual_seed(rank)
    shard = torch.randn(6, generator=g)
    ours, theirs = torch.empty(6 * world), torch.empty(6 * world)
    ours.view(world, -1)[rank].copy_(shard)  # where FSDP2 puts the shard before the call
    BroadcastAllGather()(ours, ours.view(world, -1)[rank], dist.group.WORLD)
    dist.all_gather_into_tensor(theirs, shard)
    grads = torch.randn(6 * world, generator=g)
    reduced, expected = torch.empty(6), torch.empty(6)
    dist.reduce_scatter_tensor(expected, grads.clone(), op=dist.ReduceOp.SUM)
    comm = AllReduceReduceScatter()
    given = comm.allocate((6 * world,), dtype=torch.float32, device=torch.device("cpu"))
    given.copy_(grads)
    comm(reduced, given, dist.group.WORLD, dist.ReduceOp.SUM)
    return {"all_gather_equal": torch.equal(ours, theirs), "reduce_scatter_equal": torch.equal(reduced, expected),
            "input_bytes_after": given.untyped_storage().nbytes()}


class Counted(BroadcastAllGather):
    calls = 0

    def __call__(self, *args, **kwargs):
        Counted.calls += 1
        return super().__call__(*args, **kwargs)


def one_step(rank: int, world: int, lean: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    mesh = init_device_mesh("cpu", (world,))
    for layer in net:
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    if lean:
        lean_cpu_units(net)
    for unit in net.modules():  # counted, with FSDP2's prefetch unless lean
        unit.set_custom_all_gather(Counted())
    ended, most = [0], [0]

    def ahead(module, grad_input, grad_output):
        ended[0] += 1
        most[0] = max(most[0], Counted.calls - ended[0])  # all-gathers for layers not yet started

    for layer in net:
        layer.register_full_backward_hook(ahead)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * world, WIDTH, generator=g)[4 * rank:4 * rank + 4]
    loss = net(x).square().mean()
    Counted.calls = 0
    loss.backward()
    grads = {n: p.grad.to_local().flatten().tolist() for n, p in net.named_parameters()}
    return {"most_gathered_ahead": most[0], "grads": grads}


def run(rank: int, world: int, results: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    out = collectives(rank, world)
    out["default"] = one_step(rank, world, lean=False)
    out["lean"] = one_step(rank, world, lean=True)
    with open(os.path.join(results, f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(2, sys.argv[1]), nprocs=2)
