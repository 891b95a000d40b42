"""`WandbCallback` (`report_to="wandb"`): a Weights & Biases run per fit.

Needs `wandb` (`pip install "fitkit[wandb]"`), imported when training starts.

Environment (wandb's own variables work too: `WANDB_API_KEY`, `WANDB_ENTITY`, ...):

- `WANDB_MODE`: `online` (default), `offline` (written under `WANDB_DIR`, upload later with
  `wandb sync`) or `disabled`.
- `WANDB_DISABLED`: true turns the callback off without importing wandb.
- `WANDB_PROJECT`: the project (default `"fitkit"`).
- `WANDB_DIR`: where the local run folder goes (default `args.output_dir`).
- `WANDB_RUN_GROUP`: the group; during a search the trials share one named after the search folder.
- `WANDB_WATCH`: `gradients`, `parameters` or `all` to log histograms through `wandb.watch`
  (default `false`).
- `WANDB_RUN_ID`: the run to log into (wandb's own variable); it wins over the run a resumed
  checkpoint names.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, cast

from fitkit.common.urls import local_dir
from fitkit.integrations._common import (
    FAILED,
    FINISHED,
    KILLED,
    TrackingCallback,
    is_true,
    require,
    run_params,
    trial_label,
)

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

DEFAULT_PROJECT = "fitkit"
#: The exit code a run is finished with, by how training ended (W&B shows non-zero as failed).
EXIT_CODES = {FINISHED: 0, FAILED: 1, KILLED: 143}  # 143: 128 + SIGTERM, as a shell reports it


class WandbCallback(TrackingCallback):
    """Starts a W&B run at train begin with the `TrainingArguments` as its config (secrets
    masked), logs every `on_log` number at `state.global_step`, writes the final value of
    every metric to the run summary and finishes the run at train end.

    When a run is already active (`wandb.init()` called by the user) fitkit logs into it
    and leaves it open. During a search each trial is its own run, named after the trial
    and grouped by search.

    Resumed from a checkpoint, the run of the checkpoint's training is continued
    (`wandb.init(id=..., resume="must")`) unless `WANDB_RUN_ID`, an `id` given to this callback
    or another run name asks otherwise; online, steps the run already holds are not logged
    again. A run ended by an exception is finished with exit code 1, a SIGTERM stop with 143.

    Example::

        # WANDB_MODE=offline WANDB_PROJECT=digits python train.py
        model.fit(x, y, validation_split=0.1, report_to="wandb")
    """

    def __init__(self, project: str | None = None, **init_kwargs: Any) -> None:
        super().__init__()
        self.disabled = is_true(os.environ.get("WANDB_DISABLED"))
        if not self.disabled:
            require("wandb")
        self.project = project
        self.init_kwargs = init_kwargs
        self.run: Run | None = None
        self._owns_run = False
        self._name: str | None = None
        self._first_new_step = 0  # a continued run: the steps before this one it holds already

    def setup(self, args, state, model) -> None:
        if self.disabled:
            self.run = None
            return
        import wandb

        if wandb.run is not None and not state.is_hyper_param_search:
            self.run, self._owns_run = wandb.run, False
            self.run.config.update(run_params(args, state), allow_val_change=True)
        else:
            directory = os.environ.get("WANDB_DIR") or local_dir(args.output_dir)
            os.makedirs(directory, exist_ok=True)
            label = trial_label(args, state)
            kwargs: dict[str, Any] = {
                "project": self.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                "dir": directory,
                "config": run_params(args, state),
                "reinit": "finish_previous",
            }
            mode = os.environ.get("WANDB_MODE")
            if mode:  # passed on: wandb reads its environment once per process
                kwargs["mode"] = mode.strip().lower()
            group = os.environ.get("WANDB_RUN_GROUP")
            if label is not None:
                kwargs["name"] = label
                search = os.path.basename(os.path.dirname(os.path.normpath(os.path.abspath(local_dir(args.output_dir)))))
                kwargs["group"] = group or f"{search or 'search'}-search"
            elif group:
                kwargs["group"] = group
            if label is None and getattr(args, "run_name", None):
                kwargs["name"] = args.run_name
            kwargs.update(self.init_kwargs)
            continued = self._continued(kwargs.get("name"))
            if continued is not None and "id" not in kwargs:
                kwargs.update(id=continued, resume="must")
            try:
                self.run = wandb.init(**kwargs)
            except TypeError:  # wandb < 0.19 takes reinit=True only
                kwargs["reinit"] = True
                self.run = wandb.init(**kwargs)
            self._owns_run = True
            self._name = kwargs.get("name")
            # resumed online, wandb knows the run's next step; offline it starts at 0
            self._first_new_step = int(getattr(self.run, "step", 0) or 0) if continued is not None else 0
        watch = os.environ.get("WANDB_WATCH", "false").lower()
        if model is not None and watch in ("gradients", "parameters", "all"):
            log = cast(Literal["gradients", "parameters", "all"], watch)  # one of them: checked above
            self.run.watch(model, log=log, log_freq=max(100, args.logging_steps))

    def _continued(self, name: str | None) -> str | None:
        """The id of the checkpoint's run when it is to be continued: no other run is named
        (`WANDB_RUN_ID`, another run name)."""
        saved = self.resumed_run or {}
        if not saved.get("run_id") or os.environ.get("WANDB_RUN_ID"):
            return None
        if name is not None and name != saved.get("name"):
            return None
        return str(saved["run_id"])

    def run_record(self) -> dict[str, Any]:
        if self.run is None or not self._owns_run:
            return {}
        return {"run_id": self.run.id, "name": self._name}

    def write(self, values: dict[str, Any], step: int, state) -> None:
        if self.run is None:
            return
        if self._owns_run:
            if step < self._first_new_step:  # replayed after a resume: the run holds it
                return
            self.run.log(values, step=step)
        else:  # the user's run has its own step counter
            self.run.log({**values, "train/global_step": step})

    def close(self, args, state, final: dict[str, float], model) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        run.summary.update(final)
        if self._owns_run:
            run.finish(exit_code=EXIT_CODES.get(self.ending, 1))
