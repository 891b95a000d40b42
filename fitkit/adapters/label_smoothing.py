"""HF's `label_smoothing_factor`: the loss of a module that computes its own (`loss=None`),
replaced by the label-smoothed cross-entropy of its logits, as the Trainer's `LabelSmoother`
computes it (labels of -100 ignored; a causal LM's labels shifted by one)::

    smoothing = label_smoothing_for(args, module)     # (0.1, False), or None when the factor is 0
    loss = smoothed_loss(module(input_ids=ids), labels, *smoothing)
"""

from __future__ import annotations

import sys
from typing import Any

import torch

IGNORE_INDEX = -100


def label_smoothing_for(args: Any, module: torch.nn.Module) -> tuple[float, bool] | None:
    """(factor, shift) for `args.label_smoothing_factor` over `module` (shift: a causal LM, whose
    logits at position i predict the label at i + 1), or None without smoothing."""
    factor = float(getattr(args, "label_smoothing_factor", 0.0) or 0.0)
    if not factor:
        return None
    return factor, _is_causal_lm(module)


def _is_causal_lm(module: torch.nn.Module) -> bool:
    """True for a transformers causal-LM class (the Trainer shifts those labels itself)."""
    if "transformers" not in sys.modules:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    inner = getattr(module, "module", module)  # Fabric's wrapper
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile's
    return type(inner).__name__ in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def smoothed_loss(outputs: Any, labels: torch.Tensor, factor: float, shift: bool = False) -> torch.Tensor:
    """`(1 - factor)` x the mean negative log-likelihood of the labels + `factor` x the mean over
    classes of the negative log-probabilities, both over the positions whose label is not -100."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    if shift:
        logits, labels = logits[..., :-1, :].contiguous(), labels[..., 1:].contiguous()
    neg_log_probs = -torch.nn.functional.log_softmax(logits, dim=-1)
    if labels.dim() == neg_log_probs.dim() - 1:
        labels = labels.unsqueeze(-1)
    ignored = labels.eq(IGNORE_INDEX)
    picked = neg_log_probs.gather(dim=-1, index=labels.clamp(min=0)).masked_fill(ignored, 0.0)
    spread = neg_log_probs.sum(dim=-1, keepdim=True, dtype=torch.float32).masked_fill(ignored, 0.0)
    active = ignored.numel() - ignored.long().sum()
    return (1 - factor) * picked.sum() / active + factor * spread.sum() / (active * neg_log_probs.shape[-1])
