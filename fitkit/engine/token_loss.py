"""The Trainer's token-count loss (transformers' `num_items_in_batch`) under gradient accumulation.

For a model whose `forward` takes loss keywords (`**kwargs`, or `accepts_loss_kwargs = True`),
the label tokens of the whole accumulation window (labels != -100; a causal LM's from the second position on) are counted
before its first forward, summed over the processes under `average_tokens_across_devices`, and
given to every forward of the window as `num_items_in_batch`. The model then divides its summed
loss by them, so the micro-batches' losses are not divided by the window's length again, and
under `average_tokens_across_devices` each process's loss is multiplied by the number of
processes (DDP averages the gradients)::

    tokens = TokenLoss.of(stepper, args)                 # None: not the Trainer face, or no such model
    for batch, items in tokens.windows(batches, start, accum, n_batches):
        loss, out = stepper.forward_backward(batch, cycle, last, items)

The count stays on the device (a sum, and a collective on several processes): no host read.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch

from fitkit.common.wrappers import unwrapped
from fitkit.engine.data.batch import Batch

IGNORE_INDEX = -100


class LossItems(NamedTuple):
    """What a window's forwards get: `tokens` (a device tensor) as `num_items_in_batch`, and the
    factor the loss is multiplied by (the number of processes, or 1)."""

    tokens: torch.Tensor
    scale: int


def accepts_loss_kwargs(module: Any) -> bool:
    """The Trainer's `model_accepts_loss_kwargs`: the module's `accepts_loss_kwargs` when it has
    one, else whether its `forward` takes `**kwargs`."""
    if hasattr(module, "accepts_loss_kwargs"):
        return bool(module.accepts_loss_kwargs)
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):  # a forward without a signature (a builtin)
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def shifts_labels(module: Any) -> bool:
    """The Trainer's `_loss_shifts_labels`: a decoder-only model whose loss is transformers'
    causal-LM loss counts its labels from the second position on."""
    loss_type = getattr(module, "loss_type", None)
    if loss_type is None:
        return False
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    encoder_decoder = getattr(getattr(module, "config", None), "is_encoder_decoder", False)
    return LOSS_MAPPING.get(loss_type) is ForCausalLMLoss and not encoder_decoder


class TokenLoss:
    """Counts each accumulation window's label tokens for one run (see the module's docstring)."""

    def __init__(self, fabric: Any, shift: bool, across_devices: bool) -> None:
        self.fabric, self.shift = fabric, shift
        self.across = across_devices and fabric.world_size > 1  # a collective only where there is another process
        self.scale = fabric.world_size if across_devices else 1  # the Trainer's `num_processes` factor

    @classmethod
    def of(cls, stepper: Any, args: Any) -> TokenLoss | None:
        """The counter of a run whose module computes its own loss (no `loss=`, no `compute_loss`
        override, no label smoothing) and accepts loss keywords; None otherwise."""
        if stepper.loss is not None or stepper.compute_loss is not None or stepper.label_smoothing is not None:
            return None
        module = unwrapped(stepper.module)
        if not accepts_loss_kwargs(module):
            return None
        return cls(stepper.fabric, shifts_labels(module), bool(getattr(args, "average_tokens_across_devices", True)))

    def count(self, window: list[Batch]) -> LossItems | None:
        """The label tokens of `window` (over every process when averaged across them), or None
        when its first batch has no keyword labels (the Trainer counts only a `labels` batch)."""
        first = window[0]
        if not isinstance(first.inputs, dict) or not isinstance(first.target, torch.Tensor):
            return None
        total: Any = 0
        for batch in window:
            labels = batch.inputs.get("shift_labels") if isinstance(batch.inputs, dict) else None
            if labels is None:
                labels = batch.target[..., 1:] if self.shift else batch.target
            total = total + labels.ne(IGNORE_INDEX).sum()
        total = total.to(self.fabric.device)
        if self.across:
            total = self.fabric.all_reduce(total, reduce_op="sum")
        return LossItems(total / 1, self.scale)  # a float tensor, as the Trainer's division leaves it

    def windows(self, batches: Iterable[Batch], start: int, accum: int,
                n_batches: int | None) -> Iterator[tuple[Batch, LossItems | None]]:
        """`batches` with each one's window count: a window (`accum` batches, fewer at the end of
        an epoch of `n_batches`) is read whole before its first batch is handed on, as the
        Trainer's `get_batch_samples` reads it; the same batches, in the same order."""
        it, i = iter(batches), start
        while True:
            size = accum if n_batches is None else min(accum, n_batches - i)
            window = list(itertools.islice(it, max(size, 1)))
            if not window:
                return
            items = self.count(window)
            for batch in window:
                yield batch, items
            i += len(window)
