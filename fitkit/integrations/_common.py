"""Pieces every tracking integration shares: the registry of names, availability checks,
masking of secrets, and `TrackingCallback`, the base class of the loggers.

Nothing here imports a tracking library: each integration imports its own on first use.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import sys
import warnings
from typing import Any, NamedTuple

from fitkit.common import logs as _logs
from fitkit.common.logs import POSITION
from fitkit.events.handler import Order, TrainerCallback


class Integration(NamedTuple):
    """One `report_to` name: where its callback lives and what it needs installed."""

    module: str  # fitkit.integrations.<module>
    callback: str  # class name in that module
    package: str | None  # top-level import name that must be installed (None: nothing)
    extra: str | None  # `pip install fitkit[<extra>]`


#: `report_to` names, in the order `"all"` adds them.
INTEGRATIONS: dict[str, Integration] = {
    "csv": Integration("csv", "CSVStepLogger", None, None),
    "tensorboard": Integration("tensorboard", "TensorBoardCallback", "tensorboard", "tensorboard"),
    "mlflow": Integration("mlflow", "MLflowCallback", "mlflow", "mlflow"),
    "wandb": Integration("wandb", "WandbCallback", "wandb", "wandb"),
    "comet_ml": Integration("comet_ml", "CometCallback", "comet_ml", "comet_ml"),
    "codecarbon": Integration("codecarbon", "CodeCarbonCallback", "codecarbon", "codecarbon"),
}


class MissingIntegrationError(ImportError):
    """A `report_to` integration whose package is not installed; the message names the pip extra."""


def is_available(name: str) -> bool:
    """True when the package integration `name` needs is importable (nothing is imported)."""
    package = INTEGRATIONS[name].package
    if package is None:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def require(name: str) -> None:
    """Raise `MissingIntegrationError` when integration `name` cannot be used here."""
    if not is_available(name):
        spec = INTEGRATIONS[name]
        raise MissingIntegrationError(
            f"report_to={name!r} needs the `{spec.package}` package, which is not installed: "
            f'run `pip install "fitkit[{spec.extra}]"` (or `pip install {spec.package}`)'
        )


# -- secrets ----------------------------------------------------------------------------------

MASK = "<masked>"
# Whole words (split on `_`, `-`, `.`, spaces and camelCase) that mark a credential...
_SECRET_WORDS = frozenset({
    "token", "key", "apikey", "password", "passwd", "passphrase", "pwd", "secret", "credential",
    "credentials", "auth", "authorization", "cookie", "sas", "dsn",
})
# ... and endings that do when glued to another word (`hubtoken`, `clientsecret`).
_SECRET_ENDINGS = ("token", "secret", "password", "passwd", "apikey", "credentials")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# `scheme://user:password@host` in any string value
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)(?P<password>[^@/\s]+)(?=@)")


def looks_secret(key: Any) -> bool:
    """True when a parameter name looks like it holds a token, key, password or secret."""
    words = [w.lower() for w in _WORD_SPLIT.split(str(key)) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words)


def mask_secrets(value: Any, key: Any = None) -> Any:
    """A copy of `value` with every entry whose key looks secret replaced by `MASK`
    (dicts are walked recursively, lists item by item), and passwords inside URLs
    (`postgresql://user:pw@host`) masked. `None` stays `None`: there is nothing to hide."""
    if key is not None and value is not None and looks_secret(key):
        return MASK
    if isinstance(value, dict):
        return {k: mask_secrets(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_secrets(v) for v in value)
    if isinstance(value, str) and "://" in value:
        return _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, value)
    return value


def run_params(args: Any, state: Any = None) -> dict[str, Any]:
    """The hyperparameters a tracker records: `args.to_sanitized_dict()` (bool, int, float,
    str values) plus, during a search, the trial's parameters, with secrets masked."""
    if hasattr(args, "to_sanitized_dict"):
        params = dict(args.to_sanitized_dict())
    elif hasattr(args, "to_dict"):
        params = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in args.to_dict().items()}
    else:
        params = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in vars(args).items()}
    trial_params = getattr(state, "trial_params", None) if state is not None else None
    for k, v in (trial_params or {}).items():
        params[k] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return mask_secrets(params)


# -- values -----------------------------------------------------------------------------------


#: A logged value as the trackers record it: `fitkit.common.logs.as_number` (the one rule) with the
#: trackers' switches: ints stay ints and bools count as 1 / 0 (HF's trackers log every `int`
#: and `float`, and a `bool` is an `int`).
as_number = functools.partial(_logs.as_number, bools=True, keep_ints=True)


def trial_label(args: Any, state: Any) -> str | None:
    """During a search, the trial's name: `state.trial_name`, else the trial's output folder
    (`run-N`); None outside a search."""
    if not getattr(state, "is_hyper_param_search", False):
        return None
    return state.trial_name or os.path.basename(os.path.normpath(args.output_dir))


def is_true(value: str | None) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on", "y", "t"}


#: How a run ended, in MLflow's words (the other trackers map them onto theirs): trained to
#: its end, ended by an exception, or stopped by SIGTERM (preempted) or Ctrl-C.
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"


def saved_run(tracker: Any, state: Any, callbacks: Any = ()) -> dict[str, Any] | None:
    """What the checkpoint a run resumes from recorded about `tracker`'s run (its `state()`,
    kept in `state.stateful_callbacks` under the class name), or None: a fresh run, a
    checkpoint written without this tracker, or one where it had no run. With several
    trackers of one class, the n-th of them in `callbacks` gets the n-th record."""
    if not state.global_step or not state.stateful_callbacks:
        return None
    saved = state.stateful_callbacks.get(type(tracker).__name__)
    if isinstance(saved, list):
        same = [cb for cb in callbacks if type(cb) is type(tracker)]
        index = next((i for i, cb in enumerate(same) if cb is tracker), 0)
        saved = saved[index] if index < len(saved) else None
    run = saved.get("run") if isinstance(saved, dict) else None
    return dict(run) if isinstance(run, dict) and run else None


class TrackingCallback(TrainerCallback):
    """Base of the loggers: only the world-zero process writes.

    Subclasses implement `setup(args, state, model)` (at train begin), `write(values, step,
    state)` (once per `on_log` record, numbers only unless `numbers_only` is False) and
    `close(args, state, final, model)` (at train end; `final` holds the last value of every
    number logged in the run). Values that a callback adds to the final record at train end
    (`CodeCarbonCallback` does) are written before `close`.

    Across a resume: `run_record()` returns what continues the tracker's run (its id, its
    folder); every checkpoint keeps it (`state()`, saved with the callbacks' states), and
    `setup` of the run resumed from that checkpoint finds it in `self.resumed_run` (None in a
    fresh run). How the run ended is in `self.ending` when `close` runs: `FINISHED`, `FAILED`
    (an exception left `fit`, closed from `close_run`) or `KILLED` (SIGTERM or Ctrl-C).
    """

    order = Order.TRACKER  # after callbacks that add or change values in the logs (order <= Order.EMISSIONS)
    numbers_only = True

    def __init__(self) -> None:
        self._active = False
        self._warned_non_numbers = False
        self._last_logs: dict[str, Any] | None = None
        self._last_step: int | None = None
        self.resumed_run: dict[str, Any] | None = None
        self.ending = FINISHED
        self._run: tuple[Any, Any, Any] | None = None  # (args, state, model) of the run open

    # -- for subclasses --------------------------------------------------------------------
    def setup(self, args, state, model) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def write(self, values: dict[str, Any], step: int, state) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self, args, state, final: dict[str, float], model) -> None:
        """Flush and release; default: nothing."""

    def flush(self) -> None:
        """Put what was written so far on disk (called at each checkpoint, so that a run killed
        afterwards, even by kill -9, loses nothing its resume does not log again); default:
        nothing."""

    def run_record(self) -> dict[str, Any]:
        """What continues this tracker's run when training resumes from a checkpoint (JSON
        values: a run id, a folder); default: nothing."""
        return {}

    # -- checkpointed state ------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Saved in every checkpoint (`CallbackHandler.export_states`): `{"run": run_record()}`
        while a run is open here, else `{}`."""
        record = self.run_record() if self._active else {}
        return {"run": record} if record else {}

    def load_state(self, state: dict[str, Any]) -> None:
        """Nothing to restore: a resumed run's record is read at `on_train_begin`, from the
        resumed `state.stateful_callbacks`, because the run is opened there (before the
        callbacks' states come back)."""

    # -- helpers ---------------------------------------------------------------------------
    def numbers(self, logs: dict[str, Any]) -> dict[str, float | int]:
        """The numeric values of `logs`; the others are dropped with one warning per run."""
        out: dict[str, float | int] = {}
        dropped = []
        for key, value in logs.items():
            number = as_number(value)
            if number is None:
                dropped.append(key)
            else:
                out[str(key)] = number
        if dropped and not self._warned_non_numbers:
            self._warned_non_numbers = True
            warnings.warn(
                f"{type(self).__name__} logs numbers only: dropped {sorted(map(str, dropped))} "
                f"(not numbers); later non-numeric values are dropped silently",
                stacklevel=3,
            )
        return out

    @staticmethod
    def final_values(state) -> dict[str, float]:
        """The last value of every number in `state.log_history` (not `step`, `epoch`)."""
        final: dict[str, float] = {}
        for record in state.log_history:
            for key, value in record.items():
                if key in POSITION:
                    continue
                number = as_number(value)
                if number is not None and not (isinstance(number, float) and math.isnan(number)):
                    final[key] = number
        return final

    # -- events ----------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._active:  # a previous run on this instance never reached on_train_end
            self._safe_close(args, state, model)
        self._active = bool(state.is_world_process_zero)
        self._warned_non_numbers = False
        self._last_logs, self._last_step = None, None
        self.ending = FINISHED
        self.resumed_run = saved_run(self, state, kwargs.get("callbacks") or ())
        self._run = (args, state, model)
        if self._active:
            self.setup(args, state, model)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._active or not logs:
            return
        self._last_logs, self._last_step = dict(logs), state.global_step
        values = self.numbers(logs) if self.numbers_only else dict(logs)
        if values:
            self.write(values, state.global_step, state)

    def on_save(self, args, state, control, **kwargs):
        if self._active:
            self.flush()

    def on_train_end(self, args, state, control, model=None, preempted=False, **kwargs):
        if not self._active:
            return
        if preempted:  # SIGTERM: checkpointed, to be resumed
            self.ending = KILLED
        late = self._late_additions(state)
        if late:
            values = self.numbers(late) if self.numbers_only else late
            if values:
                self.write(values, state.global_step, state)
        self._active = False
        self._run = None
        self.close(args, state, self.final_values(state), model)

    def close_run(self) -> None:
        """`fit` is exiting: a run still open here never reached `on_train_end`, so an exception
        (`FAILED`) or Ctrl-C (`KILLED`) ended training; close it with that status."""
        if not self._active or self._run is None:
            return
        args, state, model = self._run
        error = sys.exc_info()[1]  # the exception leaving `fit` (close_run runs in its `finally`)
        self.ending = KILLED if isinstance(error, KeyboardInterrupt) else FAILED
        self._active, self._run = False, None
        self.close(args, state, self.final_values(state), model)

    def _late_additions(self, state) -> dict[str, Any]:
        """Values added to the final record after it was logged (at train end)."""
        if not state.log_history or self._last_logs is None:
            return {}
        record = state.log_history[-1]
        return {k: v for k, v in record.items() if k not in self._last_logs and k not in POSITION}

    def _safe_close(self, args, state, model) -> None:
        self._active = False
        self.ending = FAILED  # it never reached its end
        try:
            self.close(args, state, self.final_values(state), model)
        except Exception as error:  # noqa: BLE001 - a stale run must not stop a new one
            warnings.warn(f"{type(self).__name__}: closing the previous run failed: {error}", stacklevel=2)
