"""What a checkpoint holds, and one run's save / resume / best-model loading.

A checkpoint (`output_dir/checkpoint-{global_step}/`) holds the module, the optimizer, the
scheduler, the `TrainerState` (with every callback's state in `stateful_callbacks`), the RNG
states and a `LoopSnapshot`: the data position and the running sums of the epoch under way.
`Checkpointer` gathers all of these itself when it saves, and puts each back when a run
resumes. The files are the other modules' work: writing them (`writing`, `background`, one
`CheckpointWriter` interface for synchronous and background saves), verifying (`verify`) and
loading (`loading`). When a save happens is the loop's business (`Loop._log_evaluate_save`, from
`control.should_save`)::

    checkpointer = Checkpointer(fabric, args, state, handler, module=m, optimizer=o, scheduler=s)
    with checkpointer.writing():                                          # one writer per output_dir
        snapshot = checkpointer.resume(checkpointer.resume_path(callbacks))   # or None: a fresh run
        checkpointer.restore_callbacks(snapshot, control)                      # after on_train_begin
        start = checkpointer.restore_epoch(loop, snapshot, train)              # the batch to continue at
        control = checkpointer.wait_committed(control)    # when control.should_save: the write before announced
        path = checkpointer.save(loop, control)           # 1. handed to the writer
        control = checkpointer.announce(control)          # on_save for what has committed (synchronous: this)
        checkpointer.wait_copied()                        # 2. before the next optimizer step
        control = checkpointer.poll_committed(control)    # 3.-4. between steps: committed, then on_save
        control = checkpointer.wait_committed(control)    # 3.-4. at the end of training
        checkpointer.load_best()
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fitkit.engine.running_loss import EpochLoss

from fitkit.common.options import error_line, writes_to_output_dir
from fitkit.common.schedule import steps_per_epoch, unplanned_steps
from fitkit.engine.checkpoint import run_lock, store, trainer_checkpoints
from fitkit.engine.checkpoint.layout import CheckpointError
from fitkit.engine.checkpoint.listing import is_complete, list_checkpoints
from fitkit.engine.checkpoint.loading import holds_optimizer, load_checkpoint, saved_state, warn_on_resume
from fitkit.engine.checkpoint.node_writers import writes_checkpoints
from fitkit.engine.checkpoint.verify import own_copy, resolve, verified
from fitkit.engine.checkpoint.writing import (
    CheckpointWriter,
    Committed,
    SaveJob,
    SyncCheckpointWriter,
    checkpoint_path,
    hold,
    remove_checkpoint,
)
from fitkit.engine.data.rng import rng_state
from fitkit.engine.devices.local import strategy_name
from fitkit.events.state import TrainerControl, TrainerState

logger = logging.getLogger("fitkit")

#: `TrainerState` fields a run sets from its own arguments and processes; a resume restores
#: every other field (the progress: step, epoch, logs, best model, callback states, ...).
PLAN_FIELDS = frozenset({
    "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
    "is_local_process_zero", "is_world_process_zero", "is_hyper_param_search", "trial_name", "trial_params",
})

#: `LoopSnapshot` fields kept beside the loop's own record in a checkpoint, not inside it (or,
#: `keep_plan`, not saved at all).
_BESIDE = ("rng", "callbacks", "keep_plan")


@dataclass
class LoopSnapshot:
    """The data position and the running sums of the epoch under way.

    The position is `samples`: how many samples of epoch `epoch`'s order all processes together
    had consumed, so a run with another number of processes or another batch size continues at
    the same sample (None when the data cannot say, e.g. a list of batches). `batch` counts the
    micro-batches each of the `world_size` processes had consumed (0 at an epoch boundary; then
    the sums are zero). `by_rank` holds each process's own `(loss sum, count)` under several
    processes; `epoch_rng` the RNG state when the epoch's batches were drawn (for loaders that
    draw their order from the global RNG); `data_state` the saved states of a stateful data
    source's parts, one list per process (`DataSource.data_state`), which a resume loads instead of
    re-reading the consumed batches. `rng` is the RNG state when the checkpoint was
    written and `callbacks` the saved callback states: a resume sets both back. `keep_plan`
    (never saved): this run's `max_steps` stands instead of being counted from the position, as
    the Trainer counts it (a Trainer checkpoint, or `ignore_data_skip`).

        snap = LoopSnapshot(epoch=2, batch=5, samples=80)
        LoopSnapshot.from_payload(snap.to_payload(), rng=rng_state(), callbacks={})

    The payload is plain values and tensors, so it loads with `weights_only=True`.
    """

    epoch: int = 0
    batch: int = 0
    samples: int | None = None
    world_size: int = 1
    epoch_loss: float = 0.0
    epoch_count: int = 0
    logged_loss: float = 0.0
    logged_count: int = 0
    carried_loss: float = 0.0  # HF's Trainer log: the earlier epochs' losses the next log still covers
    carried_count: float = 0
    metrics: dict | None = None
    by_rank: list | None = None
    epoch_rng: dict | None = None
    data_state: list | None = None
    rng: dict | None = None
    callbacks: dict[str, Any] = field(default_factory=dict)
    keep_plan: bool = False

    @property
    def mid_epoch(self) -> bool:
        return self.batch > 0

    def steps_to_end(self, global_step: int, start: int, batches: int, epochs: int, accumulation: int) -> int:
        """`max_steps` of a run by epochs resumed here at `global_step`, in this run's steps: the
        steps left in the resumed epoch (from batch number `start` of `batches`) and in the
        epochs after it. Another number of processes or batch size makes other steps than the
        run that wrote the checkpoint; on the same ones this is the plan of that run."""
        per_epoch = steps_per_epoch(batches, accumulation)
        left = steps_per_epoch(batches - start, accumulation) if self.mid_epoch else per_epoch
        return global_step + left + (epochs - self.epoch - 1) * per_epoch

    def to_payload(self) -> dict[str, Any]:
        """The loop's record for a checkpoint (`rng` and `callbacks` are stored beside it)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _BESIDE}

    @classmethod
    def from_payload(cls, record: dict[str, Any], *, rng: dict | None, callbacks: dict | None) -> LoopSnapshot:
        """Read a loop record back (keys this version does not know are ignored)."""
        known = {f.name for f in dataclasses.fields(cls)} - set(_BESIDE)
        return cls(**{k: v for k, v in record.items() if k in known}, rng=rng, callbacks=dict(callbacks or {}))


class TrainingLoop(Protocol):
    """What the checkpointer reads from the training loop (`fitkit.engine.loop.Loop`)."""

    #: `(epoch, micro-batches consumed in it)`: where a checkpoint written now resumes.
    position: tuple[int, int]
    #: The training data (a `DataSource`): it counts the samples a position stands for.
    source: Any
    #: Micro-batches in an epoch of it (None: unknown).
    epoch_length: int | None
    #: The epoch's running loss sums.
    loss: EpochLoss
    #: The training metrics (a `MetricSet`), whose states a mid-epoch checkpoint keeps.
    train_metrics: Any


class Checkpointer:
    """One run's checkpoints: writes them (into `output_dir`, or another directory for a
    callback such as `BackupAndRestore`), rotates them without losing the best one, resumes
    from one and loads the best model at the end when asked.

    Inside `writing()` the run holds its directories (one writer each, see `run_lock`); every
    checkpoint it resumes or loads is verified first (every file's digest, `checkpoint.verify`)."""

    def __init__(self, fabric: Any, args: Any, state: TrainerState, handler: Any, *, module: Any, optimizer: Any,
                 scheduler: Any = None, defer_copy: bool = True):
        self.fabric, self.args, self.state, self.handler = fabric, args, state, handler
        self.module, self.optimizer, self.scheduler = module, optimizer, scheduler
        self.last: str | None = None  # the newest checkpoint written into `output_dir`
        self._locks: dict[str, Any] | None = None  # by real path, while `writing()` runs
        self._token: str | None = None  # this run's part of temporary names, the same on every process
        self._announce: list[Committed] = []  # committed into output_dir, `on_save` not fired yet
        self._fetched: list[str] = []  # local copies of checkpoints downloaded from a store, removed at the end
        self.writer: CheckpointWriter = self._writer_for(args, defer_copy)

    def _writer_for(self, args: Any, defer_copy: bool) -> CheckpointWriter:
        """The background writer with `save_async` where the strategy allows it (DeepSpeed writes
        its own files: synchronously), else the synchronous one. `defer_copy`: an asynchronous
        save's copy of the weights may wait for the next forward and backward (False where an
        overridden `train_step` steps the optimizer itself)."""
        parts = {"module": self.module, "optimizer": self.optimizer, "scheduler": self.scheduler}
        if getattr(args, "save_only_model", False):  # HF's: the weights alone, no optimizer or scheduler state
            parts["optimizer"] = parts["scheduler"] = None
        if getattr(args, "save_async", False):
            strategy = strategy_name(self.fabric)
            if "DeepSpeed" not in strategy:
                from fitkit.engine.checkpoint.background import BackgroundCheckpointWriter

                return BackgroundCheckpointWriter(self.fabric, args, self.state, defer_copy=defer_copy, **parts)
            if args.save_strategy != "no":
                logger.warning("save_async=True is not supported with %s: checkpoints are written synchronously",
                               strategy)
        return SyncCheckpointWriter(self.fabric, args, self.state, **parts)

    # -- holding the directories ---------------------------------------------------------------
    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold `output_dir` for the block when this run writes there (and, from its first save,
        any other directory a save writes into): a second run on one of them is refused with a
        `run_lock.DirectoryInUseError` naming the holder. Released at the end, also on an error."""
        self._locks = {}
        try:
            if writes_to_output_dir(self.args):
                store.check_sharded_save(self.args, self.fabric, strategy_name(self.fabric))
                self._hold(self.args.output_dir, "`output_dir`")
            yield
        finally:
            self.writer.close()
            store.discard(self._fetched, self.fabric.is_global_zero)
            locks, self._locks = self._locks, None
            for lock in locks.values():
                if lock is not None:
                    lock.release()

    def _hold(self, directory: str, argument: str) -> None:
        key = directory.rstrip("/") if store.is_url(directory) else os.path.realpath(directory)
        if self._locks is not None and key not in self._locks:
            self._locks[key] = self._on_zero(lambda: hold(directory, argument), share=False)

    def _on_zero(self, fn: Callable[[], Any], share: bool = True) -> Any:
        """`fn()` run on the global-zero process alone; every process returns its result (with
        `share`) or raises its error, so no process waits for one that failed."""
        result, problem = None, None
        if self.fabric.is_global_zero:
            try:
                result = fn()
            except Exception as err:  # noqa: BLE001 - raised again below, on every process
                problem = err
        if self.fabric.world_size > 1:
            sent = problem if problem is None or isinstance(problem, (CheckpointError,
                                                                      run_lock.DirectoryInUseError)) \
                else RuntimeError(f"on the global-zero process: {error_line(problem)}")
            shared, received = self.fabric.broadcast((result if share else None, sent))
            if not self.fabric.is_global_zero:
                result, problem = shared, received
        if problem is not None:
            raise problem
        return result

    # -- saving ------------------------------------------------------------------------------------
    def snapshot(self, loop: TrainingLoop) -> LoopSnapshot:
        """Where `loop` is, for a checkpoint: data position and the epoch's running sums."""
        epoch, batch = loop.position
        world_size = self.fabric.world_size
        if not batch:
            carried_loss, carried_count = loop.loss.unlogged() if loop.loss.per_step else (0.0, 0)
            return LoopSnapshot(epoch=epoch, batch=0, samples=0, world_size=world_size, carried_loss=carried_loss,
                                carried_count=carried_count)
        sums = loop.loss.export()  # over all processes: before the metric states, as every process does
        return LoopSnapshot(epoch=epoch, batch=batch, samples=loop.source.consumed(epoch, batch), world_size=world_size,
                            **sums, metrics=loop.train_metrics.export_state(), epoch_rng=loop.source.epoch_rng if loop.source is not None else None,
                            data_state=self._data_state(loop.source))

    def _data_state(self, source: Any) -> list | None:
        """Every process's `source.data_state()` (in rank order), None when the data has none.
        Taken now, at the save: the source is read on the training thread (no prefetch), so
        it stands for exactly the batches consumed."""
        state = source.data_state()
        if state is None:  # every process has the same kind of source: all skip the gather alike
            return None
        if self.fabric.world_size == 1:
            return [state]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.fabric.world_size
        dist.all_gather_object(gathered, state)
        return gathered

    def save(self, loop: TrainingLoop, control: TrainerControl, directory: str | None = None,
             limit: int | None = None) -> str:
        """Write a resumable checkpoint of `loop`'s run into `directory` (default `output_dir`)
        and rotate: `save_total_limit` in `output_dir` (never the best one), `limit` elsewhere.
        With `save_async` this returns once a host copy of the state is taken: the path is a
        checkpoint once the background write commits it (`poll_committed`, `wait_committed`)."""
        own = directory is None
        directory = self.args.output_dir if directory is None else directory
        self._collect(self.writer.wait_committed())  # at most one write in flight: the one before commits first
        snapshot = self.snapshot(loop)
        self._hold(directory, "`output_dir`" if own else "directory")
        if self._token is None:
            self._token = self._on_zero(lambda: secrets.token_hex(4))
        state = self.state
        state.stateful_callbacks = self.handler.export_states(control)
        best = checkpoint_path(directory, state.best_global_step) if state.best_global_step else None
        # This checkpoint holds the best model, or an earlier one does (saved at the step an
        # evaluation later found best, as HF records it): kept by rotation either way.
        if own and best and (state.best_global_step == state.global_step or (
                is_complete(best) if store.is_url(best) else os.path.isdir(best))):
            state.best_model_checkpoint = best
        extra = {"rng": rng_state(), "loop": snapshot.to_payload()}
        job = SaveJob(directory, own, self.args.save_total_limit if own else limit, state, extra, self._token)
        path = self.writer.write(job)
        self._collect(self.writer.poll_committed())  # a synchronous write has committed already
        return path

    # -- after a save: the order of `writing.CheckpointWriter` ------------------------------------------
    def wait_copied(self) -> None:
        """An asynchronous save's copy of the weights complete: before the optimizer step, and
        before any callback runs."""
        self.writer.wait_copied()

    def poll_committed(self, control: TrainerControl) -> TrainerControl:
        """Between steps: a background write that has ended (on one process) is settled and its
        `on_save` fired. Returns the control in force after those `on_save`s."""
        self._collect(self.writer.poll_committed())
        return self.announce(control)

    def wait_committed(self, control: TrainerControl) -> TrainerControl:
        """Wait for the write in flight (if any) to commit and fire its `on_save`: before the next
        save (so `on_save` always names the newest committed checkpoint) and at the end of
        training. A collective under several processes."""
        self._collect(self.writer.wait_committed())
        return self.announce(control)

    def _collect(self, committed: list[Committed]) -> None:
        for done in committed:
            if done.own:
                self.last = done.path
                self._announce.append(done)

    def announce(self, control: TrainerControl) -> TrainerControl:
        """Fire `on_save` for every checkpoint committed into `output_dir` since the last call,
        with its path as the `checkpoint` keyword and the `TrainerState` it recorded as `state`
        (the live one for a synchronous save; with `save_async`, a copy: the run moved on);
        returns the control in force after them."""
        announced, self._announce = self._announce, []
        wanted = control.should_save  # a save this step asked for is not the one announced here
        for done in announced:
            control = self.handler.on_save(self.args, done.state, control, checkpoint=done.path)
        control.should_save = control.should_save or wanted
        return control

    # -- resuming ----------------------------------------------------------------------------------
    def resume_path(self, callbacks: Iterable[Any]) -> str | None:
        """`resume_from_checkpoint` resolved, else a checkpoint a callback offers through
        `checkpoint_to_resume(args)` (`OffersCheckpoint`, e.g. `BackupAndRestore`), else None.
        Verified on the global-zero process before anything is loaded (see `checkpoint.resolve`)."""
        return self._everywhere(lambda: self._choose(callbacks))

    def _everywhere(self, choose: Callable[[], str | None]) -> str | None:
        """The checkpoint `choose()` picks on the global-zero process, readable by every process: a
        copy downloaded from a store is downloaded (and verified) again by a process that does not
        see that copy (on another machine). Copies are remembered for removal at the end."""
        def located() -> tuple[str | None, str | None, str | None]:
            path = choose()
            if path is None:
                return None, None, None
            url = store.origin(path)
            return path, url, store.manifest_digest(path) if url else None

        path, url, digest = self._on_zero(located)
        # a copy outside this process's staging folder, or not there (another machine's /tmp): its own
        if url and path is not None and (not store.is_staged(path) or store.manifest_digest(path) != digest):
            path = own_copy(url, self.fabric.global_rank)
        if path is not None and store.is_staged(path):
            self._fetched.append(path)
        return path

    def _choose(self, callbacks: Iterable[Any]) -> str | None:
        path = self._offered(callbacks)
        args = self.args
        if args.save_strategy != "no" or args.save_on_sigterm:  # this run writes checkpoint-N into output_dir
            trainer_checkpoints.guard_output_dir(args.output_dir, path)
            if path is not None and trainer_checkpoints.is_trainer_checkpoint(path):
                later = trainer_checkpoints.replaced_later(args.output_dir, path)
                if later:
                    logger.warning("resuming from the Trainer's %s: this run's checkpoints of the same steps replace "
                                   "the Trainer's later ones (%s), as the Trainer's own resume would", path,
                                   ", ".join(os.path.basename(p) for p in later))
        return path

    def _offered(self, callbacks: Iterable[Any]) -> str | None:
        if self.args.resume_from_checkpoint:
            return resolve(self.args.resume_from_checkpoint, self.args.output_dir)
        for cb in callbacks:
            # (the protocol's one method looked up directly: a runtime protocol check costs ~10 us a callback)
            offer = getattr(cb, "checkpoint_to_resume", None)
            path = offer(self.args) if callable(offer) else None
            if path:
                return verified(path)
        return None

    def resume(self, path: str | None, epoch_length: int | None = None) -> LoopSnapshot | None:
        """Load `path` into the module, optimizer, scheduler and state; return where the loop
        continues (None for no path: a fresh run). `epoch_length` (micro-batches per epoch of
        this run, None: unknown) places a Trainer checkpoint's step in this run's data."""
        if path is None:
            return None
        if trainer_checkpoints.is_trainer_checkpoint(path):
            return self._resume_trainer(path, epoch_length)
        optimizer = self.optimizer
        if optimizer is not None and not holds_optimizer(path):
            logger.warning("%s was written with save_only_model=True: it holds no optimizer or scheduler state; the "
                           "run goes on from its weights with a fresh optimizer", path)
            optimizer = None
        payload = load_checkpoint(self.fabric, path, module=self.module, optimizer=optimizer)
        if self.scheduler is not None and "scheduler" in payload:
            self.scheduler.load_state_dict(payload["scheduler"])
        saved = saved_state(path)
        for f in dataclasses.fields(TrainerState):
            if f.name not in PLAN_FIELDS:
                setattr(self.state, f.name, getattr(saved, f.name))
        warn_on_resume(self.args, self.state, saved)  # other step intervals or batch size; a lost best one
        logger.info("resuming from %s at step %d", path, self.state.global_step)
        snapshot = LoopSnapshot.from_payload(payload["loop"], rng=payload["rng"],
                                             callbacks=self.state.stateful_callbacks)
        if self.args.ignore_data_skip and snapshot.mid_epoch:  # HF: the epoch starts over, max_steps stands
            snapshot = LoopSnapshot(epoch=snapshot.epoch, world_size=snapshot.world_size, rng=snapshot.rng,
                                    epoch_rng=snapshot.epoch_rng, callbacks=snapshot.callbacks, keep_plan=True)
        return snapshot

    def _resume_trainer(self, path: str, epoch_length: int | None) -> LoopSnapshot:
        """Continue from a checkpoint of the Hugging Face Trainer as the Trainer would: weights,
        optimizer and scheduler loaded, its `TrainerState` taken, the epoch and micro-batch it
        continues at counted in this run's data (`trainer_checkpoints.position`), its RNG states set back
        after the skipped batches (at the start of the epoch on an epoch boundary)."""
        args, fabric = self.args, self.fabric
        trainer_checkpoints.load_weights(self.module, path)
        trainer_checkpoints.load_optimizer(self.optimizer, path)
        trainer_checkpoints.load_scheduler(self.scheduler, path)
        saved = trainer_checkpoints.trainer_state(path)
        for f in dataclasses.fields(TrainerState):
            if f.name not in PLAN_FIELDS:
                setattr(self.state, f.name, getattr(saved, f.name))
        warn_on_resume(args, self.state, saved)
        epoch, batch = trainer_checkpoints.position(saved.global_step, epoch_length, args.gradient_accumulation_steps,
                                           args.ignore_data_skip)
        rng = trainer_checkpoints.read_rng(path, fabric.global_rank, fabric.world_size)
        logger.info("resuming from the Trainer's checkpoint %s at step %d (epoch %d, after %d batches of it)", path,
                    saved.global_step, epoch, batch)
        # Mid-epoch the Trainer sets its RNG back once the skipped batches are drawn: `epoch_rng` does the same.
        return LoopSnapshot(epoch=epoch, batch=batch, world_size=fabric.world_size, rng=rng,
                            epoch_rng=rng if batch else None, callbacks=self.state.stateful_callbacks, keep_plan=True)

    def restore_callbacks(self, resume: LoopSnapshot | None, control: TrainerControl) -> None:
        """Give the callbacks their saved states (and the control flags) back; call it after
        `on_train_begin`, which resets Keras-style callbacks. With
        `restore_callback_states_from_checkpoint=False` (HF's default) none of them, as the Trainer."""
        if resume and self.args.restore_callback_states_from_checkpoint:
            self.handler.load_states(resume.callbacks, control)

    def restore_epoch(self, loop: TrainingLoop, resume: LoopSnapshot, train: Any) -> int:
        """Put back the resumed epoch's running sums into `loop`; return the batch number this
        run continues from: the same sample, whatever the number of processes and batch size now
        (training by epochs, `max_steps` is then counted again in this run's steps)."""
        args, state = self.args, self.state
        start = train.resume_at(resume) if resume.mid_epoch else 0
        batches = loop.epoch_length
        if args.max_steps <= 0 and batches and not resume.keep_plan:
            state.max_steps = resume.steps_to_end(state.global_step, start, batches, state.num_train_epochs,
                                                  args.gradient_accumulation_steps)
            state.max_steps -= unplanned_steps(args.num_train_epochs, batches,
                                               args.gradient_accumulation_steps)  # epochs=1.5
        loop.loss.carried = (resume.carried_loss, resume.carried_count)
        if not resume.mid_epoch:
            return 0
        loop.loss.restore(resume)
        if self.fabric.global_rank == 0:  # metric states were synced over all processes when saved
            loop.train_metrics.load_state(resume.metrics)
        return start

    # -- the best model ------------------------------------------------------------------------------
    def load_best(self) -> None:
        """With `load_best_model_at_end`, put the best checkpoint's weights back into the module
        (verified first)."""
        best = self.state.best_model_checkpoint
        if self.args.load_best_model_at_end and best and self._on_zero(lambda: trainer_checkpoints.is_trainer_checkpoint(best)):
            trainer_checkpoints.load_weights(self.module, best)  # recorded by the Trainer before this run resumed
        elif self.args.load_best_model_at_end and best:
            path = self._everywhere(lambda: verified(best))
            assert path is not None  # verified returns its checkpoint
            load_checkpoint(self.fabric, path, module=self.module, optimizer=None)

    def keep_only_best(self) -> None:
        """Remove every checkpoint of `output_dir` but the best (the Trainer's retention at the end
        under `save_total_limit=1`: `fitkit.engine.policy.TrainerPolicy.retain`)."""
        best = self.state.best_model_checkpoint
        if best and writes_checkpoints(self.fabric, self.args):
            for path in list_checkpoints(self.args.output_dir):
                if os.path.abspath(path) != os.path.abspath(best):
                    remove_checkpoint(path)
