"""Trial bookkeeping against the storage: how many trials are claimed, and re-queueing a trial
that did not finish (killed, stale or preempted) so that it is re-run from its checkpoint.

A claim is a trial that is finished (COMPLETE, PRUNED), running, or waiting in the queue: a
study with `n_trials` claims takes no new trial, whatever the number of workers. A trial that
FAILs gives its slot back; when it was killed or preempted, `requeue` puts a WAITING copy with
the same parameters in the queue, pointing at the failed trial's `output_dir`:

    requeue(study, failed_trial)     # WAITING: same params, user attrs resumed_from / output_dir
    claims(study).free(n_trials)     # how many new trials may still start
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("fitkit")

#: User attributes fitkit writes on each trial.
OUTPUT_DIR, METRICS, BEST_CHECKPOINT, RESUMED_FROM = "output_dir", "metrics", "best_checkpoint", "resumed_from"
#: User attribute set on a trial that was dropped because the study already had `n_trials` claims.
SURPLUS = "fitkit_surplus"


@dataclass
class Claims:
    finished: int
    running: int
    waiting: int

    def free(self, n_trials: int) -> int:
        return n_trials - self.finished - self.running - self.waiting


def claims(study: Any) -> Claims:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    count = lambda *states: sum(t.state in states for t in trials)  # noqa: E731
    return Claims(count(TrialState.COMPLETE, TrialState.PRUNED), count(TrialState.RUNNING),
                  count(TrialState.WAITING))


def is_surplus(study: Any, trial: Any, n_trials: int) -> bool:
    """True when `trial` (just started, freshly sampled) came after the study's `n_trials`
    claims: two workers took the last slot at the same moment, and the later trial yields."""
    from optuna.trial import TrialState

    if trial.number < n_trials:  # fewer than n_trials trials came before it, of any state
        return False
    live = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    before = [t for t in study.get_trials(deepcopy=False) if t.state in live and t.number < trial.number]
    return len(before) >= n_trials


def requeue(study: Any, failed: Any) -> None:
    """Queue a re-run of `failed` (a FAIL trial): same parameters and distributions, its
    intermediate values (reported once, so the re-run does not report them again), its
    `output_dir` (where the re-run resumes from the last checkpoint) and `resumed_from`."""
    import optuna

    attrs = dict(failed.user_attrs)
    if not attrs.get(OUTPUT_DIR):
        logger.warning("trial %d failed before it started training: it is not re-run", failed.number)
        return
    attrs[RESUMED_FROM] = failed.number
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.WAITING, params=dict(failed.params), distributions=dict(failed.distributions),
        user_attrs=attrs, intermediate_values=dict(failed.intermediate_values)))
    logger.warning("trial %d did not finish: queued again, to resume from %s", failed.number, attrs[OUTPUT_DIR])


def on_stale(study: Any, trial: Any) -> None:
    """Optuna's stale-trial callback: a trial whose worker stopped sending heartbeats was
    failed; run it again from its checkpoint."""
    requeue(study, trial)
