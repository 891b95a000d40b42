"""`LoopSnapshot`: where the loop is when a checkpoint is written, and what a resume restores.

    snap = loop.snapshot()                     # epoch 2, 5 batches into it, the sums so far
    payload = {"loop": snap.to_payload(), "rng": rng_state(), ...}    # fabric.save(...)
    LoopSnapshot.from_payload(payload["loop"], rng=payload["rng"], callbacks=...)

The payload is plain values and tensors, so it loads with `weights_only=True`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: Fields kept beside the loop's own record in a checkpoint, not inside it.
_BESIDE = ("rng", "callbacks")


@dataclass
class LoopSnapshot:
    """The data position and the running sums of the epoch under way.

    `batch` counts the micro-batches the epoch `epoch` had consumed (0 at an epoch boundary;
    then the sums are zero). `by_rank` holds each process's own `(loss sum, count)` under
    several processes; `epoch_rng` the RNG state when the epoch's batches were drawn (for
    loaders that draw their order from the global RNG). `rng` is the RNG state when the
    checkpoint was written and `callbacks` the saved callback states: a resume sets both back.
    """

    epoch: int = 0
    batch: int = 0
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

    def to_payload(self) -> dict[str, Any]:
        """The loop's record for a checkpoint (`rng` and `callbacks` are stored beside it)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _BESIDE}

    @classmethod
    def from_payload(cls, record: dict[str, Any], *, rng: dict | None, callbacks: dict | None) -> "LoopSnapshot":
        """Read a loop record back (keys this version does not know are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)} - set(_BESIDE)
        return cls(**{k: v for k, v in record.items() if k in known}, rng=rng, callbacks=dict(callbacks or {}))
