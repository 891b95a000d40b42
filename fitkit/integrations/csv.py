"""`CSVStepLogger` (`report_to="csv"`): one CSV row per `on_log` record.

Unlike the Keras-style `fitkit.callbacks.CSVLogger` (one row per epoch), this writes every
record the run logs: step-level training losses, evaluations, the epoch averages.
"""

from __future__ import annotations

import csv
import os
import tempfile
from typing import IO, Any

from fitkit.common.urls import local_dir
from fitkit.integrations._common import TrackingCallback


class CSVStepLogger(TrackingCallback):
    """Writes every `on_log` record as a row of `filename` (default `args.output_dir/logs.csv`).

    The columns are `step` then every key seen so far, in the order first seen. When a
    record brings a new key, the file is rewritten with the wider header (to a temporary
    file, then renamed over the old one, so a reader never sees half a file); otherwise the
    row is appended and flushed. Values that are not numbers are written as text. A resumed
    run starts the file again from the restored `state.log_history`.

    Example::

        model.fit(x, y, report_to="csv", output_dir="out")   # out/logs.csv
        model.fit(x, y, callbacks=[CSVStepLogger("steps.csv")], logging_strategy="steps")
    """

    numbers_only = False

    def __init__(self, filename: str | os.PathLike | None = None, separator: str = ",") -> None:
        super().__init__()
        self.filename = None if filename is None else os.fspath(filename)
        self.separator = separator
        self.path: str | None = None
        self._rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._file: IO[str] | None = None
        self._writer: csv.DictWriter[str] | None = None

    # -- file handling -----------------------------------------------------------------------
    def _rewrite(self) -> None:
        """Write header and all rows to a temporary file, then rename it over `path`."""
        self._close_file()
        assert self.path is not None  # set by `setup`
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".logs-", suffix=".csv.tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=self._columns, delimiter=self.separator, restval="")
                writer.writeheader()
                writer.writerows(self._rows)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        self._open_for_append()

    def _open_for_append(self) -> None:
        assert self.path is not None  # set by `setup`
        self._file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        self._writer = csv.DictWriter(self._file, fieldnames=self._columns, delimiter=self.separator, restval="")

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._writer = None

    # -- TrackingCallback ------------------------------------------------------------------------
    def setup(self, args, state, model) -> None:
        self.path = self.filename or os.path.join(local_dir(args.output_dir), "logs.csv")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._rows, self._columns = [], []
        if state.global_step > 0:  # resumed: the records before the checkpoint come first
            for record in state.log_history:
                if record.get("step", 0) <= state.global_step and "stopped" not in record:
                    self._add_row(record)
        self._columns = self._columns or ["step"]
        self._rewrite()

    def _add_row(self, row: dict[str, Any]) -> bool:
        """Keep `row`; True when it brought new columns."""
        row = {"step": row.get("step"), **{k: v for k, v in row.items() if k != "step"}}
        new = [k for k in row if k not in self._columns]
        self._columns.extend(new)
        self._rows.append(row)
        return bool(new)

    def write(self, values: dict[str, Any], step: int, state) -> None:
        row = {"step": step, **values}
        if self._rows and self._rows[-1].get("step") == step and set(values) <= self._pending_late:
            # values added to the final record at train end: complete that row
            self._rows[-1].update(values)
            new = [k for k in values if k not in self._columns]
            self._columns.extend(new)
            self._rewrite()
            return
        if self._add_row(row):
            self._rewrite()
        else:
            assert self._writer is not None and self._file is not None  # opened by `setup`'s `_rewrite`
            self._writer.writerow(self._rows[-1])
            self._file.flush()

    _pending_late: frozenset = frozenset()

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self._active:
            self._pending_late = frozenset(self._late_additions(state))
        try:
            return super().on_train_end(args, state, control, model=model, **kwargs)
        finally:
            self._pending_late = frozenset()

    def close(self, args, state, final, model) -> None:
        self._close_file()
