"""What `from_pretrained` reads, written beside fitkit's own checkpoint files for a Hugging Face
model (a `transformers.PreTrainedModel`, or anything with `save_pretrained` and a `config`)::

    model.fit(train, validation_data=val, args=hf_args, processing_class=tokenizer)
    AutoModelForSequenceClassification.from_pretrained("out/checkpoint-40")   # the trained weights
    AutoTokenizer.from_pretrained("out/checkpoint-40")                        # the tokenizer given

Each checkpoint directory gets `save_pretrained`'s files (`config.json`, `model.safetensors`)
and the `processing_class`'s; they are written before the manifest, so its digests cover them and
`verify` checks them as it checks `state.pt` (resuming reads only fitkit's own files).
A module whose parameters are sharded (FSDP) has no full copy on one process: its checkpoints
keep fitkit's files only (a warning says so once); `Model.save_model` after the fit writes them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from fitkit.common.wrappers import unwrapped
from fitkit.config.hf_processing import save_processing_class

logger = logging.getLogger("fitkit")
_warned: set[str] = set()

#: Wrappers around the user's module (Fabric's, DDP's, torch.compile's) and where they keep it.


def is_pretrained(module: Any) -> bool:
    """True for a Hugging Face model: it has `save_pretrained` and a `config`."""
    return callable(getattr(module, "save_pretrained", None)) and getattr(module, "config", None) is not None


def _sharded(module: torch.nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor" for p in module.parameters())


def export_pretrained(directory: str, module: Any, args: Any) -> None:
    """Write `save_pretrained`'s files (and the processing class's) into `directory` when the
    module is a Hugging Face model with its full weights on this process; else nothing."""
    inner = unwrapped(module)
    if not is_pretrained(inner):
        return
    if _sharded(inner):
        if type(inner).__name__ not in _warned:
            _warned.add(type(inner).__name__)
            logger.warning("the checkpoints of the sharded %s hold fitkit's files only: call Model.save_model() "
                           "after the fit for what from_pretrained reads", type(inner).__name__)
        return
    inner.save_pretrained(directory)
    save_processing_class(args, directory)


def save_model(directory: str, module: Any, args: Any) -> str:
    """HF's `Trainer.save_model`: the model's `save_pretrained` files and the processing class
    in `directory` (created when missing); returns it."""
    inner = unwrapped(module)
    if not is_pretrained(inner):
        raise TypeError(f"save_model writes what from_pretrained reads, for a Hugging Face model; "
                        f"{type(inner).__name__} has no save_pretrained(): use Model.save(path)")
    os.makedirs(directory, exist_ok=True)
    inner.save_pretrained(directory)
    save_processing_class(args, directory)
    return directory
