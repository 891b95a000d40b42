"""Frozen parts as Keras runs them: a torch module's `trainable` flag (Keras' idiom) applied to
its parameters, norm layers with running statistics inside a wholly frozen part kept in inference
mode (Keras' frozen BatchNorm), and the trainable state a `compile` saw::

    net.base.trainable = False          # Keras' idiom on a torch module: honoured at compile and fit
    apply_trainable_flags(net)          # net.base's parameters: requires_grad False
    frozen_norms(net)                   # net.base's BatchNorm layers: run in inference mode
"""

from __future__ import annotations

import weakref

import torch
from torch.nn.modules.batchnorm import _NormBase
from torch.nn.parallel import DistributedDataParallel

#: `train` methods that do nothing beyond `torch.nn.Module.train` (a module's own override runs
#: each time fitkit switches modes, as a hand-written loop calls it)
_PLAIN_TRAIN = (torch.nn.Module.train, DistributedDataParallel.train)
_OVERRIDES: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def overrides_train(module: torch.nn.Module) -> bool:
    """Whether `module` or a submodule defines its own `train()` (kept per class)."""
    for m in module.modules():
        cls = type(m)
        found = _OVERRIDES.get(cls)
        if found is None:
            found = _OVERRIDES[cls] = cls.train not in _PLAIN_TRAIN
        if found:
            return True
    return False


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
    parameters is frozen when they are; one without takes the part it sits in."""
    if not any(isinstance(m, _NormBase) and m.track_running_stats for m in module.modules()):
        return []
    found: list[torch.nn.Module] = []

    def walk(m: torch.nn.Module, inherited: bool) -> None:
        params = list(m.parameters())
        frozen = not any(p.requires_grad for p in params) if params else inherited
        if isinstance(m, _NormBase) and m.track_running_stats and frozen:
            found.append(m)
        for child in m.children():
            walk(child, frozen)

    walk(module, False)
    return found


def trainable_state(module: torch.nn.Module) -> tuple[bool, ...]:
    """Each parameter's `requires_grad`, in order: what a compile saw."""
    return tuple(p.requires_grad for p in module.parameters())
