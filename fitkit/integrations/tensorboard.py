"""`TensorBoardCallback` (`report_to="tensorboard"`): scalars and hyperparameters for TensorBoard.

Uses `torch.utils.tensorboard.SummaryWriter`, which needs the `tensorboard` package
(`pip install "fitkit[tensorboard]"`); it is imported when training starts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fitkit.common.urls import local_dir
from fitkit.integrations._common import FINISHED, TrackingCallback, require, run_params, trial_label

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardCallback(TrackingCallback):
    """Sends every `on_log` record to TensorBoard, one scalar per value at `state.global_step`
    (values that are not numbers are dropped with one warning), and at train end the
    hyperparameters (`args.to_sanitized_dict()`, secrets masked, plus the trial's parameters
    in a search) with the final value of every metric for the HParams dashboard.

    `log_dir` defaults to `args.logging_dir`, else `args.output_dir/runs`; during a hyperparameter search each trial's
    `output_dir` is already its own (`run-N`), and an explicit `log_dir` gets the trial's name
    appended. `tb_writer` takes a ready `SummaryWriter` (flushed at train end, not closed).

    Resumed from a checkpoint, the run writes into the log directory of the checkpoint's run
    (unless `log_dir` or `args.logging_dir` names one) with `purge_step` set to the checkpoint's
    step: what the interrupted run logged from there on is hidden, and logged again once (the
    checkpoint step's records from its log history, the later ones as the resume replays them).
    The hyperparameters are written when training ends (not when it fails or is preempted),
    so a resumed run holds them once.

    Example::

        model.fit(x, y, validation_split=0.1, report_to="tensorboard", output_dir="out")
        # tensorboard --logdir out/runs
    """

    def __init__(self, log_dir: str | os.PathLike | None = None, tb_writer: Any = None) -> None:
        super().__init__()
        if tb_writer is None:
            require("tensorboard")
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.tb_writer = tb_writer
        self.writer: SummaryWriter | None = None
        self._owns_writer = False
        self._tags: set[str] = set()
        self._dir: str | None = None

    def _resolve_log_dir(self, args, state) -> str:
        if self.log_dir is None:
            saved = (self.resumed_run or {}).get("log_dir")
            if not (saved and os.path.isdir(saved)):  # moved with output_dir: the new place then
                saved = None
            return getattr(args, "logging_dir", None) or saved or os.path.join(local_dir(args.output_dir), "runs")
        label = trial_label(args, state)
        return os.path.join(self.log_dir, label) if label else self.log_dir

    def setup(self, args, state, model) -> None:
        self._tags = set()
        if self.tb_writer is not None:
            self.writer, self._owns_writer = self.tb_writer, False
            return
        from torch.utils.tensorboard import SummaryWriter

        self._dir = log_dir = self._resolve_log_dir(args, state)
        step = state.global_step
        # A resumed run hides what an interrupted one logged from its checkpoint's step on: records
        # of that step may come after the checkpoint (an epoch's end after a step's save), and the
        # resume logs them again. Those that came before it are in the checkpoint's log history:
        # written again here, so each record is there once.
        self.writer, self._owns_writer = SummaryWriter(log_dir=log_dir, purge_step=step or None), True
        if step:
            _read_last(self.writer, log_dir)
        for record in state.log_history if step else ():
            if record.get("step") == step and "stopped" not in record:
                values = self.numbers({k: v for k, v in record.items() if k != "step"})
                if values:
                    self.write(values, step, state)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def run_record(self) -> dict[str, Any]:
        return {"log_dir": os.path.abspath(self._dir)} if self._owns_writer and self._dir else {}

    def write(self, values: dict[str, Any], step: int, state) -> None:
        assert self.writer is not None  # made by `setup`, before any record
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
            self._tags.add(key)

    def close(self, args, state, final: dict[str, float], model) -> None:
        writer = self.writer
        if writer is None:
            return
        try:
            if self.ending == FINISHED:  # a failed or preempted run's resume writes them
                self._write_hparams(writer, run_params(args, state), final, state.global_step)
        finally:
            writer.flush()
            if self._owns_writer:
                writer.close()
            self.writer = None

    def _write_hparams(self, writer, params: dict[str, Any], final: dict[str, float], step: int) -> None:
        from torch.utils.tensorboard.summary import hparams

        # The HParams dashboard shows the latest value of each metric's scalar series in this
        # run; metrics without one (added at train end) get a scalar at the last step.
        for key, value in final.items():
            if key not in self._tags:
                writer.add_scalar(key, value, global_step=step)
        experiment, session_start, session_end = hparams(params, final)
        get = getattr(writer, "_get_file_writer", None)
        file_writer = get() if callable(get) else writer.file_writer
        for summary in (experiment, session_start, session_end):
            file_writer.add_summary(summary)


def _read_last(writer: Any, log_dir: str) -> None:
    """Make the resumed run's event file sort after the interrupted run's: TensorBoard reads a
    folder's files in name order, and a purge hides only what it read before. The names hold the
    second, the process id and a per-process counter, so a run resumed within the same second (or
    by a process with a smaller id) could sort first and be hidden instead. The interrupted run's
    files (closed: that run has ended) are then renamed to sort first, in their own order."""
    event_writer = getattr(getattr(writer, "file_writer", None), "event_writer", None)
    path = getattr(event_writer, "_file_name", None)
    if not isinstance(path, str):
        return
    mine = os.path.basename(path)
    others = sorted(n for n in os.listdir(log_dir) if "tfevents" in n and n != mine)
    if not others or mine > others[-1]:
        return
    for i, name in enumerate(others):
        os.replace(os.path.join(log_dir, name), os.path.join(log_dir, f"events.out.tfevents.0000000000.{i:04d}.{name}"))
