"""`CSVLogger`: write one row per epoch to a CSV file (Keras)."""

from __future__ import annotations

import csv
import os
from typing import IO, TYPE_CHECKING, Any

from fitkit.callbacks._run import EpochRecordsCallback, epoch_index, rate_varies
from fitkit.common.logs import LEARNING_RATE, as_number
from fitkit.events.handler import Order

if TYPE_CHECKING:
    from _csv import Writer


class CSVLogger(EpochRecordsCallback):
    """Stream each epoch's values to `filename`: one row per epoch, flushed as it is written.

    A row merges everything the epoch logged: the training loss and metrics and the validation
    values (`val_loss`, ...), plus `learning_rate` when the rate varies in the run (the rule
    `History` follows, as in Keras 3: a scheduler steps it or a callback such as
    `ReduceLROnPlateau` changes it). The columns are `epoch` (0-based, as Keras) then the names
    of the first row in sorted order; when the run evaluates but the first row has no `val_`
    values (evaluation every few epochs), the `val_` columns are added for you.
    A value an epoch did not log is written as `NA`. The row is written once the epoch's
    records are complete (after its end-of-epoch evaluation, see `ModelCheckpoint`).

    Args:
        filename: the CSV file (folders are created).
        separator: the field separator.
        append: continue an existing file (its header is kept and its columns are used)
            instead of overwriting it.

    Only the world-zero process writes; the file is opened at the run's first row and closed at
    `on_train_end`. `state()` / `load_state()` hold the number of rows written and the columns:
    after `load_state` (before a `fit`, or during it as a resumed run does) the file is
    continued after those rows, and rows written after the checkpoint was taken are cut.

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import CSVLogger

        x, y = torch.randn(128, 4), torch.randint(0, 2, (128,))
        model = Model(torch.nn.Linear(4, 2)).compile("adam", "cross_entropy", ["accuracy"])
        model.fit(x, y, epochs=3, validation_split=0.25, callbacks=[CSVLogger("training.csv")], verbose=0)
        print(open("training.csv").read())
        # epoch,accuracy,loss,val_accuracy,val_loss
        # 0,0.53125,0.001,0.71...
    """

    order = Order.LOGGER  # after callbacks that add values to the logs, before the progress display

    def __init__(self, filename: str | os.PathLike, separator: str = ",", append: bool = False) -> None:
        self.filename = os.fspath(filename)
        if not self.filename:
            raise ValueError("CSVLogger: `filename` is empty; pass a file name such as 'training.csv'")
        if not isinstance(separator, str) or len(separator) != 1:
            raise ValueError(f"CSVLogger: `separator`={separator!r} is invalid; pass one character such as ',' or ';'")
        super().__init__()
        self.sep = separator
        self.append = bool(append)
        self.columns: list[str] | None = None
        self.epochs_written = 0
        self._file: IO[str] | None = None
        self._writer: Writer | None = None
        self._evaluates = False
        self._active = False
        self._continue_file = False  # a loaded state: continue the file after its rows
        self._show_rate = False  # `learning_rate` is a column (see `rate_varies`)

    # -- file ----------------------------------------------------------------------------------
    def _read_existing(self) -> tuple[list[str] | None, list[str]]:
        """(header columns or None, data lines) of the existing file."""
        if not os.path.isfile(self.filename):
            return None, []
        with open(self.filename, newline="", encoding="utf-8") as f:
            lines = f.read().splitlines(keepends=True)
        if not lines or not lines[0].strip():
            return None, []
        header = next(csv.reader([lines[0]], delimiter=self.sep))
        return header[1:] if header and header[0] == "epoch" else header, lines[1:]

    def _open(self) -> None:
        """Open the file for the first row of a run (lazily, so a resumed run's `load_state`,
        which comes after `on_train_begin`, is known before the file is touched)."""
        directory = os.path.dirname(os.path.abspath(self.filename))
        os.makedirs(directory, exist_ok=True)
        if self._continue_file:
            # continue after the rows a checkpoint knew of; drop rows written after it
            header, rows = self._read_existing()
            keep = rows[: self.epochs_written]
            self.columns = self.columns or header
            with open(self.filename, "w", newline="", encoding="utf-8") as f:
                if self.columns is not None:
                    csv.writer(f, delimiter=self.sep).writerow(["epoch", *self.columns])
                f.writelines(keep)
            self.epochs_written = len(keep)
            mode = "a"
        else:
            mode = "a" if self.append else "w"  # the columns and row count were read at on_train_begin
        self._continue_file = False
        self._file = open(self.filename, mode, newline="", encoding="utf-8")  # noqa: SIM115 - open for the run, closed by _close
        self._writer = csv.writer(self._file, delimiter=self.sep)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._writer = None, None

    @staticmethod
    def _cell(value: Any) -> Any:
        if value is None:
            return "NA"
        number = as_number(value)
        return number if number is not None else value

    def _write(self, record: dict | None, state) -> None:
        if record is None or not self._active:
            return
        if self._writer is None:
            self._open()
        assert self._writer is not None and self._file is not None  # opened for the run by `_open`
        if self.columns is None:
            keys = sorted(k for k in record if self._show_rate or k != LEARNING_RATE)
            if self._evaluates and not any(k.startswith("val_") for k in keys):
                keys += [f"val_{k}" for k in keys if k != LEARNING_RATE]
            self.columns = keys
            self._writer.writerow(["epoch", *keys])
        self._writer.writerow([epoch_index(state), *(self._cell(record.get(k)) for k in self.columns)])
        self._file.flush()
        self.epochs_written += 1

    # -- events --------------------------------------------------------------------------------
    def reset(self) -> None:
        """A new file (or, with `append`, the end of the existing one) at the start of a run."""
        self.columns, self.epochs_written = None, 0
        if self.append and self._active:
            header, rows = self._read_existing()
            if header is not None:
                self.columns, self.epochs_written = header, len(rows)

    def on_train_begin(self, args, state, control, **kwargs):
        self._evaluates = getattr(args, "eval_strategy", "no") not in (None, "no")
        self._show_rate = rate_varies(kwargs.get("lr_scheduler"), kwargs.get("callbacks"))
        self._close()
        self._active = state.is_world_process_zero
        super().on_train_begin(args, state, control, **kwargs)  # reset(), unless a state was just loaded

    def epoch_done(self, record: dict, args, state, control, **kwargs):
        self._write(record, state)
        return None

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)  # the last row, if still open
        self._close()
        self._active = self._continue_file = False

    # -- checkpoint state ---------------------------------------------------------------------------
    def state(self) -> dict:
        """The rows written so far and the columns, as a JSON-able dict."""
        return {"epochs_written": self.epochs_written, "columns": self.columns}

    def load_state(self, state: dict) -> None:
        """Restore from `state()`: the next `fit` continues the file after those rows."""
        self.epochs_written = int(state.get("epochs_written", 0))
        columns = state.get("columns")
        self.columns = list(columns) if columns is not None else None
        self._continue_file = True
        self._mark_restored()

    def __repr__(self) -> str:
        return f"CSVLogger(filename={self.filename!r}, separator={self.sep!r}, append={self.append})"
