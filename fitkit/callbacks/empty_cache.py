"""`EmptyDeviceCache`: HF's `torch_empty_cache_steps`, which `fit` adds when the field is set:
the accelerator's cached memory handed back every `every` optimizer steps (less peak memory, a
little slower; the values computed do not change)::

    model.fit(train, torch_empty_cache_steps=50)   # or args=TrainingArguments(torch_empty_cache_steps=50)
"""

from __future__ import annotations

from fitkit.events.handler import TrainerCallback


class EmptyDeviceCache(TrainerCallback):
    """Empty the CUDA (or XPU, MPS) caching allocator's cache at every `every`-th step's end;
    nothing on a CPU."""

    takes_batch = False  # reads no batch, outputs or loss

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            empty_device_cache()


def empty_device_cache() -> None:
    """`empty_cache()` of the accelerator torch has (nothing on a CPU)."""
    import torch

    for name in ("cuda", "xpu", "mps"):
        backend = getattr(torch, name, None)
        if backend is not None and backend.is_available():
            backend.empty_cache()
            return
