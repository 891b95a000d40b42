"""HF's `include_num_input_tokens_seen`: the input tokens the training steps read, counted as the
Trainer counts them (the main input's elements, or with "non_padding" its attention mask's sum),
summed over the processes only when a record is logged::

    tokens = TokensSeen.of(args, module, fabric, already=state.num_input_tokens_seen)  # None for "no"
    tokens.add(batch.inputs)        # every micro-batch: a shape (or a device sum), no host read
    tokens.record(logs, started)    # at a log: num_input_tokens_seen (and, for training, the speed)
"""

from __future__ import annotations

import time
from typing import Any

from fitkit.events.hf_view import speed_metrics


class TokensSeen:
    """The run's count of input tokens (`already`: the count a resumed run had reached)."""

    def __init__(self, fabric: Any, key: str, non_padding: bool, already: int = 0) -> None:
        self.fabric, self.key, self.non_padding, self.already = fabric, key, non_padding, already
        self.elements = 0  # host count of this process's elements since the run (re)started
        self.masked: Any = None  # device sum of attention masks ("non_padding")

    @classmethod
    def of(cls, args: Any, module: Any, fabric: Any, already: int = 0) -> TokensSeen | None:
        mode = getattr(args, "include_num_input_tokens_seen", "no")
        if mode in ("no", False, None):
            return None
        key = getattr(module, "main_input_name", "input_ids")
        return cls(fabric, key, mode == "non_padding", already)

    def add(self, inputs: Any) -> None:
        if not isinstance(inputs, dict) or self.key not in inputs:
            return
        mask = inputs.get("attention_mask") if self.non_padding else None
        if mask is None:
            self.elements += inputs[self.key].numel()
        else:
            total = mask.sum()
            self.masked = total if self.masked is None else self.masked + total

    def session(self) -> int:
        """Every process's tokens since this run (re)started (one collective with several)."""
        local = self.elements + (int(self.masked) if self.masked is not None else 0)
        if self.fabric.world_size == 1:
            return local
        import torch

        counts = torch.tensor([local], device=self.fabric.device, dtype=torch.int64)
        return int(self.fabric.all_reduce(counts, reduce_op="sum").sum().item())

    def record(self, logs: dict[str, Any], state: Any, started: float | None = None) -> None:
        """Add `num_input_tokens_seen` to a log record (as the Trainer's `log` does, after
        `epoch`), and for a training record (`started`: when training started) the Trainer's
        `train_runtime` and `train_tokens_per_second` since then."""
        session = self.session()
        state.num_input_tokens_seen = self.already + session
        logs["num_input_tokens_seen"] = state.num_input_tokens_seen
        if started is not None:
            logs.update(speed_metrics("train", time.perf_counter() - started, tokens=session))
