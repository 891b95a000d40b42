"""Loading a checkpoint whatever number of processes wrote it (elastic resume).

A checkpoint's `state.pt` is either one file (`torch.save`: one process, DDP, or FSDP with
`fsdp_full_checkpoint=True`) or a directory of shards (`torch.distributed.checkpoint`, "DCP":
FSDP's default). Either loads into a module set up for any number of processes:

| written as | loaded into one process or DDP | loaded into FSDP (full or hybrid), any size |
| --- | --- | --- |
| one file | `fabric.load` (as written) | full tensors, each process keeps its shard |
| DCP shards | full tensors read from every shard | DCP reshards to this mesh |

The optimizer state goes through `torch.distributed.checkpoint.state_dict`, which keys it by
parameter name, so it is resharded with the weights. Reading never runs pickled code: tensors
and the loop's record load with `weights_only=True`, and DCP's `.metadata` (a pickle) is read by
an unpickler that builds only DCP's own metadata classes. Of a local copy of a checkpoint in a
store, which holds no shard files yet, each process downloads only what its load plan reads
(`shards.fetch_missing`).

    rest = load_state(fabric, "out/checkpoint-8/state.pt", module=wrapped, optimizer=opt, strict=True)
    rest["loop"], rest["rng"], rest["scheduler"]                  # what is not weights
    saved_layout("out/checkpoint-8/state.pt")["model"]["0.weight"].shape  # without reading the tensors
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import warnings
from typing import Any, cast

import torch

from fitkit.common.wrappers import torch_optimizer
from fitkit.engine.checkpoint.layout import CheckpointError

#: Fabric writes the non-tensor part of a DCP checkpoint (scheduler, RNG, loop) to this file.
DCP_EXTRA = "meta.pt"


def load_state(fabric: Any, path: str, *, module: torch.nn.Module, optimizer: Any, strict: bool) -> dict[str, Any]:
    """Restore `module` (and `optimizer`, unless None) in place from the `state.pt` at `path`;
    return the rest of the saved payload. `module` and `optimizer` are Fabric's wrappers."""
    net, opt = _inner_module(module), torch_optimizer(optimizer)
    if os.path.isdir(path):
        return _load_shards(path, net, opt, strict)
    if _is_sharded(net):
        return _load_full_into_shards(path, net, opt, strict)
    targets = {"model": module} if optimizer is None else {"model": module, "optimizer": optimizer}
    return fabric.load(path, targets, strict=strict, weights_only=True)


def saved_layout(path: str) -> dict[str, Any] | None:
    """The parameter names and shapes a `state.pt` holds, read without the tensors' data:
    `{"model": {name: tensor with that shape}, "optimizer": state dict or None}`; None when
    `path` is neither a file nor a DCP directory."""
    if os.path.isfile(path):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not os.path.isfile(os.path.join(path, ".metadata")):
        return None
    entries = safe_reader(path).read_metadata().state_dict_metadata
    model = {name[len("model."):]: torch.empty(tuple(meta.size), device="meta")
             for name, meta in entries.items() if name.startswith("model.") and hasattr(meta, "size")}
    return {"model": model, "optimizer": None}


# -- an asynchronous save's payload --------------------------------------------------------------
def full_payload(fabric: Any, module: torch.nn.Module, optimizer: Any, scheduler: Any,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """What one file of a checkpoint holds, as one process saves it (`model` and `optimizer`
    state dicts, the optimizer keyed by parameter index; `scheduler`; `extra`), for the
    global-zero process to write (the other processes get `{}`). A sharded (FSDP) module's full
    tensors are gathered on the global-zero process, in host memory: a collective, so every
    process calls it. The tensors may be the live ones: copy them before the next step."""
    net, opt = _inner_module(module), torch_optimizer(optimizer)
    if _is_sharded(net):
        model, optim = _gathered(net, opt)
    else:
        model = net.state_dict() if fabric.is_global_zero else {}
        optim = opt.state_dict() if opt is not None and fabric.is_global_zero else None
    if not fabric.is_global_zero:
        return {}
    payload: dict[str, Any] = {"model": model}
    if opt is not None:
        payload["optimizer"] = optim
    if scheduler is not None:
        payload["scheduler"] = scheduler.state_dict()
    payload.update(extra)
    return payload


def _gathered(net: torch.nn.Module, opt: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model = get_model_state_dict(net, options=options)
    if opt is None:
        return model, None
    if not opt.state:  # DCP's reading of an empty state would make one (a zero step): the settings then,
        return model, opt.state_dict()  # keyed by index as one process saves them (packing reads no tensor)
    return model, by_index(get_optimizer_state_dict(net, opt, options=options), net, opt)


def by_index(saved: dict[str, Any], net: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The inverse of `by_name`: an optimizer state dict keyed by parameter name (as FSDP gives
    it) keyed by the optimizer's parameter index, as one process saves it."""
    groups = saved.get("param_groups") or []
    if not groups or all(isinstance(p, int) for g in groups for p in g.get("params", ())):
        return saved
    names = {id(p): name for name, p in net.named_parameters()}
    index = {names[id(p)]: i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    return {"state": {index[name]: value for name, value in saved.get("state", {}).items()},
            "param_groups": [{**g, "params": [index[name] for name in g["params"]]} for g in groups]}


# -- the three loading paths --------------------------------------------------------------------
def _load_shards(path: str, net: torch.nn.Module, opt: Any, strict: bool) -> dict[str, Any]:
    """A DCP directory into any module: DCP reads the pieces each process's tensors need."""
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state: dict[str, Any] = {"model": get_model_state_dict(net)}
    if opt is not None:
        if not opt.state:  # torch builds the empty state to fill only when no gradient is left
            for p in (p for group in opt.param_groups for p in group["params"]):
                p.grad = None
        state["optimizer"] = get_optimizer_state_dict(net, opt)
    with warnings.catch_warnings():  # one process without a process group: what we mean
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        try:
            load(state, storage_reader=safe_reader(path), planner=safe_planner())
        except CheckpointException as err:  # a shard that failed its digest on some process: that error
            found = [f[0] for f in err.failures.values() if isinstance(f[0], CheckpointError)]
            if found:
                raise found[0] from None
            raise
    set_model_state_dict(net, state["model"], options=StateDictOptions(strict=strict))
    if opt is not None:
        set_optimizer_state_dict(net, opt, state["optimizer"], options=StateDictOptions(strict=strict))
    return torch.load(os.path.join(path, DCP_EXTRA), map_location="cpu", weights_only=True)


def _load_full_into_shards(path: str, net: torch.nn.Module, opt: Any, strict: bool) -> dict[str, Any]:
    """One full file into a sharded (FSDP2) module: every process reads it memory-mapped and
    keeps its own shard of each tensor."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    options = StateDictOptions(full_state_dict=True, strict=strict)
    set_model_state_dict(net, payload.pop("model"), options=options)
    saved_optimizer = payload.pop("optimizer", None)
    if opt is not None:
        if saved_optimizer is None:
            raise KeyError("the checkpoint holds no optimizer state")
        if saved_optimizer.get("state"):
            set_optimizer_state_dict(net, opt, by_name(saved_optimizer, net, opt), options=options)
        else:  # no state yet (SGD without momentum): DCP cannot place an empty state; the settings are all
            load_settings(opt, saved_optimizer)
    return payload


def load_settings(opt: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Put a saved optimizer's settings (learning rate, momentum, ...: each group's values but its
    parameters) back into `opt`, whose state stays empty."""
    groups = saved.get("param_groups") or []
    if len(groups) != len(opt.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {len(groups)} parameter groups and this one "
                         f"{len(opt.param_groups)}")
    for group, settings in zip(opt.param_groups, groups):
        group.update({k: v for k, v in settings.items() if k != "params"})


def by_name(saved: dict[str, Any], net: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter index (`optimizer.state_dict()`, as one
    process or DDP saves it) keyed by parameter name instead, as FSDP loads it. The indices
    follow the optimizer's parameter order, which is this module's."""
    groups = saved.get("param_groups") or []
    if not groups or all(isinstance(p, str) for g in groups for p in g.get("params", ())):
        return saved  # already by name (FSDP's full checkpoints)
    names = {id(p): name for name, p in net.named_parameters()}
    current = [p for g in opt.param_groups for p in g["params"]]
    indices = [i for g in groups for i in g["params"]]
    if len(indices) != len(current):
        raise ValueError(f"the checkpoint's optimizer has {len(indices)} parameters and this one {len(current)}")
    name_of = {i: names[id(p)] for i, p in zip(indices, current)}
    state = {name_of[i]: value for i, value in saved.get("state", {}).items()}
    param_groups = [{**g, "params": [name_of[i] for i in g["params"]]} for g in groups]
    return {"state": state, "param_groups": param_groups}


def _inner_module(module: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside Fabric's wrapper (its public `module` property); under DDP the
    module itself, not the DDP wrapper; under FSDP2 the module, sharded in place."""
    if isinstance(getattr(type(module), "module", None), property):
        return cast(torch.nn.Module, module.module)  # the wrapper's property (nn.Module's __getattr__ types it loosely)
    return module


def _is_sharded(net: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in net.parameters())


# -- reading DCP without running pickled code -----------------------------------------------------
#: What DCP's `.metadata` pickle may build: its own metadata records, tensor sizes, dtypes and
#: layouts, the path it was written to. Anything else is refused before it is built.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "TensorProperties", "ChunkStorageMetadata", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"Unsupported global {module}.{name} in a checkpoint's .metadata: it is not DCP metadata, and pickled "
            "code is never run (weights_only loading)")


@functools.cache
def _safe_classes() -> tuple[type, type]:
    """DCP's file reader and load planner, made safe (built on first use: DCP imports slowly)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        """`.metadata` read by the restricted unpickler."""

        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            name = ".metadata" if rank is None else f"__{rank}.metadata"
            with open(os.path.join(self.path, name), "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            # A local copy of a checkpoint in a store holds no shards yet: this process downloads
            # (and verifies) the ones its plan reads, and no other.
            from fitkit.engine.checkpoint.shards import fetch_missing

            directory = os.fspath(self.path)
            base = os.path.basename(directory)
            wanted: dict[str, list[tuple[int, int]]] = {}
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                wanted.setdefault(f"{base}/{info.relative_path}", []).append((info.offset, info.length))
            moved = fetch_missing(os.path.dirname(directory), wanted)
            if not moved:
                return super().read_data(plan, planner)
            files = self.fs
            here = os.path.dirname(directory)
            # DCP's file system, with some files read from elsewhere
            self.fs = _Redirected(files, {os.path.join(here, *k.split("/")): v  # type: ignore[assignment]
                                          for k, v in moved.items()})
            try:
                return super().read_data(plan, planner)
            finally:
                self.fs = files
                for own in moved.values():
                    os.remove(own)

    class Planner(DefaultLoadPlanner):
        """Non-tensor values (the optimizer's settings) loaded weights-only."""

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return Reader, Planner


class _Redirected:
    """DCP's file system, reading some files from other local files (`moved`: by full path)."""

    def __init__(self, files: Any, moved: dict[str, str]) -> None:
        self.files, self.moved = files, moved

    def __getattr__(self, name: str) -> Any:
        return getattr(self.files, name)

    def create_stream(self, path: Any, mode: str) -> Any:
        return self.files.create_stream(self.moved.get(os.fspath(path), path), mode)


def safe_reader(path: str) -> Any:
    """A DCP `FileSystemReader` for the directory `path` that never unpickles code."""
    return _safe_classes()[0](path)


def safe_planner() -> Any:
    """A DCP `DefaultLoadPlanner` whose non-tensor values load with `weights_only=True`."""
    return _safe_classes()[1]()
