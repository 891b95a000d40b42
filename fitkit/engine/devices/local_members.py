"""The members of `lightning_fabric.Fabric` that fitkit's loop never calls, for `LocalFabric`.

`LocalFabric` (`fitkit.engine.devices.local`) is `model.fabric` on a one-device run; users reach
for Fabric itself there as on a cluster, so it offers every public member of Fabric with Fabric's
one-device behaviour. These are the ones the loop does not use. Only `strategy` and `accelerator`,
which are Lightning objects, import Lightning (a one-device Fabric is built on first use)::

    fabric = model.fabric                           # after a one-device fit
    batch = fabric.to_device({"x": x, "y": y})      # tensors (in any collection) onto the device
    with fabric.rank_zero_first():                  # one process: just runs the block
        download()
    fabric.seed_everything(42)                      # Python, NumPy and torch, as Fabric seeds them
    with fabric.init_module(empty_init=True):       # on the device, torch.nn.init skipped
        net = Net()
    fabric.log_dict({"loss": loss})                 # to `fabric.loggers` (none unless you add one)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import random
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fitkit.common.tensors import map_leaves

#: Fabric's bounds for a seed (NumPy's: an unsigned 32-bit integer).
SEED_RANGE = (0, 2**32 - 1)
#: The logger Lightning's `seed_everything` reports on ("Seed set to 42"), the same name here.
_SEED_LOGGER = logging.getLogger("lightning_fabric.utilities.seed")
#: Where Fabric reads a process's rank for its messages, in its order.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


class LocalMembers:
    """Fabric's members beyond the loop's, on one process and one device (see the module's doc).

    A mixin of `LocalFabric`, which provides `device`.
    """

    device: torch.device
    _loggers: list[Any]
    _callbacks: list[Any]

    # -- Lightning's own objects (the one part that imports Lightning) ------------------------
    @property
    def strategy(self) -> Any:
        """Lightning's `SingleDeviceStrategy` on this device (Lightning is imported on first use)."""
        return self._lightning().strategy

    @property
    def accelerator(self) -> Any:
        """Lightning's accelerator of this device (`CPUAccelerator`, `CUDAAccelerator`; Lightning is
        imported on first use)."""
        return self._lightning().accelerator

    def _lightning(self) -> Any:
        """A Lightning Fabric on this device in full precision, built once: what `strategy` and
        `accelerator` are read from. It never sees the run's module or optimizer."""
        fabric = self.__dict__.get("_lightning_fabric")
        if fabric is None:
            from fitkit.engine.devices.quiet import import_lightning

            import_lightning()
            from lightning_fabric import Fabric

            devices = [self.device.index or 0] if self.device.type == "cuda" else 1
            fabric = Fabric(accelerator=self.device.type, devices=devices, precision="32-true")
            self.__dict__["_lightning_fabric"] = fabric
        return fabric

    # -- moving -----------------------------------------------------------------------------------
    def to_device(self, obj: Any) -> Any:
        """A module moved to the device (the same object), or a tensor or any collection of
        tensors (and of objects with a `.to` method) with each moved, as Fabric's `to_device`."""
        if isinstance(obj, torch.nn.Module):
            return obj.to(self.device)
        device = self.device
        non_blocking = device.type not in ("cpu", "mps")  # as Fabric: a copy to the host waits

        def move(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.to(device, non_blocking=non_blocking)
            moved = value.to(device)
            return value if moved is None else moved  # a `.to` that forgot to return self

        return map_leaves(move, obj, _transferable)

    # -- context managers ------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """Full precision: nothing to cast (Fabric's 32-bit precision gives the same empty context)."""
        return contextlib.nullcontext()

    def init_tensor(self) -> contextlib.AbstractContextManager:
        """Tensors created in the block are created on the device."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.device)
        return stack

    def init_module(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Modules built in the block get their parameters on the device; with `empty_init=True`
        every `torch.nn.init` call is skipped (the memory is left as allocated, for weights that
        a checkpoint will overwrite)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.device)
        if empty_init:
            stack.enter_context(SkipInit())
        return stack

    def sharded_model(self) -> contextlib.AbstractContextManager:
        """Deprecated by Fabric in favour of `init_module`; one device shards nothing."""
        warnings.warn("`Fabric.sharded_model()` is deprecated in favor of `Fabric.init_module()`.",
                      DeprecationWarning, stacklevel=2)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def rank_zero_first(self, local: bool = False) -> Iterator[None]:
        """Rank 0 runs the block before the others; on one process it simply runs."""
        yield

    # -- loggers and callbacks ---------------------------------------------------------------------
    @property
    def loggers(self) -> list[Any]:
        """The loggers `log` and `log_dict` write to: fitkit builds Fabric with none, so empty
        unless you append one (any object with `log_metrics(metrics, step)`)."""
        return self._loggers

    @property
    def logger(self) -> Any:
        """The first of `loggers` (an `IndexError` when there is none, as under Fabric)."""
        return self._loggers[0]

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """`log_dict({name: value}, step)`."""
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Each one-element tensor in `metrics` as a Python number, to every logger of `loggers`."""
        scalars = map_leaves(_as_scalar, metrics, lambda value: isinstance(value, torch.Tensor))
        for logger in self._loggers:
            logger.log_metrics(metrics=scalars, step=step)

    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """Call `hook_name` on each Fabric callback that has it, with the keyword arguments its
        signature takes (fitkit builds Fabric with no callbacks, so this reaches none)."""
        for callback in self._callbacks:
            method = getattr(callback, hook_name, None)
            if method is None:
                continue
            if not callable(method):
                warnings.warn(f"Skipping the callback `{type(callback).__name__}.{hook_name}` because it is not "
                              "callable.", stacklevel=2)
                continue
            method(*args, **_accepted(method, kwargs))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Nothing, as Fabric's: a subclass of Fabric overrides it."""
        return None

    # -- seeds ------------------------------------------------------------------------------------
    @staticmethod
    def seed_everything(seed: int | None = None, workers: bool | None = None, verbose: bool = True) -> int:
        """Seed Python's `random`, NumPy and torch with `seed` (None: `PL_GLOBAL_SEED`, else 0, with
        a warning) and set `PL_GLOBAL_SEED` and `PL_SEED_WORKERS` (`workers`, True by default), as
        Fabric's `seed_everything` does; returns the seed."""
        if seed is None:
            found = os.environ.get("PL_GLOBAL_SEED")
            if found is None:
                seed = 0
                if verbose:
                    warnings.warn(f"No seed found, seed set to {seed}", stacklevel=2)
            else:
                try:
                    seed = int(found)
                except ValueError:
                    raise ValueError(f"Invalid seed specified via PL_GLOBAL_SEED: {found!r}") from None
        elif not isinstance(seed, int):
            seed = int(seed)
        if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise ValueError(f"{seed} is not in bounds, numpy accepts from {SEED_RANGE[0]} to {SEED_RANGE[1]}")
        if verbose:
            rank = next((os.environ[v] for v in _RANK_VARIABLES if v in os.environ), None)
            _log_seed(f"Seed set to {seed}" if rank is None else f"[rank: {int(rank)}] Seed set to {seed}")
        os.environ["PL_GLOBAL_SEED"] = str(seed)
        random.seed(seed)
        import numpy as np

        np.random.seed(seed)
        torch.manual_seed(seed)
        os.environ["PL_SEED_WORKERS"] = str(int(True if workers is None else workers))
        return seed


class SkipInit(TorchFunctionMode):
    """Inside it, every function of `torch.nn.init` returns its tensor untouched: a module's
    parameters keep the memory they were allocated with (Fabric's `init_module(empty_init=True)`)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


def _log_seed(message: str) -> None:
    """`message` on Fabric's seed logger, shown as Fabric shows it: importing `lightning_fabric`
    sets its logger to INFO with a stderr handler (when the root logger has none), so without that
    import the same set-up holds for this one message (left as it was after, so that a later import
    of Lightning does not find a second handler)."""
    if "lightning_fabric" in sys.modules:
        _SEED_LOGGER.info(message)
        return
    package = logging.getLogger("lightning_fabric")
    level, propagate, handlers = package.level, package.propagate, list(package.handlers)
    package.setLevel(logging.INFO)
    if not logging.getLogger().hasHandlers():
        package.addHandler(logging.StreamHandler())
        package.propagate = False
    try:
        _SEED_LOGGER.info(message)
    finally:
        package.setLevel(level)
        package.propagate = propagate
        package.handlers[:] = handlers


def _transferable(value: Any) -> bool:
    """What `to_device` moves: anything whose class has a `to` method (tensors, modules, batches)."""
    return callable(getattr(type(value), "to", None)) and not isinstance(value, type)


def _as_scalar(value: torch.Tensor) -> Any:
    if value.numel() != 1:
        raise ValueError(f"The metric `{value}` does not contain a single element, thus it cannot be converted "
                         "to a scalar.")
    return value.item()


def _accepted(method: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `method` takes (all of them when it takes `**kwargs`, or when its
    signature cannot be read)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return kwargs
    names = {p.name for p in parameters}
    return {key: value for key, value in kwargs.items() if key in names}
