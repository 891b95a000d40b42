"""`RunningLoss`: the epoch's sample-weighted loss sum, kept on the device.

A step only appends its (detached) loss to a list; every `FOLD_EVERY` steps of the epoch the
list is folded into the sum with one `stack` and one `sum` per batch size. That is one device
operation per step fewer than adding each loss as it comes (on a GPU, a kernel launch saved per
step), and never a host read.

The folds fall on fixed steps of the epoch, whatever reads the sum in between: a read (a log, a
checkpoint) adds what is pending to a copy. Float addition is not associative, so folding at a
read would make the logged losses depend on when checkpoints were written; this way a run
logs the same bits with or without checkpoints, and a resumed run (which gets the pending
losses back from the checkpoint) the same bits as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
        self._pending: list[tuple[torch.Tensor, float]] = []
        self.count: float = 0  # samples (or a tracker's weights: `EpochLoss.hold`)

    def add(self, loss: torch.Tensor, size: float) -> None:
        """Add one batch's mean loss (a scalar tensor; it is detached here) and its sample count."""
        pending = self._pending
        pending.append((loss.detach(), size))
        self.count += size
        if len(pending) >= FOLD_EVERY:
            _fold_into(self._sum, pending)
            pending.clear()

    @property
    def total(self) -> torch.Tensor:
        """The weighted sum so far, as a 0-dim float32 tensor on the device (no host read).
        Reading it changes nothing: what is pending is added to a copy."""
        if not self._pending:
            return self._sum
        return _fold_into(self._sum.clone(), self._pending)

    def parts(self) -> tuple[torch.Tensor, list[tuple[torch.Tensor, float]]]:
        """The folded sum and the `(loss, size)` pairs not folded yet (what a checkpoint keeps)."""
        return self._sum, list(self._pending)

    def set(self, total: float, count: float, pending: Iterable[tuple[float, float]] = ()) -> None:
        """Start from a saved sum and count (a resumed epoch), and the losses that were still
        pending then (so the next folds fall on the same steps as in the first run)."""
        self._sum.fill_(total)
        device = self._sum.device
        # float64 holds any saved loss dtype exactly; `_fold_into` casts as the first run did
        self._pending = [(torch.tensor(loss, dtype=torch.float64, device=device), int(size))
                         for loss, size in pending]
        self.count = count
        if len(self._pending) >= FOLD_EVERY:  # saved by a version that folded less often
            _fold_into(self._sum, self._pending)
            self._pending.clear()


def _fold_into(total: torch.Tensor, pending: list[tuple[torch.Tensor, float]]) -> torch.Tensor:
    """Add the pending losses to `total` in place, one `stack` and `sum` per batch size."""
    by_size: dict[float, list[torch.Tensor]] = {}
    for loss, size in pending:
        by_size.setdefault(size, []).append(loss)
    for size, losses in by_size.items():  # usually one size, two with a short last batch
        total.add_(torch.stack(losses).to(total.dtype).sum(), alpha=size)
    return total


class EpochLoss:
    """The training loss of the epoch under way, over all processes.

    Holds the device-side `RunningLoss` of this process, what the last step log covered (a step
    log reports the mean since the previous one) and the run's total (for `train_loss`). Sums
    over processes are read on the host only when asked: at a log, at the epoch end (once) and
    when a checkpoint is taken.

    `per_step=True` is HF's Trainer log: the loop adds each micro-batch with weight 1 (the mean
    of the steps' losses, not of the samples'), and the steps of an epoch after its last log are
    carried into the next epoch's first log (`carried`), as the Trainer's running loss is.
    """

    def __init__(self, fabric: Any, per_step: bool = False):
        self.fabric = fabric
        self.per_step = per_step
        self.carried: tuple[float, float] = (0.0, 0)  # per_step: the previous epochs' sums not logged yet
        self.running = RunningLoss(fabric.device)
        self.logged_loss, self.logged_count = 0.0, 0.0
        self.run_loss, self.run_count = 0.0, 0.0
        self._closed: tuple[float, float] | None = None
        self._fresh = True  # `running` has seen nothing yet: the first epoch can keep it
        self._since_log: torch.Tensor | None = None  # `nan_inf_filtered`: the steps' sum since the last log

    def new_epoch(self) -> None:
        if self.per_step and self._closed is not None:
            total, count = self._closed
            self.carried = (self.carried[0] + total - self.logged_loss, self.carried[1] + count - self.logged_count)
        if not self._fresh:
            self.running = RunningLoss(self.fabric.device)
        self._fresh = False
        self.logged_loss, self.logged_count = 0.0, 0
        self._closed = None

    def hold(self, loss: torch.Tensor, size: float) -> None:
        """A running loss (a custom step's `keras.metrics.Mean` tracker): the epoch's loss is the
        last value given, as Keras logs it, not a mean of running means."""
        self.running = RunningLoss(self.fabric.device)
        self.running.add(loss, size)
        self.logged_loss, self.logged_count = 0.0, 0  # a step log reports the value itself

    def totals(self) -> tuple[float, float]:
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
        carried_loss, carried_count = self.carried
        if count + carried_count <= self.logged_count:
            return None
        mean = (total - self.logged_loss + carried_loss) / (count - self.logged_count + carried_count)
        self.logged_loss, self.logged_count = total, count
        self.carried = (0.0, 0)
        self._since_log = None
        return mean

    def nan_inf_filtered(self, steps_since_log: Callable[[], int]) -> Callable[[torch.Tensor, float], None]:
        """HF's `logging_nan_inf_filter` (`per_step`): an `add` that takes a nan or inf step loss
        as the sum of the steps' losses since the last log over `1 + steps_since_log()`, as the
        Trainer does; on the device (a `where`, no host read)."""
        keep = self.nan_inf_filter(steps_since_log)

        def add(loss: torch.Tensor, size: float) -> None:
            self.running.add(keep(loss), size)

        return add

    def nan_inf_filter(self, steps_since_log: Callable[[], int]) -> Callable[[torch.Tensor], torch.Tensor]:
        """The filter of `nan_inf_filtered` alone: a micro-batch's loss, or in its place when nan or
        inf the losses since the last log over `1 + steps_since_log()` (the Trainer filters each
        micro-batch of an accumulation window so); what it returns counts as added since the log."""
        def keep(loss: torch.Tensor) -> torch.Tensor:
            loss = loss.detach()
            since = self._since_log if self._since_log is not None else torch.zeros_like(loss, dtype=torch.float32)
            kept = torch.where(torch.isfinite(loss), loss, since / (1 + steps_since_log()))
            self._since_log = since + kept
            return kept

        return keep

    def unlogged(self) -> tuple[float, float]:
        """`per_step`: the sums of the closed epochs' steps after their last log, which the next
        log covers (what a checkpoint keeps as `carried_loss`, `carried_count`)."""
        if not self.per_step:
            return 0.0, 0
        if self._closed is None:
            return self.carried
        total, count = self._closed
        return self.carried[0] + total - self.logged_loss, self.carried[1] + count - self.logged_count

    def run_mean(self) -> float | None:
        return self.run_loss / self.run_count if self.run_count else None

    # -- checkpoints ------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """The sums a mid-epoch checkpoint needs: over all processes, and per process
        (`by_rank[r]` = `[sum, count, folded sum, pending losses, their batch sizes]`)."""
        total, count = self.totals()
        mine = self._rank_record()
        if self.fabric.world_size > 1:
            gathered = self.fabric.all_gather(mine).reshape(self.fabric.world_size, -1)
            by_rank = [_decode(row) for row in gathered.tolist()]
        else:
            by_rank = [_decode(mine.tolist())]
        return {"epoch_loss": total, "epoch_count": count, "logged_loss": self.logged_loss,
                "logged_count": self.logged_count, "by_rank": by_rank, "carried_loss": self.carried[0],
                "carried_count": self.carried[1]}

    def restore(self, snapshot: Any) -> None:
        """Continue a resumed epoch from a `LoopSnapshot`'s sums."""
        fabric = self.fabric
        self.logged_loss, self.logged_count = snapshot.logged_loss, snapshot.logged_count
        by_rank = snapshot.by_rank
        if by_rank and len(by_rank) == fabric.world_size:  # each process continues its own sums
            total, count, *parts = by_rank[fabric.global_rank]
            if parts:  # the folded sum and what was pending: later folds fall as in the first run
                folded, losses, sizes = parts
                self.running.set(folded, int(count), zip(losses, sizes))
            else:  # a checkpoint of an older version
                self.running.set(total, int(count))
        elif fabric.global_rank == 0:  # another world size: count the global sums once
            self.running.set(snapshot.epoch_loss, snapshot.epoch_count)

    def _local(self) -> torch.Tensor:
        count = torch.tensor(float(self.running.count), dtype=torch.float64, device=self.fabric.device)
        return torch.stack([self.running.total.double(), count])

    def _rank_record(self) -> torch.Tensor:
        """This process's sums as one float64 vector of a fixed length (for `all_gather`):
        sum, count, folded sum, number pending, the pending losses, their sizes (zero-padded)."""
        folded, pending = self.running.parts()
        record = torch.zeros(4 + 2 * FOLD_EVERY, dtype=torch.float64, device=self.fabric.device)
        record[:2] = self._local()
        record[2] = folded.double()
        record[3] = len(pending)
        if pending:
            n = len(pending)
            record[4:4 + n] = torch.stack([loss.double() for loss, _ in pending])
            record[4 + FOLD_EVERY:4 + FOLD_EVERY + n] = torch.tensor([float(s) for _, s in pending],
                                                                    dtype=torch.float64)
        return record


class WindowLoss:
    """The Trainer's step loss under gradient accumulation (`per_step`): the sum of the window's
    micro-batch losses, each divided by the window's length unless token-counted (the module
    divided it by the window's label tokens), each through `keep` (`logging_nan_inf_filter`)
    first, added to the epoch's running sum once, at the window's last micro-batch::

        window = WindowLoss(epoch_loss, keep=None)
        window.add(loss, micro=1, cycle=2, counted=False); window.add(loss, micro=2, cycle=2, counted=False)
    """

    __slots__ = ("epoch_loss", "keep", "total")

    def __init__(self, epoch_loss: EpochLoss, keep: Callable[[torch.Tensor], torch.Tensor] | None) -> None:
        self.epoch_loss, self.keep = epoch_loss, keep
        self.total: torch.Tensor | None = None

    def add(self, loss: torch.Tensor, micro: int, cycle: int, counted: bool) -> None:
        """Micro-batch `micro` (from 1) of a window of `cycle`."""
        part = loss.detach() if counted else loss.detach() / cycle
        if self.keep is not None:  # the Trainer filters each micro-batch's loss
            part = self.keep(part)
        self.total = part if micro == 1 or self.total is None else self.total + part
        if micro == cycle:
            self.epoch_loss.running.add(self.total, 1)


def _decode(row: list[float]) -> list[Any]:
    n = int(row[3])
    sizes = [int(s) for s in row[4 + FOLD_EVERY:4 + FOLD_EVERY + n]]
    return [row[0], int(row[1]), row[2], row[4:4 + n], sizes]
