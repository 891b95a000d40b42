"""The contract between the engine and the callbacks: what the loop shares with them.

`TrainerState` (where the run is), `TrainerControl` (the switches callbacks flip),
`StopTraining`, the `Stateful` protocol for state kept in checkpoints, the `Order` of
callbacks, the names of the documented events (`EVENTS`) and of fitkit's own (`MOMENTS`). The
engine imports these (and the handler in `fitkit.events.handler`), never a concrete callback::

    from fitkit.events.state import TrainerControl, TrainerState

    state, control = TrainerState(max_steps=100), TrainerControl()
    control.should_save = True
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

#: The documented events, in the order a run first meets them.
EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_train_begin",
    "on_epoch_begin",
    "on_step_begin",
    "on_substep_end",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_step_end",
    "on_log",
    "on_evaluate",
    "on_save",
    "on_epoch_end",
    "on_train_end",
    "on_prediction_step",
    "on_predict",
)

#: fitkit's own events: moments the documented set has no event for (Keras' `on_test_begin`,
#: `on_test_batch_begin`, `on_predict_begin`, and its `on_epoch_end` after the epoch's validation).
#: The loop fires them through `CallbackHandler`'s methods of the same names; a callback handles
#: one by defining that method, `event(args, state, control, **kwargs)`. The keyword arguments
#: each carries, besides the ones of every event (`model`, `optimizer`, `lr_scheduler`,
#: `train_dataloader`, `eval_dataloader`, `save_checkpoint`):
#:
#: | event | when | keyword arguments |
#: | --- | --- | --- |
#: | `on_evaluate_begin` | before an evaluation's first batch | `running_logs` (the loop's running averages) |
#: | `on_prediction_step_begin` | before each evaluation or prediction batch | none |
#: | `on_predict_begin` | before `predict`'s first batch | none |
#: | `on_epoch_summary` | after the epoch's `on_epoch_end`, its log, evaluation and save | `epoch` (0-based), `logs` (the epoch's values, validation included) |
MOMENTS: tuple[str, ...] = ("on_evaluate_begin", "on_prediction_step_begin", "on_predict_begin", "on_epoch_summary")


class Order:
    """Named values of `TrainerCallback.order`: callbacks run in increasing `order`, equal
    orders in list order. A callback that reads values others add to the logs runs after them::

        class MyMetric(TrainerCallback):
            order = Order.USER  # the default: before the monitors, which see what it adds

        class MyReport(TrainerCallback):
            order = Order.LOGGER  # after the monitors, before the trackers and the display
    """

    #: `DefaultFlowCallback`: first, it sets the `control` switches the others read.
    FLOW = -(10**9)
    #: The default of `TrainerCallback.order`: user callbacks that add or change values.
    USER = 0
    #: Callbacks that watch a value: `EarlyStopping`, `ModelCheckpoint`, `ReduceLROnPlateau`,
    #: HF's `EarlyStoppingCallback`, any `MonitorCallback`.
    MONITOR = 10
    #: Loggers of the values: `CSVLogger`, the hyperparameter search's trial reporter.
    LOGGER = 50
    #: `CodeCarbonCallback`: adds its figures to the final record before the trackers close.
    EMISSIONS = 55
    #: The experiment trackers of `fitkit.integrations` (TensorBoard, MLflow, W&B, ...).
    TRACKER = 60
    #: The progress display (`ProgressBar`): last, it shows what everything else logged.
    DISPLAY = 100


@runtime_checkable
class Stateful(Protocol):
    """What a callback implements to have its state saved in checkpoints and given back on
    resume: `state()` returns a JSON-able dict, `load_state(state)` takes that dict back.

    `CallbackHandler.export_states` saves `state()` of every callback that has one (HF's
    `ExportableState` callbacks, which have no `load_state`, included); `load_states` calls
    `load_state` of a `Stateful` callback, and on any other sets the `"attributes"` of HF's
    `{"args": ..., "attributes": ...}` layout. Either layout may be returned by `state()`::

        class Counter(TrainerCallback):
            def __init__(self):
                self.steps = 0

            def on_step_end(self, args, state, control, **kwargs):
                self.steps += 1

            def state(self) -> dict:
                return {"steps": self.steps}

            def load_state(self, state: dict) -> None:
                self.steps = state["steps"]

        isinstance(Counter(), Stateful)  # True
    """

    def state(self) -> dict:
        """The callback's state, as a JSON-able dict."""
        ...

    def load_state(self, state: dict) -> None:
        """Take back a dict `state()` returned."""
        ...


@runtime_checkable
class OffersCheckpoint(Protocol):
    """What a callback implements to offer a checkpoint to resume from when
    `resume_from_checkpoint` is not set (`BackupAndRestore` does): the path, or None::

        class ResumeFromBackup(TrainerCallback):
            def checkpoint_to_resume(self, args) -> str | None:
                return "backups/checkpoint-40" if os.path.isdir("backups/checkpoint-40") else None

    The checkpoint offered is verified before anything is loaded.
    """

    def checkpoint_to_resume(self, args: Any) -> str | None:
        """The checkpoint to resume from, or None."""
        ...


class StopTraining(Exception):
    """Raise from any callback (or an overridden step) to stop training gracefully.

    The current step completes, `on_train_end` still fires and the reason is logged::

        class StopAt(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 10:
                    raise fitkit.StopTraining("enough for today")
    """


@dataclass
class TrainerState:
    """Where the run is; saved with every checkpoint as `trainer_state.json`.

    One *step* is one optimizer update: with `gradient_accumulation_steps=n` it spans `n`
    micro-batches. `epoch` is a float whose fraction is the part of the epoch done.
    """

    epoch: float | None = None
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0.0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, Any] | None = None
    stateful_callbacks: dict[str, Any] = field(default_factory=dict)

    def save_to_json(self, json_path: str) -> None:
        """Write this state as JSON to `json_path`."""
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(text)

    @classmethod
    def load_from_json(cls, json_path: str) -> TrainerState:
        """Create a state from the JSON written by `save_to_json` (fitkit's or the HF Trainer's:
        keys fitkit does not know are left out); ValueError when it holds no JSON object."""
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TrainerControl:
    """Switches callbacks flip to steer the loop (HF semantics).

    `should_training_stop` is reset only when a new `fit` begins; `should_epoch_stop` at each epoch begin;
    `should_save`, `should_evaluate` and `should_log` are reset at each step begin.
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict[str, Any]:
        """The flags as a JSON-able dict (stored in checkpoints)."""
        return {"args": dataclasses.asdict(self), "attributes": {}}
