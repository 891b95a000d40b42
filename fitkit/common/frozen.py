"""Frozen parts as Keras runs them: a torch module's `trainable` flag (Keras' idiom) applied to
its parameters, norm layers with running statistics inside a wholly frozen part kept in inference
mode (Keras' frozen BatchNorm), and the trainable state a `compile` saw::

    net.base.trainable = False          # Keras' idiom on a torch module: honoured at compile and fit
    apply_trainable_flags(net)          # net.base's parameters: requires_grad False
    frozen_norms(net)                   # net.base's BatchNorm layers: run in inference mode
"""

from __future__ import annotations

import functools

import torch
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.parallel import DistributedDataParallel

#: `train` methods that do nothing beyond `torch.nn.Module.train` (a module's own override runs
#: each time fitkit switches modes, as a hand-written loop calls it)
_PLAIN_TRAIN = (torch.nn.Module.train, DistributedDataParallel.train)


def _class(m: torch.nn.Module) -> type:
    return type(m)  # as `type`: mypy does not count `type[Module]` as Hashable for the caches


@functools.lru_cache(maxsize=1024)
def _own_train(cls: type) -> bool:
    return getattr(cls, "train", None) not in _PLAIN_TRAIN


@functools.lru_cache(maxsize=1024)
def _tracking_norm(cls: type) -> bool:
    return issubclass(cls, _NormBase)


def overrides_train(module: torch.nn.Module) -> bool:
    """Whether `module` or a submodule defines its own `train()` (kept per class)."""
    return any(_own_train(_class(m)) for m in module.modules())


def train_plan(module: torch.nn.Module, mode: bool) -> tuple[list[torch.nn.Module], bool, set[int]]:
    """What `train(mode)` on `module` involves, from one walk of its tree: its modules, whether
    one defines its own `train()`, and (training) the ids of the norm layers `frozen_norms` keeps
    in inference mode."""
    modules = list(module.modules())
    own = any(_own_train(_class(m)) for m in modules)
    if not mode or _nothing_frozen(modules):
        return modules, own, set()
    return modules, own, {id(m) for m in _frozen_in(module)}


def apply_trainable_flags(module: torch.nn.Module) -> bool:
    """Keras' `layer.trainable = False` written on a torch module: each submodule with a boolean
    `trainable` attribute sets `requires_grad` of all its parameters to it, outer modules first
    (a flag on an inner module wins inside it). True when some module has the flag."""
    found = False
    for m in module.modules():
        flag = m.__dict__.get("trainable")
        if isinstance(flag, bool):
            found = True
            for p in m.parameters():
                if p.requires_grad is not flag:
                    p.requires_grad_(flag)
    return found


def frozen_norms(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The norm layers with running statistics (BatchNorm, InstanceNorm with
    `track_running_stats`) inside a part whose parameters are all frozen: Keras runs a frozen
    BatchNorm in inference mode (its moving statistics used, never updated). A norm layer with
    parameters is frozen when they are; one without takes the part it sits in. One pass up the
    tree and one down (this runs at each epoch and `train_on_batch`)."""
    if _nothing_frozen(list(module.modules())):
        return []
    return _frozen_in(module)


def _nothing_frozen(modules: list[torch.nn.Module]) -> bool:
    """No parameter frozen (the common case), or no norm layer with running statistics."""
    return all(p is None or p.requires_grad for m in modules for p in m._parameters.values()) or not any(
        _tracking_norm(_class(m)) and m.track_running_stats for m in modules)


def _frozen_in(module: torch.nn.Module) -> list[torch.nn.Module]:
    """`frozen_norms` past its quick checks."""
    subtree: dict[int, tuple[bool, bool]] = {}  # id -> (holds parameters, one of them trains)

    def up(m: torch.nn.Module) -> tuple[bool, bool]:
        has = trains = False
        for p in m._parameters.values():
            if p is not None:
                has, trains = True, trains or p.requires_grad
        for child in m._modules.values():
            if child is not None:
                child_has, child_trains = up(child)
                has, trains = has or child_has, trains or child_trains
        subtree[id(m)] = (has, trains)
        return has, trains

    found: list[torch.nn.Module] = []

    def down(m: torch.nn.Module, inherited: bool) -> None:
        has, trains = subtree[id(m)]
        frozen = not trains if has else inherited
        if frozen and isinstance(m, _NormBase) and m.track_running_stats:
            found.append(m)
        for child in m._modules.values():
            if child is not None:
                down(child, frozen)

    up(module)
    down(module, False)
    return found


def trainable_state(module: torch.nn.Module) -> tuple[bool, ...]:
    """Each parameter's `requires_grad`, in order: what a compile saw."""
    return tuple(p.requires_grad for p in module.parameters())
