"""Pretrained weights loaded once under FSDP: `model_init` runs in rank 0 alone, the others get
their shards from it.

With `fsdp_load_once=True` (Hugging Face's `fsdp_config={"cpu_ram_efficient_loading": True}`),
`model_init`, which may read pretrained weights (`from_pretrained`, `load_state_dict`), runs in
global rank 0 only. The other processes never run it: they receive its module pickled with every parameter and buffer replaced by a meta
tensor of the same shape and dtype; once FSDP2 has sharded the module, each tensor is broadcast
from rank 0, one at a time, and every process keeps only its shard of it::

    module = build_on_rank0(model_init, fabric)   # rank 0: model_init's module; others: it on meta
    fully_shard(module, mesh=mesh)                # (the strategy) shards the real and the meta ones
    scatter_from_rank0(module, device)            # rank 0's values; each process keeps its shard

Memory: rank 0 holds the whole module, as `model_init` built it, until each tensor is sent; the
others hold the largest single tensor while it is received. Tensors that are plain attributes of
a module (neither parameters nor buffers) travel whole, with the structure.
"""

from __future__ import annotations

import io
import pickle
import weakref
from collections.abc import Callable
from typing import Any

import torch

#: rank 0: the module's whole tensors by name, to send; other ranks: None (to receive).
_SOURCES: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.Tensor] | None] = weakref.WeakKeyDictionary()


def _named_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter (tied ones once) and buffer, by name: the same names before and after FSDP."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _meta_tensor(shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool, parameter: bool) -> torch.Tensor:
    tensor = torch.empty(shape, dtype=dtype, device="meta")
    return torch.nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor


class _MetaPickler(pickle.Pickler):
    """Pickles a module with its parameters and buffers as meta tensors (a tied one stays tied:
    pickle's memo keeps one object per id)."""

    def __init__(self, file: io.BytesIO, tensors: set[int]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and id(obj) in self.tensors:
            return _meta_tensor, (tuple(obj.shape), obj.dtype, obj.requires_grad, isinstance(obj, torch.nn.Parameter))
        return NotImplemented


def structure_of(module: torch.nn.Module) -> bytes:
    """`module` pickled with its parameters and buffers as meta tensors: its structure, no values.

        data = structure_of(torch.nn.Linear(4096, 4096))   # a few hundred bytes
    """
    out = io.BytesIO()
    try:
        _MetaPickler(out, {id(t) for t in _named_tensors(module).values()}).dump(module)
    except Exception as error:
        raise TypeError(f"fsdp_load_once=True sends the structure of model_init's {type(module).__name__} to the "
                        f"other processes by pickling it, and it does not pickle ({type(error).__name__}: {error}): "
                        "make the module picklable (no lambdas or open files in it), or pass fsdp_load_once=False"
                        ) from error
    return out.getvalue()


def keep_sources(module: torch.nn.Module) -> torch.nn.Module:
    """In rank 0: mark `module` (built whole by `model_init`) as the source of every process's
    values; its tensors are sent after sharding (`scatter_from_rank0`)."""
    _SOURCES[module] = _named_tensors(module)
    return module


def from_structure(data: bytes) -> torch.nn.Module:
    """In another rank: the module `structure_of` pickled, on the meta device, marked to receive."""
    module = pickle.loads(data)  # bytes that rank 0 of this same job pickled
    _SOURCES[module] = None
    return module


def build_on_rank0(build: Callable[[], Any], fabric: Any) -> Any:
    """`build()` (a `model_init`) in global rank 0; in the others its module on the meta device,
    received from rank 0 (whose failure is raised in every process). What `build` returned when
    it is not a module (the caller reports it)."""
    if fabric.global_rank == 0:
        try:
            module = build()
            data = structure_of(module) if isinstance(module, torch.nn.Module) else None
        except BaseException as error:
            fabric.broadcast(("failed", f"{type(error).__name__}: {error}"), src=0)
            raise
        fabric.broadcast(("module", data) if data is not None else ("failed", "model_init returned no nn.Module"),
                         src=0)
        return keep_sources(module) if data is not None else module
    kind, payload = fabric.broadcast(None, src=0)
    if kind == "failed":
        raise RuntimeError(f"model_init failed in process 0, where fsdp_load_once=True runs it: {payload}")
    return from_structure(payload)


def scatter_from_rank0(module: torch.nn.Module, device: torch.device) -> bool:
    """After FSDP has sharded a module marked by `keep_sources`/`from_structure`: every tensor
    broadcast from rank 0, one at a time, each process keeping its shard (a collective: every
    process calls it). False (nothing done) for a module not so marked."""
    if module not in _SOURCES:
        return False
    sources = _SOURCES.pop(module)
    if sources is None:
        module.to_empty(device=device)
    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    with torch.no_grad():
        for name, target in _named_tensors(module).items():
            full = None if sources is None else sources.pop(name)
            if initialized:
                _receive(target, _broadcast(full, target, device))
    return True


def _broadcast(full: torch.Tensor | None, like: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Rank 0's `full` in every process, sent as bytes (so any dtype goes over gloo too)."""
    if full is None:
        size = like.numel() * like.element_size()
        flat = torch.empty(size, dtype=torch.uint8, device=device)
    else:
        flat = full.detach().reshape(-1).to(device).view(torch.uint8)
    if flat.numel():
        torch.distributed.broadcast(flat, src=0)
    return flat.view(like.dtype).reshape(like.shape)


def _receive(target: torch.Tensor, full: torch.Tensor) -> None:
    """This process's part of `full` into `target` (a DTensor's shard, or a whole buffer)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):
        shard = distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None)
        target.to_local().copy_(shard.to_local())
    else:
        target.copy_(full)
