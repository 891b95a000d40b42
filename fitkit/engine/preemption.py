"""Preemption: SIGTERM (SLURM, Kubernetes) during training asks for a checkpoint and a clean stop.

    preemption = Preemption(fabric, enabled=True)
    with preemption.watching():
        for step in ...:
            ...
            if preemption.due(global_step):   # finish this step, checkpoint, stop
                checkpoint()
                preemption.final = True           # no save after this one
                break

Processes may see the signal at different steps: every `CHECK_STEPS` optimizer steps (the same
steps on every process) they compare notes and stop together once any of them has seen it.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

import torch

logger = logging.getLogger("fitkit")

#: Under several processes, how often (in optimizer steps) they check together for a SIGTERM.
CHECK_STEPS = 10


class Preemption:
    """Catches SIGTERM while a run trains and says when every process should stop."""

    def __init__(self, fabric: Any, enabled: bool):
        self.fabric = fabric
        self.enabled = enabled
        self.every = CHECK_STEPS if enabled and fabric.world_size > 1 else 0
        self.seen = False  # by this process
        self.preempted = False  # agreed: checkpoint and stop at the end of this step
        # The preemption checkpoint is written: it is the last word, no later save of this run
        # (an epoch-end one, say) may record a position past the step it recorded.
        self.final = False

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Install the SIGTERM handler for the block (main thread only), then put back the old one."""
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum, frame) -> None:
        logger.warning("SIGTERM received: finishing this step, then checkpointing and stopping")
        self.seen = True
        if self.fabric.world_size == 1:
            self.preempted = True

    def due(self, global_step: int) -> bool:
        """True when training should checkpoint and stop after this step (on every process)."""
        if self.every and global_step % self.every == 0:
            self.preempted = self._any_process(self.seen)
        return self.preempted

    def _any_process(self, flag: bool) -> bool:
        fabric = self.fabric
        seen = torch.tensor(1.0 if flag else 0.0, device=fabric.device)
        return bool(fabric.all_reduce(seen, reduce_op="max") > 0)
