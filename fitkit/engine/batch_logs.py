"""Keras' logs outside fitkit's logging steps: the running averages a batch-end callback reads,
and the epoch's values after its validation.

Nothing here runs unless a callback asks: `RunningLogs.read` is called by a Keras-style
batch-end method (one host read per batch, however many values and callbacks), and the epoch's
values are put together only when `on_epoch_summary` has listeners::

    logs = loop.running_logs.read("train")     # {"loss": 0.41, "accuracy": 0.87}: this process's
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch


class EvalSums(NamedTuple):
    """An evaluation's running sums after a batch, as the evaluation loop hands them over: the
    loss sum (None without a loss), the samples counted, the metric set and an overridden
    `test_step`'s means (None when unused)."""

    total: Any
    samples: int
    metrics: Any
    means: Any


class RunningLogs:
    """The running averages so far of the epoch under way ("train") or of the evaluation under
    way ("test"), on this process, read from the device in one transfer."""

    def __init__(self, loop: Any):
        # Weak: callbacks keep these logs after the run, and a strong reference back would put
        # the loop (its module and optimizer) in a reference cycle that only a collection frees.
        self._loop = weakref.ref(loop)
        self.eval_sums: EvalSums | None = None  # set by the evaluation loop (`evaluated_batch`)
        self._memo: tuple[str, Any, dict[str, float]] | None = None  # (phase, batch key, logs)
        self._epoch: tuple[tuple[int, float | None], dict[str, float]] | None = None

    @property
    def loop(self) -> Any:
        loop = self._loop()
        if loop is None:
            raise RuntimeError("these running logs belong to a run that has ended: read them while it runs")
        return loop

    def evaluated_batch(self, sums: EvalSums) -> None:
        """The evaluation under way after one more batch (what `read("test")` reads)."""
        self.eval_sums = sums

    def epoch(self) -> dict[str, float]:
        """The training values of the epoch that just ended, over every process: the loss and
        metrics over the epoch, step means, and the learning rate of its last step, as
        `logging_strategy="epoch"` logs them. Read from `on_epoch_end` on (History and the
        Keras-style epoch callbacks do under step logging, which logs no epoch record); put
        together once per epoch however many ask::

            values = running_logs.epoch()   # {"loss": 0.52, "accuracy": 0.81, "learning_rate": 0.001}
        """
        loop = self.loop
        key = (loop.state.global_step, loop.state.epoch)
        if self._epoch is None or self._epoch[0] != key:
            logs = training_values(loop, lone_metrics=False)
            logs["learning_rate"] = loop.logged_learning_rate()
            self._epoch = (key, logs)
        return dict(self._epoch[1])

    def samples(self) -> int:
        """Samples this process trained on so far in the epoch (a host count: no device read)."""
        return self.loop.loss.running.count

    def tokens(self) -> int:
        """`input_ids` tokens this process trained on so far in the epoch (counted from shapes)."""
        return getattr(self.loop, "epoch_tokens", 0)

    def read(self, phase: str) -> dict[str, float]:
        """The running averages of `phase` now. Read from the device once per batch however many
        callbacks ask: they share the dict, as Keras' callbacks share a batch's logs."""
        loop = self.loop
        # What changes from one batch to the next: the step and the samples counted (training),
        # the evaluation's per-batch sums (held here, so compared by identity).
        key: Any = (loop.state.global_step, loop.loss.running.count) if phase == "train" else self.eval_sums
        memo = self._memo
        if memo is not None and memo[0] == phase and (memo[1] == key if phase == "train" else memo[1] is key):
            return memo[2]
        logs = self._read_now(phase)
        self._memo = (phase, key, logs)
        return logs

    def _read_now(self, phase: str) -> dict[str, float]:
        loop = self.loop
        if phase == "train":
            running = loop.loss.running
            loss = (running.total, running.count) if running.count else None
            return _read(loss, loop.train_metrics, loop.step_means, strip="")
        if self.eval_sums is None:
            return {}
        total, count, metrics, means = self.eval_sums
        loss = (total, count) if count and total is not None else None
        return _read(loss, metrics, means, strip="val_")


def _read(loss: tuple[torch.Tensor, int] | None, metrics: Any, means: Any, strip: str) -> dict[str, float]:
    names: list[str] = []
    values: list[torch.Tensor] = []
    if loss is not None:
        names.append("loss")
        values.append(loss[0].detach().double() / loss[1])
    for name, value in (metrics.results().items() if metrics else ()):  # names without the set's prefix
        names.append(name[len(strip):] if strip and name.startswith(strip) else name)
        values.append(torch.as_tensor(value).detach().double().reshape(()))
    for name, total in (means.sums.items() if means else ()):
        names.append(name)
        values.append(total.double() / max(means.counts[name], 1))
    if not values:
        return {}
    device = values[0].device
    numbers = torch.stack([v.to(device) for v in values]).tolist()  # the one host read
    return dict(zip(names, numbers))


def training_values(loop: Any, lone_metrics: bool = True) -> dict[str, float]:
    """The epoch's training values over every process: the loss and metrics over the epoch and
    the means of what an overridden `train_step` returned (metrics without a loss only when
    `lone_metrics`: Keras' epoch logs have them, fitkit's epoch record does not)."""
    logs: dict[str, float] = {}
    total, count = loop.loss.totals()  # read once at the epoch's end already
    if count:
        logs["loss"] = total / count
    if loop.train_metrics and (count or lone_metrics):
        logs.update(loop.train_metrics.compute())
    if loop.step_means:
        logs.update(loop.step_means.compute(loop.fabric))
    return logs


def epoch_values(loop: Any) -> dict[str, float]:
    """The epoch's values as Keras' `on_epoch_end` has them: the training loss and metrics over
    the epoch, then the validation values of the epoch's last evaluation (`val_`)."""
    logs = training_values(loop)
    logs.update(loop.epoch_validation or {})
    return logs
