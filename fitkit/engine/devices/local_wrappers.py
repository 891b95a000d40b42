"""The module and optimizer wrappers `LocalFabric` hands back from `setup` (a one-device run
without Lightning), shaped as Fabric's: a compiled module's calls run the compiled one while its
state is the user's module's, and an optimizer stays an instance of its own class::

    opt = LocalOptimizer(torch.optim.Adam(net.parameters()))
    isinstance(opt, torch.optim.Adam), opt.optimizer      # True, the torch optimizer
    CompiledModule(torch.compile(net), net).state_dict()  # net's own keys
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch


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
                 fabric: Any = None):
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


def compiled_original(module: torch.nn.Module) -> torch.nn.Module | None:
    """The module inside a `torch.compile` wrapper (None for any other module), found without
    importing `torch._dynamo`."""
    if type(module).__name__ != "OptimizedModule":
        return None
    return module.__dict__.get("_modules", {}).get("_orig_mod")
