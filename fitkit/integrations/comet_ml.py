"""`CometCallback` (`report_to="comet_ml"`): a Comet experiment per fit.

Needs `comet_ml` (`pip install "fitkit[comet_ml]"`), imported when training starts.

Environment (Comet's own variables work too: `COMET_API_KEY`, `COMET_WORKSPACE`, ...):

- `COMET_MODE`: `ONLINE` (default), `OFFLINE` (an archive `<experiment key>.zip` is written
  to `COMET_OFFLINE_DIRECTORY`; upload it later with `comet upload`) or `DISABLED`.
- `COMET_OFFLINE_DIRECTORY`: where offline archives go (default `args.output_dir/comet`).
- `COMET_PROJECT_NAME`: the project (default `"fitkit"`).
- `COMET_LOG_ASSETS`: true logs the final weights (`state_dict`) as a model asset.
- `COMET_EXPERIMENT_KEY`: the experiment to log into (Comet's own variable); it wins over the
  experiment a resumed checkpoint names.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from fitkit.common.urls import local_dir
from fitkit.integrations._common import FINISHED, TrackingCallback, is_true, require, run_params, trial_label

if TYPE_CHECKING:
    from comet_ml import BaseExperiment

DEFAULT_PROJECT = "fitkit"
# fitkit logs what it means to log; Comet's automatic capture (stdout, code, git, env) is off.
_QUIET = dict(
    auto_output_logging=False, auto_metric_logging=False, auto_param_logging=False, log_code=False,
    log_graph=False, log_env_details=False, log_git_metadata=False, log_git_patch=False,
    display_summary_level=0,
)


class CometCallback(TrackingCallback):
    """Creates a Comet experiment at train begin (online, offline or disabled per `COMET_MODE`)
    with the `TrainingArguments` as parameters (secrets masked), logs every `on_log` number
    at `state.global_step`, and ends the experiment at train end (offline: writes the
    archive). During a search each trial is its own experiment named after the trial.

    Resumed from a checkpoint, the experiment of the checkpoint's training is continued
    (`ExistingExperiment`, offline `ExistingOfflineExperiment`: a second archive of the same
    experiment key) unless `COMET_EXPERIMENT_KEY` names another. A run that does not end
    normally is marked: the other value `fitkit_status` is `failed` (an exception) or
    `killed` (SIGTERM), and the experiment gets that tag; a finished run logs `finished`.

    Example::

        # COMET_MODE=OFFLINE COMET_OFFLINE_DIRECTORY=comet python train.py
        model.fit(x, y, validation_split=0.1, report_to="comet_ml")
    """

    def __init__(self, project_name: str | None = None, **experiment_kwargs: Any) -> None:
        super().__init__()
        self.mode = os.environ.get("COMET_MODE", "ONLINE").strip().upper()
        if self.mode not in ("ONLINE", "OFFLINE", "DISABLED"):
            raise ValueError(f"COMET_MODE={self.mode!r} is invalid: use ONLINE, OFFLINE or DISABLED")
        if self.mode != "DISABLED":
            require("comet_ml")
        self.project_name = project_name
        self.experiment_kwargs = experiment_kwargs
        self.experiment: BaseExperiment | None = None
        self.offline_directory: str | None = None
        self._key: str | None = None

    def setup(self, args, state, model) -> None:
        self.experiment = None
        if self.mode == "DISABLED":
            return
        # fitkit turns Comet's automatic logging off (below); say so before the import, which
        # otherwise warns that torch was imported first.
        os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
        import comet_ml

        kwargs: dict[str, Any] = {
            **_QUIET,
            "project_name": self.project_name or os.environ.get("COMET_PROJECT_NAME") or DEFAULT_PROJECT,
            **self.experiment_kwargs,
        }
        previous = (self.resumed_run or {}).get("experiment_key")
        if os.environ.get("COMET_EXPERIMENT_KEY") or "experiment_key" in kwargs:
            previous = None  # the user's choice wins
        experiment: BaseExperiment
        if self.mode == "OFFLINE":
            self.offline_directory = os.environ.get("COMET_OFFLINE_DIRECTORY") or os.path.join(local_dir(args.output_dir), "comet")
            os.makedirs(self.offline_directory, exist_ok=True)
            if previous:
                experiment = comet_ml.ExistingOfflineExperiment(
                    previous_experiment=previous, offline_directory=self.offline_directory, **kwargs)
            else:
                experiment = comet_ml.OfflineExperiment(offline_directory=self.offline_directory, **kwargs)
        elif previous:
            experiment = comet_ml.ExistingExperiment(previous_experiment=previous, **kwargs)
        else:
            experiment = comet_ml.Experiment(**kwargs)
        self.experiment = experiment
        self._key = experiment.get_key()
        label = trial_label(args, state)
        if label is not None:
            experiment.set_name(label)
            experiment.add_tag("hyperparameter-search")
        experiment.log_other("Created from", "fitkit")
        experiment.log_parameters(run_params(args, state))

    def run_record(self) -> dict[str, Any]:
        return {"experiment_key": self._key} if self._key else {}

    def write(self, values: dict[str, Any], step: int, state) -> None:
        if self.experiment is not None:
            self.experiment.log_metrics(values, step=step)

    def close(self, args, state, final: dict[str, float], model) -> None:
        experiment, self.experiment = self.experiment, None
        if experiment is None:
            return
        tmp = None
        try:
            status = self.ending.lower()
            experiment.log_other("fitkit_status", status)
            if self.ending != FINISHED:
                experiment.add_tag(status)
            if self.ending == FINISHED and model is not None and is_true(os.environ.get("COMET_LOG_ASSETS")):
                import torch

                tmp = tempfile.mkdtemp(prefix="fitkit-comet-")
                path = os.path.join(tmp, "model_state_dict.pt")
                torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
                experiment.log_model("fitkit-model", path)
        finally:
            experiment.end()  # waits for uploads (online) or writes the archive (offline)
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
