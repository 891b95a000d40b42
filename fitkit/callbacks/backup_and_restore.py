"""`BackupAndRestore`: an interrupted `fit` called again resumes where the backup was taken."""

from __future__ import annotations

import os
import shutil

from fitkit.callbacks.base import TrainerCallback


class BackupAndRestore(TrainerCallback):
    """Back the run up to `backup_dir` and resume from it when `fit` is called again (Keras).

    The backup is a full fitkit checkpoint (weights, optimizer, scheduler, RNG states, data
    position, callback states), so the resumed run continues exactly, also mid-epoch. Only the
    newest backup is kept. `save_freq="epoch"` backs up at each epoch end; an integer backs up
    every that many optimizer steps. With `delete_checkpoint=True` the backup is removed when
    `fit` completes (not when the process is preempted by SIGTERM).

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import BackupAndRestore

        x, y = torch.randn(64, 4), torch.randn(64, 1)
        model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
        model.fit(x, y, epochs=3, callbacks=[BackupAndRestore("/tmp/fitkit-backup")], verbose=0)
        # killed half-way? run the same line again: it resumes from the last backup.
    """

    def __init__(self, backup_dir: str, save_freq: str | int = "epoch", delete_checkpoint: bool = True):
        if not backup_dir:
            raise ValueError("`backup_dir` is required: a directory for the backups, e.g. 'backup'")
        if save_freq != "epoch" and not (isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0):
            raise ValueError(f"`save_freq`={save_freq!r} is invalid: pass 'epoch' or a number of optimizer steps > 0")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint

    def checkpoint_to_resume(self, args) -> str | None:
        """The newest complete backup, which `fit` resumes from (a fitkit protocol)."""
        from fitkit.engine.checkpoint import list_checkpoints

        found = list_checkpoints(self.backup_dir)
        return found[-1] if found else None

    def _backup(self, save_checkpoint) -> None:
        if save_checkpoint is not None:
            save_checkpoint(self.backup_dir, limit=1)

    def on_step_end(self, args, state, control, save_checkpoint=None, **kwargs):
        if self.save_freq != "epoch" and state.global_step % self.save_freq == 0:
            self._backup(save_checkpoint)

    def on_epoch_end(self, args, state, control, save_checkpoint=None, **kwargs):
        if self.save_freq == "epoch":
            self._backup(save_checkpoint)

    def on_train_end(self, args, state, control, preempted=False, **kwargs):
        if self.delete_checkpoint and not preempted and state.is_world_process_zero:
            shutil.rmtree(self.backup_dir, ignore_errors=True)
