"""`RunningLoss`: the epoch's sample-weighted loss sum, kept on the device.

A step only appends its (detached) loss to a list; the list is folded into the sum with one
`stack` and one `sum` per batch size every `FOLD_EVERY` steps and whenever the sum is read.
That is one device operation per step fewer than adding each loss as it comes (on a GPU, a
kernel launch saved per step), and never a host read.
"""

from __future__ import annotations

from typing import Any

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


class EpochLoss:
    """The training loss of the epoch under way, over all processes.

    Holds the device-side `RunningLoss` of this process, what the last step log covered (a step
    log reports the mean since the previous one) and the run's total (for `train_loss`). Sums
    over processes are read on the host only when asked: at a log, at the epoch end (once) and
    when a checkpoint is taken.
    """

    def __init__(self, fabric: Any):
        self.fabric = fabric
        self.running = RunningLoss(fabric.device)
        self.logged_loss, self.logged_count = 0.0, 0
        self.run_loss, self.run_count = 0.0, 0
        self._closed: tuple[float, int] | None = None
        self._fresh = True  # `running` has seen nothing yet: the first epoch can keep it

    def new_epoch(self) -> None:
        if not self._fresh:
            self.running = RunningLoss(self.fabric.device)
        self._fresh = False
        self.logged_loss, self.logged_count = 0.0, 0
        self._closed = None

    def totals(self) -> tuple[float, int]:
        """The epoch's loss sum and sample count so far, over all processes."""
        if self._closed is not None:
            return self._closed
        if self.fabric.world_size == 1:
            return float(self.running.total), self.running.count
        total = self.fabric.all_reduce(self._local(), reduce_op="sum").tolist()
        return total[0], int(total[1])

    def close(self) -> None:
        """The epoch ended: read its totals once and add them to the run's."""
        self._closed = self.totals()
        self.run_loss += self._closed[0]
        self.run_count += self._closed[1]

    def mean_since_log(self) -> float | None:
        """The mean loss since the previous step log (None when no sample came since)."""
        total, count = self.totals()
        if count <= self.logged_count:
            return None
        mean = (total - self.logged_loss) / (count - self.logged_count)
        self.logged_loss, self.logged_count = total, count
        return mean

    def run_mean(self) -> float | None:
        return self.run_loss / self.run_count if self.run_count else None

    # -- checkpoints ------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """The sums a mid-epoch checkpoint needs (over all processes, and per process)."""
        total, count = self.totals()
        sums: dict[str, Any] = {"epoch_loss": total, "epoch_count": count, "logged_loss": self.logged_loss,
                                "logged_count": self.logged_count, "by_rank": None}
        if self.fabric.world_size > 1:
            gathered = self.fabric.all_gather(self._local())
            sums["by_rank"] = gathered.reshape(self.fabric.world_size, 2).tolist()
        return sums

    def restore(self, snapshot: Any) -> None:
        """Continue a resumed epoch from a `LoopSnapshot`'s sums."""
        fabric = self.fabric
        self.logged_loss, self.logged_count = snapshot.logged_loss, snapshot.logged_count
        by_rank = snapshot.by_rank
        if by_rank and len(by_rank) == fabric.world_size:  # each process continues its own sums
            self.running.set(by_rank[fabric.global_rank][0], int(by_rank[fabric.global_rank][1]))
        elif fabric.global_rank == 0:  # another world size: count the global sums once
            self.running.set(snapshot.epoch_loss, snapshot.epoch_count)

    def _local(self) -> torch.Tensor:
        count = torch.tensor(float(self.running.count), dtype=torch.float64, device=self.fabric.device)
        return torch.stack([self.running.total.double(), count])
