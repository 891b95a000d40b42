"""`LocalFabric`: a run on one device in full precision, without importing Lightning Fabric.

Such a run needs nothing from Fabric: no processes to launch, no gradients to sync, no
precision plugin; the step already calls the module, backward and the optimizer directly
(`fitkit.engine.step`). Importing `lightning_fabric` would still cost seconds and a hundred
MiB (it pulls in `torch._dynamo` and torchmetrics, and through torchmetrics `transformers` and
`scipy` where installed). So `build_fabric` gives such a run this stand-in, which offers every
public member of Fabric with Fabric's one-process behaviour and its checkpoint format (a
checkpoint written here loads under Fabric and back). This module holds the members the loop
uses; `fitkit.engine.devices.local_members` the rest::

    local = local_fabric(args)       # None when the run needs Fabric (see `needs_lightning`)
    module = local.setup_module(net)
    optimizer = local.setup_optimizers(torch.optim.Adam(module.parameters()))
    local.save("state.pt", {"model": module, "optimizer": optimizer, "step": 3})
    local.all_reduce(torch.tensor(1.0))   # one process: the value itself
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import itertools
import os
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from fitkit.common.tensors import map_leaves
from fitkit.config.devices import auto_accelerator
from fitkit.engine.devices.local_members import LocalMembers
from fitkit.engine.devices.worker_seeds import add_worker_seeding

#: What `precision` may be for a run without Fabric: full 32-bit precision, nothing to apply.
FULL_PRECISION = (None, "32-true", "32", 32)
#: The Lightning Fabric release whose public members `LocalFabric` was last checked against
#: (tests/test_fabric_api.py lists the installed release's and fails on one not covered).
CHECKED_AGAINST = "lightning-fabric 2.6"
#: Variables a launcher (torchrun, `fabric run`, SLURM) sets: Fabric then reads the processes.
_LAUNCHER_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS")


def needs_lightning(args: Any) -> bool:
    """Whether the run asks for something only Fabric does: a strategy, several devices or
    nodes, a launcher, a precision plugin, an accelerator object or one other than CPU/CUDA."""
    return local_device(args) is None


def local_device(args: Any) -> torch.device | None:
    """The one device of a run Fabric has nothing to do for (None: the run needs Fabric)."""
    if args.strategy != "auto" or args.num_nodes != 1 or args.precision not in FULL_PRECISION:
        return None
    if os.environ.get("LT_CLI_USED") == "1" or any(_count(os.environ.get(v)) > 1 for v in _LAUNCHER_VARIABLES):
        return None
    accelerator, devices = args.accelerator, args.devices
    if accelerator == "auto":
        accelerator = auto_accelerator()
    if accelerator == "cpu":
        return torch.device("cpu") if devices in ("auto", 1, "1") else None
    if accelerator not in ("cuda", "gpu"):
        return None
    if devices in (1, "1") or (devices == "auto" and torch.cuda.device_count() == 1):
        return torch.device("cuda", 0)
    if isinstance(devices, (list, tuple)) and len(devices) == 1:
        return torch.device("cuda", int(devices[0]))
    return None


def _count(value: str | None) -> int:
    try:
        return int(value) if value else 1
    except ValueError:
        return 1


def local_fabric(args: Any) -> LocalFabric | None:
    """A `LocalFabric` for `args`, or None when the run needs Lightning Fabric."""
    device = local_device(args)
    return None if device is None else LocalFabric(device)


class LocalFabric(LocalMembers):
    """Fabric's API on one process and one device, in full precision (see the module's doc).

    `model.fabric` is this object on such a run. Every public member of `lightning_fabric.Fabric`
    behaves as Fabric's does on one process: `device`, `world_size` (1), `global_rank`,
    `local_rank`, `node_rank` (0), `is_global_zero` (True), `launch`, `setup_module`,
    `setup_optimizers`, `setup_dataloaders`, `backward`, `clip_gradients`, `no_backward_sync`,
    `all_reduce`, `all_gather`, `broadcast`, `barrier`, `print`, `setup`, `save`, `load` and
    `load_raw` here, and the rest in `LocalMembers` (`local_members.py`). A set-up module is the
    module itself (a compiled one a `CompiledModule`), not Fabric's `_FabricModule`.
    """

    world_size = 1
    global_rank = local_rank = node_rank = 0
    is_global_zero = True

    def __init__(self, device: torch.device):
        self.device = device
        self._loggers: list[Any] = []  # Fabric(loggers=...): fitkit passes none
        self._callbacks: list[Any] = []  # Fabric(callbacks=...): fitkit passes none
        if device.type == "cuda":
            torch.cuda.set_device(device)  # as Fabric's CUDA accelerator does

    def __repr__(self) -> str:
        return f"LocalFabric(device={str(self.device)!r})"

    def __getattr__(self, name: str) -> Any:
        # Reached only for a name no class here defines: a member of a newer Fabric, or a typo.
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(
            f"'LocalFabric' object has no attribute {name!r}. `model.fabric` of a one-device run is fitkit's "
            f"LocalFabric, which offers every public member of lightning_fabric.Fabric as of {CHECKED_AGAINST}; "
            "to run on Lightning's own Fabric (with anything a newer release added), compile with "
            "strategy='single_device'"
        )

    # -- launching and setting up ------------------------------------------------------------
    def launch(self, function: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Nothing to start: runs `function(self, *args, **kwargs)` here when given."""
        if function is None:
            return None
        if not callable(function):
            raise TypeError(f"`Fabric.launch(...)` needs to be a callable, but got {function}. HINT: do "
                            "`.launch(your_fn)` instead of `.launch(your_fn())`")
        if not inspect.signature(function).parameters:
            raise TypeError(f"`Fabric.launch(function={function})` needs to take at least one argument. The "
                            "launcher will pass in the `Fabric` object so you can use it inside the function.")
        return function(self, *args, **kwargs)

    def setup(self, module: torch.nn.Module, *optimizers: torch.optim.Optimizer, scheduler: Any = None,
              move_to_device: bool = True, _reapply_compile: bool = True) -> Any:
        """`setup_module` and `setup_optimizers` at once: the module alone when no optimizer is
        given, else `(module, *optimizers)`, with `scheduler` last when given (as Fabric)."""
        if isinstance(module, CompiledModule):
            raise ValueError("A model should be passed only once to the `setup` method.")
        if any(isinstance(o, LocalOptimizer) for o in optimizers):
            raise ValueError("An optimizer should be passed only once to the `setup` method.")
        module = self.setup_module(module, move_to_device=move_to_device, _reapply_compile=_reapply_compile)
        wrapped = [self.setup_optimizers(o) for o in optimizers]
        self.call("on_after_setup", fabric=self, module=module)
        if not wrapped:
            return module
        return (module, *wrapped, scheduler) if scheduler is not None else (module, *wrapped)

    def setup_module(self, module: torch.nn.Module, move_to_device: bool = True,
                     _reapply_compile: bool = True) -> torch.nn.Module:
        """The module itself, on the device; a `torch.compile`d one inside a `CompiledModule`
        (its state dict is the user's module's, without `_orig_mod.`, as under Fabric)."""
        if isinstance(module, CompiledModule):
            raise ValueError("A model should be passed only once to the `setup_module` method.")
        if move_to_device and not (self.device.type == "cpu" and _on_cpu(module)):  # (`to` walks every tensor)
            module.to(self.device)
        original = _compiled_original(module)
        return module if original is None else CompiledModule(module, original)

    def setup_optimizers(self, *optimizers: torch.optim.Optimizer) -> Any:
        """Each optimizer in a `LocalOptimizer` (its torch optimizer is `.optimizer`, as Fabric's)."""
        if not optimizers:
            raise ValueError("`setup_optimizers` requires at least one optimizer as input.")
        if any(isinstance(o, LocalOptimizer) for o in optimizers):
            raise ValueError("An optimizer should be passed only once to the `setup_optimizers` method.")
        wrapped = [LocalOptimizer(o, self._callbacks, self) for o in optimizers]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def setup_dataloaders(self, *loaders: Any, use_distributed_sampler: bool = True, move_to_device: bool = True) -> Any:
        """Loaders whose batches come on the device: on CPU the loaders themselves; on a GPU
        through Fabric's loader wrapper (the one case here that imports Lightning). After
        `seed_everything` (workers=True) a loader without a `worker_init_fn` gets Fabric's, which
        seeds each worker's generators (`fitkit.engine.devices.worker_seeds`)."""
        if not loaders:
            raise ValueError("`setup_dataloaders` requires at least one dataloader as input.")
        if any(not isinstance(loader, torch.utils.data.DataLoader) for loader in loaders):
            raise TypeError("Only PyTorch DataLoader are currently supported in `setup_dataloaders`.")
        for loader in loaders:
            add_worker_seeding(loader, self.global_rank)
        if self.device.type == "cpu" or not move_to_device:
            return loaders[0] if len(loaders) == 1 else list(loaders)
        from lightning_fabric.wrappers import _FabricDataLoader

        wrapped = [_FabricDataLoader(loader, device=self.device) for loader in loaders]
        return wrapped[0] if len(wrapped) == 1 else wrapped

    # -- the step ------------------------------------------------------------------------------
    def backward(self, tensor: torch.Tensor, *args: Any, model: Any = None, **kwargs: Any) -> None:
        tensor.backward(*args, **kwargs)

    def clip_gradients(self, module: torch.nn.Module, optimizer: Any, clip_val: float | None = None,
                       max_norm: float | None = None, norm_type: float = 2.0,
                       error_if_nonfinite: bool = True) -> torch.Tensor | None:
        """Clip the gradients of the parameters `optimizer` updates, by value (`clip_val`) or by
        norm (`max_norm`, returning the norm before clipping), as Fabric does."""
        if clip_val is not None and max_norm is not None:
            raise ValueError("Only one of `clip_val` or `max_norm` can be set as this specifies the underlying "
                             "clipping algorithm!")
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        if clip_val is not None:
            torch.nn.utils.clip_grad_value_(parameters, clip_val)
            return None
        if max_norm is not None:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type,
                                                  error_if_nonfinite=error_if_nonfinite)
        raise ValueError("You have to specify either `clip_val` or `max_norm` to do gradient clipping!")

    def no_backward_sync(self, module: torch.nn.Module, enabled: bool = True) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # one process: no gradient sync to skip

    # -- collectives (one process: the values themselves) ----------------------------------------
    def all_reduce(self, data: Any, group: Any = None, reduce_op: str = "mean") -> Any:
        return _as_tensors(data, self.device)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        return _as_tensors(data, self.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        return None

    def print(self, *args: Any, **kwargs: Any) -> None:
        print(*args, **kwargs)

    # -- checkpoints: Fabric's format -----------------------------------------------------------
    def save(self, path: str | os.PathLike, state: dict[str, Any],
             filter: dict[str, Callable[[str, Any], bool]] | None = None) -> None:
        """Write `state` with `torch.save`: modules and optimizers (and anything with
        `state_dict`) as their state dicts, the rest as is. `filter` maps a key of `state` to a
        function `(name, value) -> bool` that picks the entries of its state dict to keep."""
        if filter is not None:
            _check_filter(filter, state)
        converted: dict[str, Any] = {}
        for key, obj in state.items():
            saved = _state_of(_unwrap(obj))
            if filter is not None and key in filter and isinstance(saved, dict):
                kept = {name: value for name, value in saved.items() if filter[key](name, value)}
                if kept:  # a key whose filter keeps nothing is left out, as Fabric leaves it
                    converted[key] = kept
            else:
                converted[key] = saved
        buffer = io.BytesIO()  # the whole file at once, as Fabric writes it
        torch.save(converted, buffer)
        directory = os.path.dirname(os.fspath(path))
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())

    def load(self, path: str | os.PathLike, state: dict[str, Any] | None = None, strict: bool = True, *,
             weights_only: bool | None = None) -> dict[str, Any]:
        """Restore the objects of `state` in place from `path`; plain values in `state` are
        replaced by the saved ones. Returns what `state` did not ask for (everything without
        `state`)."""
        checkpoint = self._load_file(path, weights_only)
        if not state:
            return checkpoint
        missing = [key for key in state if key not in checkpoint]
        if strict and missing:
            raise KeyError(f"The requested state contains a key '{missing[0]}' that does not exist in the loaded "
                           "checkpoint. To disable strict loading, set `strict=False`.")
        for name, obj in list(state.items()):
            if name not in checkpoint:
                continue
            target = _unwrap(obj)
            if isinstance(target, torch.nn.Module):
                target.load_state_dict(checkpoint.pop(name), strict=strict)
            elif _stateful(target):
                target.load_state_dict(checkpoint.pop(name))
            else:
                state[name] = checkpoint.pop(name)
        return checkpoint

    def load_raw(self, path: str | os.PathLike, obj: Any, strict: bool = True, *,
                 weights_only: bool | None = None) -> None:
        """Load a plain state-dict file (`torch.save(net.state_dict(), path)`) into a module or
        an optimizer; `strict` applies to modules."""
        target = _unwrap(obj)
        saved = self._load_file(path, weights_only)
        if isinstance(target, torch.nn.Module):
            target.load_state_dict(saved, strict=strict)
        else:
            target.load_state_dict(saved)

    def _load_file(self, path: str | os.PathLike, weights_only: bool | None) -> Any:
        """What `torch.save` wrote at `path`, its tensors where they were saved from."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        return torch.load(path, map_location=lambda storage, location: storage, weights_only=weights_only)


def strategy_name(fabric: Any) -> str:
    """The class name of `fabric`'s strategy, without importing Lightning for a `LocalFabric`."""
    if isinstance(fabric, LocalFabric):
        return "SingleDeviceStrategy"
    return type(getattr(fabric, "strategy", None)).__name__


def _check_filter(filter: Any, state: dict[str, Any]) -> None:
    """`save`'s `filter` checked as Fabric checks it."""
    if not isinstance(filter, dict):
        raise TypeError(f"Filter should be a dictionary, given {filter!r}")
    if not set(filter).issubset(state):
        raise ValueError(f"The filter keys {filter.keys() - state} are not present in the state keys {set(state)}.")
    for key, value in filter.items():
        if not callable(value):
            raise TypeError(f"Expected `fabric.save(filter=...)` for key {key!r} to be a callable, given {value!r}")


class CompiledModule(torch.nn.Module):
    """A compiled module as `LocalFabric` sets it up: calls run the compiled one
    (`_forward_module`); `module`, `state_dict` and `load_state_dict` are the user's module's."""

    def __init__(self, compiled: torch.nn.Module, original: torch.nn.Module):
        super().__init__()
        self._forward_module = compiled
        self._original_module = original

    @property
    def module(self) -> torch.nn.Module:
        return self._original_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_module(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, *args: Any, **kwargs: Any) -> Any:
        # `*args`: what Module's signature allows after `strict` (`assign`), passed on as given
        return self._original_module.load_state_dict(state_dict, strict, *args, **kwargs)


class LocalOptimizer:
    """A torch optimizer as `LocalFabric` sets it up: the optimizer is `.optimizer`; the rest
    (`step`, `param_groups`, `state`, `zero_grad`, ...) is the optimizer's own. Instances are of
    the optimizer's class too (`isinstance(opt, torch.optim.Adam)`), as Fabric's wrapper is.

    After each `step`, each of `callbacks` that has `on_after_optimizer_step(strategy, optimizer)`
    gets it, as Fabric's wrapper calls its Fabric's callbacks (`strategy` is `fabric.strategy`,
    read only then: it imports Lightning)."""

    def __init__(self, optimizer: torch.optim.Optimizer, callbacks: list[Any] | None = None,
                 fabric: LocalFabric | None = None):
        self._optimizer = optimizer
        # Fabric's wrapper keeps its Fabric's list only when it holds a callback at set-up time
        self._callbacks = callbacks or []
        self._fabric = None if fabric is None else weakref.ref(fabric)  # a copy of the optimizer shares it
        owner: type = type(optimizer)  # annotated: mypy does not count `type[Optimizer]` as Hashable for the cache
        self.__class__ = local_optimizer_class(owner)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        output = self._optimizer.step() if closure is None else self._optimizer.step(closure)
        for callback in self._callbacks:
            hook = getattr(callback, "on_after_optimizer_step", None)
            if callable(hook):
                fabric = None if self._fabric is None else self._fabric()
                hook(strategy=None if fabric is None else fabric.strategy, optimizer=self._optimizer)
        return output

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        if name == "_optimizer":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)


@functools.lru_cache(maxsize=64)
def local_optimizer_class(cls: type) -> type:
    """The class of a `LocalOptimizer` over a `cls` optimizer, made once per class: a class made
    per instance would cost its creation at every fit and, being in reference cycles, keep each
    search trial's optimizer (and its module) alive until a garbage collection."""
    return type("Local" + cls.__name__, (LocalOptimizer, cls), {})


def _compiled_original(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module inside a `torch.compile` wrapper (None for any other module), found without
    importing `torch._dynamo`."""
    if type(module).__name__ != "OptimizedModule":
        return None
    return module.__dict__.get("_modules", {}).get("_orig_mod")


def _unwrap(obj: Any) -> Any:
    """The torch optimizer of a `LocalOptimizer`; the user's module of a compiled one."""
    if isinstance(obj, LocalOptimizer):
        return obj.optimizer
    if isinstance(obj, CompiledModule):
        return obj.module
    original = _compiled_original(obj) if isinstance(obj, torch.nn.Module) else None
    return obj if original is None else original


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _state_of(obj: Any) -> Any:
    return obj.state_dict() if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)) or _stateful(obj) else obj


def _as_tensors(data: Any, device: torch.device) -> Any:
    """Numbers and NumPy arrays as tensors on `device`, tensors moved there, through any
    collection, with Fabric's types (bool: uint8, int: int32, float: float32)."""
    import numpy as np

    def convert(value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.to(device)
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value).to(device)
        dtype = torch.uint8 if isinstance(value, bool) else torch.int if isinstance(value, int) else torch.float
        return torch.tensor(value, dtype=dtype, device=device)

    return map_leaves(convert, data, lambda v: isinstance(v, (torch.Tensor, np.ndarray, bool, int, float)))


def _on_cpu(module: torch.nn.Module) -> bool:
    """Whether every parameter and buffer of `module` is on the CPU already."""
    return all(t.device.type == "cpu" for t in itertools.chain(module.parameters(), module.buffers()))
