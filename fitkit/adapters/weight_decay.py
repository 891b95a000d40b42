"""Which parameters weight decay applies to: Hugging Face's two groups, or names of one's own.

With the optimizer from Hugging Face arguments (`optim` set, as `fit(args=transformers.TrainingArguments(...))`
sets it), biases and normalisation weights are not decayed, exactly as the HF Trainer groups
them (`Trainer.get_decay_parameter_names`). `exclude_from_weight_decay` (a `TrainingArguments`
field, a compile or fit option, in the spirit of Keras 3's `optimizer.exclude_from_weight_decay`)
chooses otherwise::

    model.compile("adamw", weight_decay=0.01, exclude_from_weight_decay="hf")          # HF's groups
    model.compile("adamw", weight_decay=0.01, exclude_from_weight_decay=["bias", "norm"])  # regexes
    model.fit(x, y, args=hf_args, exclude_from_weight_decay=[])                         # decay everything

None (the default) means "hf" when `optim` is set and nothing excluded otherwise (fitkit's named
optimizers decay every parameter, as Keras does). A list holds regular expressions searched in
each parameter's name (`encoder.layer.0.attention.output.LayerNorm.weight`), as Keras searches
variable paths. An optimizer instance or a callable `params -> optimizer` gets the parameters
as they are: it groups them itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch

from fitkit.adapters.optimizers import TorchDefaults
from fitkit.common.wrappers import unwrapped

#: HF's name patterns for parameters without decay (searched in the lower-cased name).
HF_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
#: HF's layer types whose parameters are not decayed.
HF_NORM_LAYERS = (torch.nn.LayerNorm,)


def hf_decay_names(module: torch.nn.Module) -> list[str]:
    """The names of the parameters HF's Trainer decays (equal to `Trainer.get_decay_parameter_names`):
    all but those inside a LayerNorm and those whose name matches `HF_PATTERNS`."""
    in_norm = {id(p) for name, m in module.named_modules() if name and isinstance(m, HF_NORM_LAYERS)
               for p in m.parameters()}
    patterns = [re.compile(p) for p in HF_PATTERNS]
    return [name for name, p in module.named_parameters()
            if id(p) not in in_norm and not any(pat.search(name.lower()) for pat in patterns)]


def excluded_ids(module: torch.nn.Module, rule: Any) -> set[int]:
    """The ids of the parameters `rule` ("hf" or a list of regexes) exempts from decay."""
    if rule == "hf":
        decayed = set(hf_decay_names(module))
        return {id(p) for name, p in module.named_parameters() if name not in decayed}
    patterns = [re.compile(p) for p in rule]
    return {id(p) for name, p in module.named_parameters() if any(pat.search(name) for pat in patterns)}


def parameter_groups(module: torch.nn.Module, spec: Any, args: Any) -> Iterable:
    """What the optimizer is built over: `module.parameters()`, or two groups (decayed, then
    not decayed with `weight_decay` 0.0, only parameters that require gradients, as HF) when a
    rule applies to a named or class optimizer (see the module docstring)."""
    rule = getattr(args, "exclude_from_weight_decay", None)
    if rule is None:
        rule = "hf" if getattr(args, "optim", None) else "none"
    named = isinstance(spec, (str, TorchDefaults))  # TorchDefaults: an HF `optim` name
    builds_itself = isinstance(spec, torch.optim.Optimizer) or not (
        named or (isinstance(spec, type) and issubclass(spec, torch.optim.Optimizer)))
    if rule == "none" or (isinstance(rule, (list, tuple)) and not rule) or builds_itself:
        return module.parameters()
    skip = excluded_ids(unwrapped(module), rule)
    params = [p for p in module.parameters() if p.requires_grad]
    decay = [p for p in params if id(p) not in skip]
    no_decay = [p for p in params if id(p) in skip]
    return [g for g in ({"params": decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
