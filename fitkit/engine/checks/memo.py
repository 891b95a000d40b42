"""What was checked already: in-memory data known by its tensors' identity, so that a loop of
short fits or a search's trials check the same data once.

    memo = CheckMemo()
    trial_memo = memo.sharing()   # a search's next trial: the data's values are not read again
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.adapters.losses import LOSS_KINDS
from fitkit.common.tensors import tensors_of
from fitkit.engine.checks.names import _named
from fitkit.engine.data.batch import Batch
from fitkit.engine.data.sources import DataSource, TensorSource


class CheckMemo:
    """The in-memory sources already checked against a module, loss and metrics, so that calling
    `fit` again on the same tensors (a loop of short fits, a search) checks nothing again. A
    source is known by its tensors' storage, shape, dtype and version counter (an in-place
    change is a new version); the tensors are kept referenced, so their memory is not reused.

    What depends on the data alone (the first batch and the values read from it, by the kind of
    loss) is kept apart, in `firsts`, which the memos of a search's trials share (`sharing`):
    each trial's new module is checked, its data's values are not read again."""

    SIZE = 8

    def __init__(self, firsts: dict[tuple, tuple[Batch, dict[str, float], list]] | None = None,
                 passed: dict[tuple, list] | None = None) -> None:
        self._seen: dict[tuple, list] = {}
        self.firsts = firsts if firsts is not None else {}
        # The first steps whose output checks passed: by data, loss, metrics and the outputs'
        # structure, shapes (less the batch) and dtypes, which is all those checks look at.
        self.passed = passed if passed is not None else {}

    def sharing(self) -> CheckMemo:
        """A new memo (nothing checked against a module) sharing this one's data values and the
        first steps that passed: a search's next trial, whose module gives outputs of the same
        shapes on the same data, runs its first step with no check but the loss value's."""
        return CheckMemo(self.firsts, self.passed)

    def keep_passed(self, key: tuple, leaves: list) -> None:
        # the data's tensors are kept referenced, so their addresses in the key stay theirs
        _bounded_put(self.passed, key, leaves, 4 * self.SIZE)

    def first(self, source: DataSource, loss: Any,
              data: tuple | None = None) -> tuple[tuple | None, tuple[Batch, dict[str, float]] | None]:
        """The key of `source`'s first batch read for `loss` (None: not in-memory data), and the
        (batch, values) kept for it (None: not read yet). `data`: `self.data(source)` if read."""
        key = self.key(source, LOSS_KINDS.get((loss if isinstance(loss, str) else _named(loss)) or ""), data=data)
        if key is None:
            return None, None
        kept = self.firsts.get(key[0])
        return key, (kept[0], kept[1]) if kept is not None else None

    def keep_first(self, key: tuple | None, batch: Batch, stats: dict[str, float]) -> None:
        if key is not None:
            _bounded_put(self.firsts, key[0], (batch, stats, key[1]), self.SIZE)

    def key(self, source: DataSource, *parts: Any, data: tuple | None = None) -> tuple | None:
        data = data if data is not None else self.data(source)
        if data is None:
            return None
        return (*parts, *data[0]), data[1]

    @staticmethod
    def data(source: DataSource) -> tuple | None:
        """What identifies in-memory data (None for any other source): its place and its tensors'
        storage, shape, dtype and version, with the tensors themselves (kept referenced)."""
        if not isinstance(source, TensorSource):
            return None
        leaves = tensors_of((source.x, source.y, source.sample_weight, source.class_weight))
        place = (source.name, source.batch_size, source.offset, source.rank, source.world_size)
        return (place, _identity(leaves)), leaves

    def seen(self, key: tuple | None) -> bool:
        return key is not None and key[0] in self._seen

    def add(self, key: tuple | None) -> None:
        if key is not None:
            _bounded_put(self._seen, key[0], key[1], self.SIZE)


def _bounded_put(table: dict, key: Any, value: Any, size: int) -> None:
    """`table[key] = value`, the oldest entry dropped first when `table` holds `size` already (its
    keys listed first: a search's trials may run in threads)."""
    for oldest in list(table)[:1] if len(table) >= size else ():
        table.pop(oldest, None)
    table[key] = value


def _identity(tensors: list[torch.Tensor]) -> tuple:
    """What tells tensors apart without reading them: storage, shape, strides, dtype, device and
    version counter (an in-place change is a new version)."""
    return tuple((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t._version) for t in tensors)

