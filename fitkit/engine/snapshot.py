"""`LoopSnapshot`: where the loop is when a checkpoint is written, and what a resume restores.

    snap = loop.snapshot()                     # epoch 2, 80 samples into it, the sums so far
    payload = {"loop": snap.to_payload(), "rng": rng_state(), ...}    # fabric.save(...)
    LoopSnapshot.from_payload(payload["loop"], rng=payload["rng"], callbacks=...)

The payload is plain values and tensors, so it loads with `weights_only=True`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from fitkit.schedule import steps_per_epoch

#: Fields kept beside the loop's own record in a checkpoint, not inside it.
_BESIDE = ("rng", "callbacks")


@dataclass
class LoopSnapshot:
    """The data position and the running sums of the epoch under way.

    The position is `samples`: how many samples of epoch `epoch`'s order all processes together
    had consumed, so a run with another number of processes or another batch size continues at
    the same sample (None when the data cannot say, e.g. a list of batches, or a checkpoint of
    an older version). `batch` counts the micro-batches each of the `world_size` processes had
    consumed (0 at an epoch boundary; then the sums are zero). `by_rank` holds each process's
    own `(loss sum, count)` under several processes; `epoch_rng` the RNG state when the epoch's
    batches were drawn (for loaders that draw their order from the global RNG). `rng` is the RNG
    state when the checkpoint was written and `callbacks` the saved callback states: a resume
    sets both back.
    """

    epoch: int = 0
    batch: int = 0
    samples: int | None = None
    world_size: int = 1
    epoch_loss: float = 0.0
    epoch_count: int = 0
    logged_loss: float = 0.0
    logged_count: int = 0
    metrics: dict | None = None
    by_rank: list | None = None
    epoch_rng: dict | None = None
    rng: dict | None = None
    callbacks: dict[str, Any] = field(default_factory=dict)

    @property
    def mid_epoch(self) -> bool:
        return self.batch > 0

    def steps_to_end(self, global_step: int, start: int, batches: int, epochs: int, accumulation: int) -> int:
        """`max_steps` of a run by epochs resumed here at `global_step`, in this run's steps: the
        steps left in the resumed epoch (from batch number `start` of `batches`) and in the
        epochs after it. Another number of processes or batch size makes other steps than the
        run that wrote the checkpoint; on the same ones this is the plan of that run."""
        per_epoch = steps_per_epoch(batches, accumulation)
        left = steps_per_epoch(batches - start, accumulation) if self.mid_epoch else per_epoch
        return global_step + left + (epochs - self.epoch - 1) * per_epoch

    def to_payload(self) -> dict[str, Any]:
        """The loop's record for a checkpoint (`rng` and `callbacks` are stored beside it)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _BESIDE}

    @classmethod
    def from_payload(cls, record: dict[str, Any], *, rng: dict | None, callbacks: dict | None) -> "LoopSnapshot":
        """Read a loop record back (keys this version does not know are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)} - set(_BESIDE)
        return cls(**{k: v for k, v in record.items() if k in known}, rng=rng, callbacks=dict(callbacks or {}))
