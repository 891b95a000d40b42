"""FSDP2 on CPU with at most two full-size buffers of one layer alive at once, on top of the
shards (its weights and its gradient, or either and a collective's buffer): the extra copies that
FSDP2's defaults, built for CUDA streams and NCCL, and gloo's collectives add there, removed.

    fully_shard(layer, mesh=mesh); fully_shard(module, mesh=mesh)
    lean_cpu_units(module)      # every FSDP unit of `module`: the collectives and prefetch below

With gloo and FSDP2's defaults, a layer's backward held up to four whole copies of it: gloo's
all-gather and reduce-scatter each allocate a second buffer of the full size for their result;
FSDP2 keeps a unit's reduce-scatter input until the next unit's reduce-scatter (so that a CUDA
stream still reading it cannot see its memory reused), and prefetches the next unit's weights
during this one's backward (an overlap that blocking gloo calls do not give). Here, per unit:

- the all-gather is one broadcast per process into its slice of the output (no second buffer);
- the reduce-scatter is an all-reduce in place, whose slice of this process is copied out; the
  input is freed as soon as it returns (the same sums; twice the traffic of a reduce-scatter);
- no other unit is prefetched in backward.
"""

from __future__ import annotations

from typing import Any

import torch


class BroadcastAllGather:
    """FSDP2's all-gather of a unit's shards (its custom-comm interface: `allocate` and the
    call) as one in-place broadcast per process, each from its own slice of `output_tensor`."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 async_op: bool = False) -> None:
        import torch.distributed as dist

        world = dist.get_world_size(group)
        chunks = output_tensor.view(world, -1)
        own = chunks[dist.get_rank(group)]
        if own.data_ptr() != input_tensor.data_ptr():  # FSDP2 copies the shard there already
            own.copy_(input_tensor.view(-1))
        for rank in range(world):
            dist.broadcast(chunks[rank], group=group, group_src=rank)


class AllReduceReduceScatter:
    """FSDP2's reduce-scatter of a unit's gradients as an all-reduce in place of `input_tensor`
    (a whole unsharded gradient), this process's slice copied into `output_tensor`, and the
    input's memory freed on return: FSDP2 reads it no more."""

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, op: Any,
                 async_op: bool = False) -> None:
        import torch.distributed as dist

        dist.all_reduce(input_tensor, op=op, group=group)
        output_tensor.copy_(input_tensor.view(dist.get_world_size(group), -1)[dist.get_rank(group)])
        input_tensor.untyped_storage().resize_(0)


def lean_cpu_units(module: torch.nn.Module) -> None:
    """Give every FSDP2 unit under `module` (itself included) the collectives above, and no
    backward prefetch. Call after `fully_shard`, on CPU only: on CUDA, FSDP2's defaults overlap
    communication with computation, which is what their memory buys."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_custom_all_gather(BroadcastAllGather())  # type: ignore[arg-type]
            unit.set_custom_reduce_scatter(AllReduceReduceScatter())  # type: ignore[arg-type]
            # An explicit list replaces the default prefetch of the previous unit; the unit itself
            # is already unsharded when its backward starts, so "prefetching" it does nothing.
            unit.set_modules_to_backward_prefetch([unit])
