"""`RunningLoss`: the epoch's sample-weighted loss sum, kept on the device.

A step only appends its (detached) loss to a list; the list is folded into the sum with one
`stack` and one `sum` per batch size every `FOLD_EVERY` steps and whenever the sum is read.
That is one device operation per step fewer than adding each loss as it comes (on a GPU, a
kernel launch saved per step), and never a host read.
"""

from __future__ import annotations

import torch

#: Steps between folds: bounds the list (and the tensors it keeps alive) to this many scalars.
FOLD_EVERY = 64


class RunningLoss:
    """Sum of `loss * batch_size` and of `batch_size` over the steps added so far.

    Example::

        running = RunningLoss(torch.device("cpu"))
        running.add(torch.tensor(0.5), 32)
        running.add(torch.tensor(0.25), 16)
        float(running.total) / running.count  # 0.41666...
    """

    __slots__ = ("_sum", "_pending", "count")

    def __init__(self, device: torch.device):
        self._sum = torch.zeros((), device=device, dtype=torch.float32)
        self._pending: list[tuple[torch.Tensor, int]] = []
        self.count = 0

    def add(self, loss: torch.Tensor, size: int) -> None:
        """Add one batch's mean loss (a scalar tensor; it is detached here) and its sample count."""
        pending = self._pending
        pending.append((loss.detach(), size))
        self.count += size
        if len(pending) >= FOLD_EVERY:
            self._fold()

    @property
    def total(self) -> torch.Tensor:
        """The weighted sum so far, as a 0-dim float32 tensor on the device (no host read)."""
        if self._pending:
            self._fold()
        return self._sum

    def set(self, total: float, count: int) -> None:
        """Start from a saved sum and count (a resumed epoch)."""
        self._pending.clear()
        self._sum.fill_(total)
        self.count = count

    def _fold(self) -> None:
        by_size: dict[int, list[torch.Tensor]] = {}
        for loss, size in self._pending:
            by_size.setdefault(size, []).append(loss)
        self._pending.clear()
        for size, losses in by_size.items():  # usually one size, two with a short last batch
            self._sum.add_(torch.stack(losses).to(self._sum.dtype).sum(), alpha=size)
