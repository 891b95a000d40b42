"""`MLflowCallback` (`report_to="mlflow"`): parameters, metrics and (optionally) the model in MLflow.

Talks to MLflow through `MlflowClient`, so it does not disturb the runs a user drives with
`mlflow.start_run()`. Needs `mlflow` or `mlflow-skinny` (`pip install "fitkit[mlflow]"`),
imported when training starts.

Environment:

- `MLFLOW_TRACKING_URI`: where runs go (a server, `sqlite:///...`, `databricks`, an AzureML
  workspace's `azureml://...` URI). Default: a local file store `args.output_dir/mlruns`.
- `MLFLOW_EXPERIMENT_NAME`: the experiment (default `"fitkit"`).
- `MLFLOW_RUN_ID`: log into this existing run instead of creating one (also on resume).
- `MLFLOW_RUN_NAME`: the run's name (during a search each trial is named after the trial); a
  resumed run asked for another name than the checkpoint's run has starts a new run.
- `MLFLOW_TAGS`: a JSON object of tags for the run.
- `HF_MLFLOW_LOG_ARTIFACTS` / `MLFLOW_LOG_ARTIFACTS`: when true, the final weights
  (`state_dict`, saved with `torch.save`) are logged as the artifact `model/model_state_dict.pt`.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fitkit.common.urls import local_dir
from fitkit.integrations._common import (
    FINISHED,
    TrackingCallback,
    is_true,
    require,
    run_params,
    trial_label,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

DEFAULT_EXPERIMENT = "fitkit"
_PARENT_TAG = "mlflow.parentRunId"
# During a search: the parent run of each (tracking URI, experiment, search folder).
_SEARCH_PARENTS: dict[tuple[str, str, str], str] = {}
_KEY_OK = re.compile(r"[^A-Za-z0-9_\-. /]")


def _limits() -> tuple[int, int, int, int]:
    """MLflow's limits: param value length, key length, params per batch, metrics per batch."""
    try:
        from mlflow.utils import validation as v

        return (getattr(v, "MAX_PARAM_VAL_LENGTH", 250), getattr(v, "MAX_ENTITY_KEY_LENGTH", 250),
                getattr(v, "MAX_PARAMS_TAGS_PER_BATCH", 100), getattr(v, "MAX_METRICS_PER_BATCH", 1000))
    except ImportError:  # pragma: no cover - very old MLflow
        return 250, 250, 100, 1000


def _key(name: str, max_len: int) -> str:
    return _KEY_OK.sub("_", str(name))[:max_len]


def default_tracking_uri(output_dir: str) -> str:
    """The local file store under `output_dir/mlruns`, as a `file:` URI."""
    return Path(output_dir, "mlruns").resolve().as_uri()


class MLflowCallback(TrackingCallback):
    """Records a run in MLflow: the `TrainingArguments` as parameters (sanitized, secrets
    masked, values cut to MLflow's length limit), every `on_log` number as a metric at
    `state.global_step`, the final weights as an artifact when `HF_MLFLOW_LOG_ARTIFACTS` (or
    `MLFLOW_LOG_ARTIFACTS`) is true, and ends the run at train end.

    During `hyperparameter_search` each trial is a run nested under one parent run per search,
    named after the trial (`state.trial_name`, else `run-N`) with the trial's parameters.
    When a run is active in `mlflow` (a `with mlflow.start_run():` around `fit`), fitkit's run
    is nested under it. See the module docstring for the environment variables.

    Resumed from a checkpoint (`resume_from_checkpoint`), the run that checkpoint's training
    logged to is continued (`MLFLOW_RUN_ID` or another run name still win): steps it already
    holds are not logged again, parameters it lacks are added. A run ends `FINISHED`, `FAILED`
    when an exception ends training, `KILLED` on SIGTERM (until its resume continues it).

    Example::

        model.fit(x, y, validation_split=0.1, report_to="mlflow", output_dir="out")
        # mlflow ui --backend-store-uri out/mlruns
    """

    def __init__(self, tracking_uri: str | None = None, experiment_name: str | None = None) -> None:
        super().__init__()
        require("mlflow")
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.client: MlflowClient | None = None
        self.run_id: str | None = None
        self.parent_run_id: str | None = None
        self._exit_hook: Callable[[], None] | None = None
        self._name: str | None = None  # the name asked for when the run was created
        self._logged_through: dict[str, int] = {}  # a continued run: the last step of each metric it holds

    # -- set-up --------------------------------------------------------------------------------
    def _resolve_uri(self, args) -> str:
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            return uri
        uri = default_tracking_uri(local_dir(args.output_dir))
        # MLflow 3.x asks for an opt-in before using a file store; this default is ours, so opt in
        # (a value the user set, even "false", is left alone).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        return uri

    def _experiment_id(self, client) -> str:
        name = self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return client.create_experiment(name)
        except Exception:
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def _search_parent(self, client, uri: str, experiment_id: str, args, tags: dict) -> str:
        """The parent run of this search (created at its first trial, reopened by later ones)."""
        folder = os.path.dirname(os.path.normpath(os.path.abspath(local_dir(args.output_dir))))
        key = (uri, experiment_id, folder)
        trial_dir = os.path.basename(os.path.normpath(args.output_dir))
        parent = _SEARCH_PARENTS.get(key)
        if parent is not None and trial_dir != "run-0":
            try:
                client.update_run(parent, status="RUNNING")
                return parent
            except Exception:  # noqa: BLE001 - deleted meanwhile: start a new parent
                pass
        name = f"{os.path.basename(folder) or 'search'}-search"
        parent = client.create_run(experiment_id, run_name=name, tags={**tags, "fitkit.search": "parent"}).info.run_id
        _SEARCH_PARENTS[key] = parent
        return parent

    def setup(self, args, state, model) -> None:
        import mlflow
        from mlflow.tracking import MlflowClient

        uri = self._resolve_uri(args)
        self.client = client = MlflowClient(tracking_uri=uri)
        self.parent_run_id = None
        tags = json.loads(os.environ["MLFLOW_TAGS"]) if os.environ.get("MLFLOW_TAGS") else {}
        tags = {str(k): str(v) for k, v in tags.items()}
        label = trial_label(args, state)
        name = label or os.environ.get("MLFLOW_RUN_NAME") or getattr(args, "run_name", None) or None
        existing = os.environ.get("MLFLOW_RUN_ID") or self._continued(client, name)
        self._logged_through = {}
        if existing:
            self.run_id = existing
            client.update_run(existing, status="RUNNING")
            if existing != os.environ.get("MLFLOW_RUN_ID"):
                self._name = name or (self.resumed_run or {}).get("name")
                self.parent_run_id = (self.resumed_run or {}).get("parent_run_id")
                if self.parent_run_id is not None:
                    client.update_run(self.parent_run_id, status="RUNNING")
            self._logged_through = self._last_steps(client, existing)
            if tags:
                self._log_batch(tags=tags)
        else:
            experiment_id = self._experiment_id(client)
            run_tags = dict(tags)
            if label is not None:
                self.parent_run_id = self._search_parent(client, uri, experiment_id, args, tags)
                run_tags["fitkit.trial"] = label
            else:
                active = mlflow.active_run()
                if active is not None and mlflow.get_tracking_uri() == uri:
                    run_tags[_PARENT_TAG] = active.info.run_id
            if self.parent_run_id is not None:
                run_tags[_PARENT_TAG] = self.parent_run_id
            run = client.create_run(experiment_id, run_name=name, tags=run_tags)
            self.run_id, self._name = run.info.run_id, name
        self._exit_hook = atexit.register(self._abandoned)
        params = run_params(args, state)
        if existing:  # MLflow refuses to change a logged parameter: add only the new ones
            held = client.get_run(existing).data.params
            params = {k: v for k, v in params.items() if k not in held}
        self._log_params(params)

    def _continued(self, client, name: str | None) -> str | None:
        """The run of the checkpoint this training resumes from, when it is to be continued:
        it is in this tracking store and no other run name is asked for."""
        saved = self.resumed_run or {}
        run_id = saved.get("run_id")
        if not run_id or (name is not None and name != saved.get("name")):
            return None
        try:
            client.get_run(run_id)
        except Exception as error:  # noqa: BLE001 - deleted, or another store: a new run then
            warnings.warn(f"MLflowCallback: the checkpoint's run {run_id} cannot be continued ({error}); "
                          "starting a new run", stacklevel=3)
            return None
        return run_id

    @staticmethod
    def _last_steps(client, run_id: str) -> dict[str, int]:
        """The last step of each metric `run_id` holds (what a resumed run must not log again)."""
        steps: dict[str, int] = {}
        for key in client.get_run(run_id).data.metrics:
            history = client.get_metric_history(run_id, key)
            if history:
                steps[key] = max(m.step for m in history)
        return steps

    def run_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"run_id": self.run_id, "name": self._name}
        if self.parent_run_id is not None:
            record["parent_run_id"] = self.parent_run_id
        return record if self.run_id else {}

    def _abandoned(self) -> None:
        """At interpreter exit with the run still open (training raised): mark it failed."""
        if self.client is not None and self.run_id is not None:
            try:
                self.client.set_terminated(self.run_id, status="FAILED")
                if self.parent_run_id is not None:
                    self.client.set_terminated(self.parent_run_id, status="FAILED")
            except Exception:  # noqa: BLE001 - best effort at exit
                pass

    # -- logging -------------------------------------------------------------------------------
    def _log_batch(self, metrics=(), params=(), tags=None) -> None:
        from mlflow.entities import RunTag

        assert self.client is not None and self.run_id is not None  # the run `setup` opened
        self.client.log_batch(self.run_id, metrics=list(metrics), params=list(params),
                              tags=[RunTag(k, v) for k, v in (tags or {}).items()])

    def _log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        max_val, max_key, per_batch, _ = _limits()
        entries = [Param(_key(k, max_key), str(v)[:max_val]) for k, v in params.items()]
        for i in range(0, len(entries), per_batch):
            self._log_batch(params=entries[i:i + per_batch])

    def write(self, values: dict[str, Any], step: int, state) -> None:
        from mlflow.entities import Metric

        _, max_key, _, per_batch = _limits()
        now = int(time.time() * 1000)
        through = self._logged_through  # a continued run: replayed steps it holds already stay as they are
        metrics = [Metric(_key(k, max_key), float(v), now, step) for k, v in values.items()
                   if step > through.get(_key(k, max_key), -1)]
        for i in range(0, len(metrics), per_batch):
            self._log_batch(metrics=metrics[i:i + per_batch])

    def close(self, args, state, final: dict[str, float], model) -> None:
        if self.client is None or self.run_id is None:
            return
        try:
            if self.ending == FINISHED and model is not None and (is_true(os.environ.get("HF_MLFLOW_LOG_ARTIFACTS"))
                                      or is_true(os.environ.get("MLFLOW_LOG_ARTIFACTS"))):
                self._log_model(model)
        finally:
            if self._exit_hook is not None:
                atexit.unregister(self._abandoned)
                self._exit_hook = None
            self.client.set_terminated(self.run_id, status=self.ending)
            if self.parent_run_id is not None:
                self.client.set_terminated(self.parent_run_id, status=self.ending)

    def _log_model(self, model) -> None:
        import torch

        assert self.client is not None and self.run_id is not None  # checked by `close`
        with tempfile.TemporaryDirectory(prefix="fitkit-mlflow-") as tmp:
            path = os.path.join(tmp, "model_state_dict.pt")
            state_dict = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            torch.save(state_dict, path)
            self.client.log_artifact(self.run_id, path, artifact_path="model")
