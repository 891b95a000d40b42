"""`eval_dataloader` for in-memory validation data, which fitkit batches without a DataLoader.

Callbacks get the validation loader as the `eval_dataloader` keyword (Hugging Face's); for
tensors (`validation_split`, `validation_data=(x, y)`) that is this view, so `len()` works as
on a DataLoader (the progress bar counts `3/8`, not `3/?`)::

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        total = len(eval_dataloader)     # validation batches on this process
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fitkit.engine.data.batch import as_data
from fitkit.engine.data.sources import DataSource


class LoaderView:
    """The batches of a `DataSource` seen as a DataLoader: `len()` is the number of batches this
    process takes per pass, and iterating yields them as the data would (`(x, y)`,
    `(x, y, sample_weight)` or a dict), on the device where they are kept."""

    def __init__(self, source: DataSource):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Any]:
        return (as_data(batch) for batch in self.source.batches(0))

    def __repr__(self) -> str:
        return f"LoaderView({type(self.source).__name__}, batches={len(self)})"


def eval_loader(val: DataSource | None) -> Any:
    """What callbacks get as `eval_dataloader`: the DataLoader the data came in, a `LoaderView`
    for in-memory data, None without validation data."""
    if val is None:
        return None
    loader = getattr(val, "loader", None)
    if loader is not None:
        return loader
    return LoaderView(val) if val.has_len() else None
