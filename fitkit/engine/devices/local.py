"""`LocalFabric`: a run on one device in full precision, without importing Lightning Fabric.

Such a run needs nothing from Fabric: no processes to launch, no gradients to sync, no
precision plugin; the step already calls the module, backward and the optimizer directly
(`fitkit.engine.step`). Importing `lightning_fabric` would still cost seconds and a hundred
MiB (it pulls in `torch._dynamo` and torchmetrics, and through torchmetrics `transformers` and
`scipy` where installed). So `build_fabric` gives such a run this stand-in, which offers the
part of Fabric's API fitkit and callbacks use, with Fabric's one-process behaviour and its
checkpoint format (a checkpoint written here loads under Fabric and back)::

    local = local_fabric(args)       # None when the run needs Fabric (see `needs_lightning`)
    module = local.setup_module(net)
    optimizer = local.setup_optimizers(torch.optim.Adam(module.parameters()))
    local.save("state.pt", {"model": module, "optimizer": optimizer, "step": 3})
    local.all_reduce(torch.tensor(1.0))   # one process: the value itself
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

#: What `precision` may be for a run without Fabric: full 32-bit precision, nothing to apply.
FULL_PRECISION = (None, "32-true", "32", 32)
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
        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
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


class LocalFabric:
    """Fabric's API on one process and one device, in full precision (see the module's doc).

    `model.fabric` is this object on such a run: `device`, `world_size` (1), `global_rank`,
    `local_rank`, `node_rank` (0), `is_global_zero` (True), `launch`, `setup_module`,
    `setup_optimizers`, `setup_dataloaders`, `backward`, `clip_gradients`,
    `no_backward_sync`, `all_reduce`, `all_gather`, `broadcast`, `barrier`, `print`, `save`
    and `load` behave as Fabric's do on one process.
    """

    world_size = 1
    global_rank = local_rank = node_rank = 0
    is_global_zero = True
    strategy = None  # no Fabric strategy: nothing to distribute
    _callbacks: tuple = ()

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            torch.cuda.set_device(device)  # as Fabric's CUDA accelerator does

    def __repr__(self) -> str:
        return f"LocalFabric(device={str(self.device)!r})"

    # -- launching and setting up ------------------------------------------------------------
    def launch(self, function: Callable[..., Any] | None = None, *args: Any, **kwargs: Any) -> Any:
        """Nothing to start: runs `function(self, *args, **kwargs)` here when given."""
        return None if function is None else function(self, *args, **kwargs)

    def setup_module(self, module: torch.nn.Module, move_to_device: bool = True) -> torch.nn.Module:
        """The module itself, on the device; a `torch.compile`d one inside a `CompiledModule`
        (its state dict is the user's module's, without `_orig_mod.`, as under Fabric)."""
        if move_to_device:
            module.to(self.device)
        original = _compiled_original(module)
        return module if original is None else CompiledModule(module, original)

    def setup_optimizers(self, *optimizers: torch.optim.Optimizer) -> Any:
        """Each optimizer in a `LocalOptimizer` (its torch optimizer is `.optimizer`, as Fabric's)."""
        wrapped = [LocalOptimizer(o) for o in optimizers]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def setup_dataloaders(self, *loaders: Any, use_distributed_sampler: bool = True, move_to_device: bool = True) -> Any:
        """Loaders whose batches come on the device: on CPU the loaders themselves; on a GPU
        through Fabric's loader wrapper (the one case here that imports Lightning)."""
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
        """Clip by norm (`max_norm`) or by value (`clip_val`), as Fabric does."""
        parameters = module.parameters()
        if max_norm is not None:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type,
                                                  error_if_nonfinite=error_if_nonfinite)
        if clip_val is not None:
            torch.nn.utils.clip_grad_value_(parameters, clip_val)
            return None
        raise ValueError("clip_gradients needs `max_norm` or `clip_val`")

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
    def save(self, path: str | os.PathLike, state: dict[str, Any]) -> None:
        """Write `state` with `torch.save`: modules and optimizers (and anything with
        `state_dict`) as their state dicts, the rest as is."""
        converted = {key: _state_of(_unwrap(obj)) for key, obj in state.items()}
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
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        checkpoint = torch.load(path, map_location=lambda storage, location: storage, weights_only=weights_only)
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
    the optimizer's class too (`isinstance(opt, torch.optim.Adam)`), as Fabric's wrapper is."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self._optimizer = optimizer
        self.__class__ = type("Local" + type(optimizer).__name__, (LocalOptimizer, type(optimizer)), {})

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return self._optimizer.step() if closure is None else self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        if name == "_optimizer":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)


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
    """Numbers as tensors on `device` (tensors as they are), through dicts, lists and tuples."""
    if isinstance(data, torch.Tensor):
        return data.to(device)
    if isinstance(data, (int, float, bool)):
        return torch.tensor(data, device=device)
    if isinstance(data, dict):
        return type(data)((k, _as_tensors(v, device)) for k, v in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(_as_tensors(v, device) for v in data)
    return data
