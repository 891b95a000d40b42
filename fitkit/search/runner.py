"""`run_search`: one search over Optuna, safe to run as many workers on one study.

Rank 0 leads: it runs the study, samples every trial (`hp_space` and `model_init`) and
broadcasts the trial's plan (parameters, number, output directory, resume); under several
processes the others follow with the same parameters fixed, so every process trains the same
trial. The leader takes a trial only while the study has fewer than `n_trials` claims
(`fitkit.search.claims`); when every slot is taken by running trials it waits for them while
heartbeats are on, and takes over (resumes) any that goes stale.
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from fitkit.config.arguments import TrainingArguments
from fitkit.config.names import ALIASES
from fitkit.engine.data.rng import seed_everything
from fitkit.engine.devices.load_once import structure_of
from fitkit.search.claims import (
    BEST_CHECKPOINT,
    METRICS,
    OUTPUT_DIR,
    RESUMED_FROM,
    SURPLUS,
    claims,
    is_surplus,
    requeue,
)
from fitkit.search.memory import TrialMemory
from fitkit.search.objective import check_params, objective_value, parameters
from fitkit.search.reporter import TrialReporter
from fitkit.search.storage import StorageError, _chain

if TYPE_CHECKING:
    from optuna import Study

logger = logging.getLogger("fitkit")

#: Exit status of a search stopped by SIGTERM (128 + 15, as a shell reports a process that
#: SIGTERM ended): its trial is checkpointed and queued to resume; run the worker again (requeue).
PREEMPTED_EXIT_CODE = 143


class BestRun(NamedTuple):
    """The best trial of a search (HF's fields): `run_id` is the trial number as a string;
    `run_summary` its user attributes (`metrics`, `output_dir`, `best_checkpoint`)."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any = None


class _Preempted(Exception):
    """The trial was stopped by SIGTERM after its checkpoint (Optuna records it as FAIL)."""


class _Surplus(Exception):
    """The study already had `n_trials` claims when this trial started."""


class Search:
    """One search: `lead(study, n_trials)` on rank 0, `follow()` on the other processes."""

    def __init__(self, model: Any, x: Any, y: Any, *, hp_space: Callable, compute_objective: Callable,
                 direction: str | list[str], hp_name: Callable | None, optimize_kwargs: dict[str, Any],
                 fit_options: dict[str, Any]) -> None:
        self.model, self.x, self.y = model, x, y
        self.hp_space, self.compute_objective, self.hp_name = hp_space, compute_objective, hp_name
        self.direction = direction
        self.multi = isinstance(direction, list)
        self.optimize_kwargs = optimize_kwargs
        names = set(TrainingArguments.names()) | set(ALIASES)
        # the script's `args=` (HF's search takes the Trainer's arguments), the options given over it
        self.args = model.training_arguments(fit_options.get("args"), **{k: v for k, v in fit_options.items()
                                                                         if k in names})
        self.with_args = "args" in fit_options  # then each trial's fit gets the search's arguments, replaced
        self.fit_options = {k: v for k, v in fit_options.items() if k not in names and k != "args"} if (
            self.with_args) else fit_options
        self.fabric = model.launch(self.args)
        self.distributed = self.fabric.world_size > 1
        self.study: Study | None = None  # set by `lead`
        self.n_trials = 0
        self.preempted: int | None = None  # the trial SIGTERM stopped
        self.waiting = False
        self.memory = TrialMemory(optuna_collects=bool(optimize_kwargs.get("gc_after_trial", False)))

    # -- the two roles ------------------------------------------------------------------------
    def lead(self, study: Any, n_trials: int) -> BestRun | list[BestRun]:
        self.study, self.n_trials = study, n_trials
        try:
            with self.memory:
                self._run_trials()
        except Exception as error:
            storage_error = next((e for e in _chain(error) if isinstance(e, StorageError)), None)
            if storage_error is not None and storage_error is not error:
                raise storage_error from None  # not Optuna's follow-up errors around it
            raise
        finally:
            if self.distributed:
                self.fabric.broadcast(None, src=0)  # no more trials
        if self.preempted is not None:
            requeue(study, _trial(study, self.preempted))
            raise SystemExit(PREEMPTED_EXIT_CODE)
        best = _best(study, self.multi)
        return self.fabric.broadcast(best, src=0) if self.distributed else best

    def _run_trials(self) -> None:
        assert self.study is not None  # set by `lead`
        optimize = dict(self.optimize_kwargs)
        callbacks = list(optimize.pop("optuna_callbacks", None) or ())
        timeout = optimize.pop("timeout", None)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        per_call = optimize.get("n_jobs", 1) if optimize.get("n_jobs", 1) > 0 else os.cpu_count() or 1
        while self.preempted is None and time.monotonic() < deadline:
            now = claims(self.study)
            if now.finished >= self.n_trials:
                return
            if now.free(self.n_trials) <= 0 and now.waiting == 0:
                if not self._wait_for_running(now.running, deadline):
                    return
                continue
            try:
                self.study.optimize(self.objective, n_trials=per_call, callbacks=callbacks, **optimize)
            except (_Preempted, _Surplus):
                pass  # `catch` may have swallowed them too: the loop reads the state

    def _wait_for_running(self, running: int, deadline: float) -> bool:
        """Every slot is taken and some trials run elsewhere: wait a heartbeat, then fail those
        gone stale (their re-runs are queued). False when there is nothing to wait for (no
        running trial, or no heartbeats to tell a dead one)."""
        import optuna
        from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled

        assert self.study is not None  # set by `lead`
        storage = self.study._storage
        if not running or not is_heartbeat_enabled(storage):
            return False
        if not self.waiting:
            self.waiting = True
            logger.warning("all n_trials=%d trials are taken; waiting for the %d running elsewhere (a trial whose "
                           "worker dies is re-run here once stale); heartbeat_interval=None leaves at once",
                           self.n_trials, running)
        heartbeat = cast(BaseHeartbeat, storage)  # enabled: a heartbeat storage (an RDB one, maybe cached) ...
        interval = cast(int, heartbeat.get_heartbeat_interval())  # ... with an interval set
        time.sleep(max(0.0, min(interval, deadline - time.monotonic(), 10)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        return True

    def follow(self) -> BestRun | list[BestRun]:
        import optuna

        with self.memory:
            while True:
                plan = self.fabric.broadcast(None, src=0)
                if plan is None:
                    break
                trial = optuna.trial.FixedTrial(plan["params"], number=plan["number"])
                params = parameters(self.hp_space, trial)
                try:
                    self.train_trial(self.fresh_model(trial, params, plan["structure"]), trial, params, plan)
                except optuna.TrialPruned:
                    pass
                except _Preempted:
                    raise SystemExit(PREEMPTED_EXIT_CODE) from None
        return self.fabric.broadcast(None, src=0)

    # -- one trial ----------------------------------------------------------------------------
    def objective(self, trial: Any) -> float | tuple:
        if is_surplus(self.study, trial, self.n_trials):
            trial.set_user_attr(SURPLUS, True)
            raise _Surplus(f"trial {trial.number}: the study already has n_trials={self.n_trials} trials")
        resumed_from = trial.user_attrs.get(RESUMED_FROM)
        output_dir = trial.user_attrs.get(OUTPUT_DIR) if resumed_from is not None else None
        output_dir = output_dir or os.path.join(self.args.output_dir, self._run_name(trial))
        trial.set_user_attr(OUTPUT_DIR, output_dir)
        params = parameters(self.hp_space, trial)
        check_params(params)
        trial_model = self.fresh_model(trial, params)
        plan = {"params": dict(trial.params), "number": trial.number, "output_dir": output_dir,
                "resume": resumed_from is not None, "structure": None}
        if self.distributed and self.args.strategy == "fsdp" and self.args.fsdp_load_once:
            plan["structure"] = structure_of(trial_model.module)  # model_init ran here alone
        if self.distributed:  # rank 0 sampled everything (hp_space and model_init); the others follow
            self.fabric.broadcast(plan, src=0)
        reported = _trial(self.study, trial.number).intermediate_values if plan["resume"] else {}
        try:
            return self.train_trial(trial_model, trial, params, plan, reported)
        except _Preempted:
            self.preempted = trial.number
            raise

    def _run_name(self, trial: Any) -> str:
        """The trial's folder under `output_dir`: `run-{number}`, or `hp_name(trial)` under the
        Trainer face, as the Trainer names it."""
        return self.hp_name(trial) if self.hp_name is not None and self.args.hf_trainer else f"run-{trial.number}"

    def fresh_model(self, trial: Any, params: dict[str, Any], structure: bytes | None = None) -> Any:
        """The trial's model, seeded first as HF's; under strategy="fsdp" built as `fit` builds it
        (`module_for_trial`: `structure` is rank 0's module under fsdp_load_once)."""
        seed_everything(params.get("seed", self.args.seed))  # before model_init, as HF
        return self.model.for_trial(trial, hp_name=self.hp_name, args=self.args, structure=structure)

    def train_trial(self, trial_model: Any, trial: Any, params: dict[str, Any], plan: dict[str, Any],
                    reported: dict | None = None) -> float | tuple:
        """Fit one trial (resuming from the newest checkpoint in its `output_dir` when it is the
        re-run of an interrupted one); store its results on the trial; the objective."""
        import optuna

        reporter = TrialReporter(trial, self.compute_objective, self.multi, self.fabric, reported or ())
        trial_options = self._trial_options(params, plan)
        extra_callbacks = list(trial_options.pop("callbacks", None) or ())
        try:
            history = trial_model.fit(self.x, self.y, callbacks=extra_callbacks + [reporter], **trial_options)
            metrics = dict(reporter.metrics) or {k: v[-1] for k, v in history.history.items()}
            if self.args.hf_trainer and reporter.objective is None:  # no evaluation in training: one now (HF)
                reporter.objective = self.compute_objective(trial_model.evaluate(metric_key_prefix="eval",
                                                                                 verbose=0))
        except SystemExit:
            if reporter.preempted:  # SIGTERM: the checkpoint is written, the trial is to be resumed
                raise _Preempted(f"trial {trial.number} preempted (SIGTERM): checkpointed, queued to resume") from None
            raise
        finally:
            state = trial_model.state
            best_checkpoint = getattr(state, "best_model_checkpoint", None) or trial_model.last_checkpoint
            # Optuna runs the leader's trials (and its gc_after_trial), the followers' not
            self.memory.release(trial_model, optuna_follows=self.fabric.is_global_zero)
            del trial_model
        if self.fabric.is_global_zero:
            trial.set_user_attr(METRICS, _plain(metrics))
            trial.set_user_attr(BEST_CHECKPOINT, best_checkpoint)
        if reporter.pruned:
            raise optuna.TrialPruned(f"pruned at {trial.number}")
        # the Trainer face: the last evaluation's objective, as the Trainer returns it (no call of its own)
        value = reporter.objective if self.args.hf_trainer else self.compute_objective(metrics)
        return objective_value(value, self.direction)

    def _trial_options(self, params: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
        """The trial's `fit` options: the search's, the trial's values and folder over them. With
        `args=`, the trial's values replace the fields of the search's arguments (as the Trainer
        sets them on its `args`), so a value the script's arguments set is no conflict."""
        over = {**params, "output_dir": plan["output_dir"]}
        if plan["resume"]:
            over["resume_from_checkpoint"] = True
        if not self.with_args:
            return {**self.fit_options, **over}
        return {**self.fit_options, "args": self.args.replace(**over)}


def _trial(study: Any, number: int) -> Any:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _plain(metrics: dict[str, Any]) -> dict[str, float]:
    """Metrics as JSON numbers (storages keep user attributes as JSON)."""
    plain = {}
    for key, value in metrics.items():
        try:
            plain[key] = float(value)
        except (TypeError, ValueError):
            continue
    return plain  # (a float is its own JSON number: NaN and infinities too, as storages write them)


def _best(study: Any, multi: bool) -> BestRun | list[BestRun]:
    if multi:
        return [BestRun(str(t.number), list(t.values), dict(t.params), dict(t.user_attrs)) for t in study.best_trials]
    t = study.best_trial
    return BestRun(str(t.number), t.value, dict(t.params), dict(t.user_attrs))
