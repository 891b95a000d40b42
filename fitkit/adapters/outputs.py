"""Several outputs (Keras 3's multi-output models): naming a module's outputs, picking one, and
the losses of a module with several outputs.

A module may return a tensor, a tuple or list, or a dict. The outputs are named as Keras 3
names a model's: a dict's keys; for a tuple or list, `output_0`, `output_1`, ... (a torch
module has no layer names, which Keras uses for a functional model's unnamed outputs)::

    output_names((score, cls))                       # ["output_0", "output_1"]
    output_names({"score": s, "cls": c})             # ["score", "cls"]

    losses = build_loss({"score": "mse", "cls": "cross_entropy"}, loss_weights={"cls": 0.5})
    total = losses({"score": s, "cls": c}, {"score": ys, "cls": yc})   # mse + 0.5 * cross entropy
    losses.parts                                     # {"score": ..., "cls": ...}: each output's loss

A single loss on several outputs is applied to each (Keras 3), with one target per output.
"""

from __future__ import annotations

from typing import Any

import torch

#: Keys under which a dict output (a Hugging Face `ModelOutput`) holds the predictions.
PREDICTION_KEYS = ("logits", "predictions", "preds", "output")


def is_structure(value: Any) -> bool:
    """A tuple, list or dict (several outputs or targets), not a tensor."""
    return isinstance(value, (tuple, list, dict))


def output_names(outputs: Any) -> list[str]:
    """The names of a module's outputs (see the module docstring)."""
    if isinstance(outputs, dict):
        return [str(k) for k in outputs]
    if isinstance(outputs, (tuple, list)):
        return [f"output_{i}" for i in range(len(outputs))]
    return ["output"]


def pick(structure: Any, key: str | int, names: list[str] | None = None, what: str = "y") -> Any:
    """The item of `structure` (a dict, tuple or list) for an output `key`: a name or an index.
    A dict without that output's name is a `ValueError` that names `what` (the argument) and the
    outputs' names."""
    if isinstance(structure, dict):
        if isinstance(key, int):
            return list(structure.values())[key]
        if key not in structure:
            raise ValueError(_unnamed(structure, key, names, what))
        return structure[key]
    if isinstance(structure, (tuple, list)):
        if isinstance(key, str):
            key = (names or output_names(structure)).index(key)
        return structure[key]
    return structure


def _unnamed(given: dict, key: str, names: list[str] | None, what: str) -> str:
    outputs = names or []
    unnamed = all(n.startswith("output_") for n in outputs) if outputs else key.startswith("output_")
    fix = ("a module's tuple outputs are named output_0, output_1, ... (a torch module has no output "
           "layers to name them, as a Keras functional model does): return a dict from `forward` "
           f"(e.g. {{{', '.join(repr(k) for k in list(given)[:2])}: ...}}), or key `{what}` by output_0, output_1, "
           "..., or pass it as a list in the outputs' order") if unnamed else \
        f"key `{what}` by the outputs' names"
    return (f"`{what}` has no entry for output {key!r}: its keys are {list(given)}, the module's outputs are "
            f"{outputs or [key]}; {fix}")


def single_output(outputs: Any, targets: Any = None, what: str = "loss") -> Any:
    """The one output a single loss or metric looks at when the targets are one array: the
    tensor itself, a Hugging Face output's `logits`, or a one-item tuple's item. Several outputs
    against one target array are an error (Keras refuses them too): nothing trains or measures
    one output silently."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict):
        for key in PREDICTION_KEYS:
            if key in outputs:
                return outputs[key]
        rest = [k for k in outputs if k != "loss"]
        if len(rest) == 1:
            return outputs[rest[0]]
    elif isinstance(outputs, (tuple, list)):
        if len(outputs) == 1:
            return outputs[0]
    else:
        return getattr(outputs, "logits", outputs)
    names = output_names(outputs)
    raise ValueError(
        f"the module returned {len(names)} outputs ({', '.join(names)}) but `y` is one array, so the `{what}` cannot "
        f"tell which output it is for: pass one target per output (`y=[...]` or `y={{name: ...}}`, in the outputs' "
        f"order or names), compile a {what} per output (a list or dict, None for an output without one), or return "
        "one output from the module"
    )


def per_output(spec: Any, names: list[str], what: str) -> list[Any]:
    """`spec` given per output (a list in the outputs' order or a dict by name) as one entry per
    output name (None where a dict leaves an output out); an error naming `what` otherwise."""
    if isinstance(spec, dict):
        unknown = [k for k in spec if k not in names]
        if unknown:
            raise ValueError(f"`{what}` names {unknown}, which are not outputs of the module; its outputs are "
                             f"{names} (dict keys, or output_0, output_1, ... for a tuple: return a dict from `forward` to "
                             "name them)")
        return [spec.get(n) for n in names]
    if len(spec) != len(names):
        raise ValueError(f"`{what}` has {len(spec)} entries but the module returned {len(names)} outputs ({names}): "
                         "pass one entry per output (None for an output without one), or a dict by output name")
    return list(spec)


def _targets_for(targets: Any, names: list[str], index: int, lone: bool) -> Any:
    if isinstance(targets, dict):
        if names[index] not in targets:
            raise ValueError(f"`y` has no target for output {names[index]!r}: its keys are {list(targets)}; pass "
                             "targets under the outputs' names")
        return targets[names[index]]
    if isinstance(targets, (tuple, list)):
        if len(targets) != len(names):
            raise ValueError(f"`y` holds {len(targets)} targets but the module returned {len(names)} outputs "
                             f"({names}): pass one target per output, in the outputs' order")
        return targets[index]
    if lone:
        return targets
    raise ValueError(f"the module returned {len(names)} outputs ({names}) and several have a loss, but `y` is one "
                     "array: pass one target per output (`y=[...]` or a dict by output name)")


class OutputLosses:
    """The compiled loss of a module with several outputs: the weighted sum of each output's
    loss, as Keras 3 computes it (built by `fitkit.adapters.losses.build_loss`, passed as `build`
    for each output's loss). `spec` is one loss for every output, a list (one per output,
    None for none) or a dict by output name; `loss_weights` a list or dict (default 1 each).
    After each call, `parts` holds each output's (unweighted) loss, detached, when two or more
    outputs have one (Keras logs `<output>_loss` then); `None` otherwise."""

    structured = True

    def __init__(self, spec: Any, loss_weights: Any = None, *, build: Any):
        self.spec, self.loss_weights = spec, loss_weights
        self.name = "loss"
        if isinstance(spec, dict):
            self._losses: Any = {k: build(v) for k, v in spec.items()}
        elif isinstance(spec, (tuple, list)):
            self._losses = [build(v) for v in spec]
        else:
            self._losses = build(spec)  # one loss for every output
        self.parts: dict[str, torch.Tensor] | None = None
        # (names, [(index, name, loss, weight)]) for the outputs seen
        self._plan: tuple[list[str], list[tuple[int, str, Any, float]]] | None = None

    def losses_for(self, outputs: Any) -> list[tuple[int, str, Any, float]]:
        """(index, name, Loss, weight) of each output with a loss."""
        names = output_names(outputs) if is_structure(outputs) else ["output"]
        if self._plan is None or self._plan[0] != names:
            if isinstance(self._losses, (dict, list)):
                losses = per_output(self._losses, names, "loss")
            else:
                losses = [self._losses] * len(names)
            if self.loss_weights is None:
                weights = [1.0] * len(names)
            elif isinstance(self.loss_weights, (int, float)):
                weights = [float(self.loss_weights)] * len(names)
            else:
                weights = [1.0 if w is None else float(w) for w in per_output(self.loss_weights, names, "loss_weights")]
            plan = [(i, names[i], loss, weights[i]) for i, loss in enumerate(losses) if loss is not None]
            if not plan:
                raise ValueError("`loss` gives no output a loss: compile at least one (None marks an output without one)")
            self._plan = (names, plan)
        return self._plan[1]

    def __call__(self, outputs: Any, targets: Any, sample_weight: Any = None) -> torch.Tensor:
        plan = self.losses_for(outputs)
        assert self._plan is not None  # set by `losses_for`
        names = self._plan[0]
        several = is_structure(outputs)
        total, parts = None, {}
        for index, name, loss, weight in plan:
            out = pick(outputs, index) if several else outputs
            target = _targets_for(targets, names, index, lone=len(plan) == 1)
            sw = pick(sample_weight, index, names, "sample_weight") if is_structure(sample_weight) else sample_weight
            value = loss(out, target, sw)
            parts[name] = value
            value = value if weight == 1.0 else value * weight
            total = value if total is None else total + value
        self.parts = {k: v.detach() for k, v in parts.items()} if len(parts) > 1 else None
        assert total is not None  # `losses_for` gives at least one output a loss
        return total


class LossParts:
    """A metric spec standing for the per-output losses of a compiled loss: `MetricSet` logs
    each as `<output>_loss` (exact epoch means, like the loss) once the loss has computed them."""

    def __init__(self, loss: Any):
        self.loss = loss

    @property
    def active(self) -> bool:
        """Whether the loss has several outputs to report (known from the first batch)."""
        return bool(getattr(self.loss, "structured", False))

    def names(self) -> list[str]:
        plan = getattr(self.loss, "_plan", None) or getattr(getattr(self.loss, "_multi", None), "_plan", None)
        if plan is None or len(plan[1]) < 2:
            return []
        return [f"{name}_loss" for _, name, _, _ in plan[1]]

    def parts(self) -> dict[str, torch.Tensor] | None:
        return getattr(self.loss, "parts", None)


class OutputMetric:
    """A metric spec bound to one output (Keras' `metrics` as a list of lists or a dict): it
    sees that output and its target, and is logged as `<output>_<metric>`."""

    def __init__(self, spec: Any, key: str | int):
        self.spec, self.key = spec, key
        self.output = key if isinstance(key, str) else f"output_{key}"

    def select(self, outputs: Any, targets: Any) -> tuple[Any, Any]:
        if isinstance(self.key, int) and isinstance(outputs, dict):
            self.output = list(outputs)[self.key]  # Keras names a list entry by the output's name
        names = output_names(outputs) if is_structure(outputs) else None
        target = pick(targets, self.key, names) if is_structure(targets) else targets
        return (pick(outputs, self.key, names) if is_structure(outputs) else outputs), target

    def __repr__(self) -> str:
        return f"OutputMetric({self.spec!r}, {self.key!r})"
