"""`BackupAndRestore`: an interrupted `fit` called again resumes where the backup was taken."""

from __future__ import annotations

import logging
import os
import re
import shutil

from fitkit.events.handler import TrainerCallback

logger = logging.getLogger("fitkit")
_BACKUP = re.compile(r"^checkpoint-(\d+)$")


class BackupAndRestore(TrainerCallback):
    """Back the run up to `backup_dir` and resume from it when `fit` is called again (Keras).

    The backup is a full fitkit checkpoint (weights, optimizer, scheduler, RNG states, data
    position, callback states), so the resumed run continues exactly, also mid-epoch.
    `save_freq="epoch"` backs up at each epoch end (after its validation: Keras' `on_epoch_end`
    moment, so a resumed run starts at the next epoch); an integer backs up every that many
    optimizer steps. Only the newest backup is kept, or the two newest with
    `double_checkpoint=True`. With `delete_checkpoint=True` the backup is removed when `fit`
    completes (not when the process is preempted by SIGTERM, nor when an error ends it).

    Each backup is verified (every file's digest) before it is resumed. A damaged one (a
    truncated or changed file) raises a `CheckpointError` naming the file, as Keras raises,
    rather than training from epoch 0 without a word; with `double_checkpoint=True` the
    previous backup is used instead, with a warning (the damaged one is renamed
    `damaged-checkpoint-N` and left in `backup_dir`).

    Example::

        import torch
        from fitkit import Model
        from fitkit.callbacks import BackupAndRestore

        x, y = torch.randn(64, 4), torch.randn(64, 1)
        model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
        model.fit(x, y, epochs=3, callbacks=[BackupAndRestore("/tmp/fitkit-backup")], verbose=0)
        # killed half-way? run the same line again: it resumes from the last backup.
    """

    takes_batch = False  # its step events ignore `batch`, `outputs` and `loss`

    def __init__(self, backup_dir: str | os.PathLike, save_freq: str | int = "epoch", double_checkpoint: bool = False,
                 delete_checkpoint: bool = True) -> None:
        if not backup_dir:
            raise ValueError("Empty `backup_dir` argument passed: BackupAndRestore needs a directory for the backups, "
                             "e.g. 'backup'")
        if save_freq != "epoch" and not (isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0):
            raise ValueError(f"Invalid value for argument `save_freq`: {save_freq!r}; pass 'epoch' or a number of "
                             "optimizer steps > 0")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.double_checkpoint = bool(double_checkpoint)
        self.delete_checkpoint = delete_checkpoint

    def checkpoint_to_resume(self, args) -> str | None:
        """The newest backup, verified, which `fit` resumes from (a fitkit protocol); None when
        there is none. A damaged newest one raises `CheckpointError`, or with
        `double_checkpoint` gives way to the one before it."""
        from fitkit.engine.checkpoint.layout import CheckpointError
        from fitkit.engine.checkpoint.verify import verified

        found = self._backups()
        if not found:
            return None
        try:
            return verified(found[0])
        except CheckpointError as err:
            if not (self.double_checkpoint and len(found) > 1):
                raise CheckpointError(
                    f"BackupAndRestore cannot resume: the backup {found[0]!r} is damaged ({err}). Restore it, or "
                    f"delete `backup_dir`={self.backup_dir!r} to train from the start (double_checkpoint=True keeps "
                    "the previous backup as a fallback)") from None
            damaged = err
        try:
            older = verified(found[1])
        except CheckpointError as err:
            raise CheckpointError(
                f"BackupAndRestore cannot resume: both backups are damaged, {found[0]!r} ({damaged}) and {found[1]!r} "
                f"({err}). Delete `backup_dir`={self.backup_dir!r} to train from the start") from None
        aside = os.path.join(self.backup_dir, f"damaged-{os.path.basename(found[0])}")
        if "://" in self.backup_dir:  # a store has no rename: the damaged backup is removed (manifest first)
            from fitkit.engine.checkpoint.writing import remove_checkpoint

            remove_checkpoint(found[0])
            aside = "nothing (removed from the store)"
        else:
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(found[0], aside)
        logger.warning("BackupAndRestore: the newest backup %s is damaged (%s); resuming from the previous one, %s "
                       "(the damaged one is kept as %s)", found[0], damaged, older, aside)
        return older

    def _backups(self) -> list[str]:
        """The backup directories, newest first, complete or not (a damaged one is not skipped)."""
        if "://" in self.backup_dir:  # a bucket (s3://...): its checkpoint-N prefixes, from one listing
            from fitkit.engine.checkpoint import store

            names = list(store.Store.open(self.backup_dir, "`backup_dir`").checkpoints())
        elif os.path.isdir(self.backup_dir):
            names = os.listdir(self.backup_dir)
        else:
            return []
        steps = [(int(m.group(1)), name) for name in names if (m := _BACKUP.match(name))]
        return [f"{self.backup_dir.rstrip('/')}/{name}" if "://" in self.backup_dir else
                os.path.join(self.backup_dir, name) for _, name in sorted(steps, reverse=True)]

    def _backup(self, save_checkpoint) -> None:
        if save_checkpoint is not None:
            save_checkpoint(self.backup_dir, limit=2 if self.double_checkpoint else 1)

    def on_step_end(self, args, state, control, save_checkpoint=None, **kwargs):
        if self.save_freq != "epoch" and state.global_step % self.save_freq == 0:
            self._backup(save_checkpoint)

    def on_epoch_summary(self, args, state, control, save_checkpoint=None, **kwargs):
        # Keras' on_epoch_end moment: after the epoch's log and validation, so the resumed run
        # starts at the next epoch, each epoch event fired once (as Keras' BackupAndRestore)
        if self.save_freq == "epoch":
            self._backup(save_checkpoint)

    def on_train_end(self, args, state, control, preempted=False, **kwargs):
        if self.delete_checkpoint and not preempted and state.is_world_process_zero:
            if "://" in self.backup_dir:
                from fitkit.engine.checkpoint import store

                where = store.Store.open(self.backup_dir, "`backup_dir`", check=False)
                for name in where.checkpoints():
                    where.remove(name)
            else:
                shutil.rmtree(self.backup_dir, ignore_errors=True)
