"""The shared base of the monitors (`MonitorCallback`), the directions of logged values
(`metric_directions`, `fitkit.common.logs.direction`), `fitkit.common.logs.as_number`, `Order` and
`Stateful`."""

import math
import os
import warnings

import numpy as np
import pytest
import torch
import torchmetrics
from helpers import Script, mlp
from helpers import blobs as data

from fitkit import Model, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from fitkit.adapters.metric_specs import metric_directions
from fitkit.callbacks import (
    CallbackHandler,
    CSVLogger,
    DefaultFlowCallback,
    EarlyStopping,
    EarlyStoppingCallback,
    History,
    ModelCheckpoint,
    Order,
    PrinterCallback,
    ProgressBar,
    ReduceLROnPlateau,
    Stateful,
)
from fitkit.callbacks._monitor import MonitorCallback
from fitkit.common.logs import (
    BOOKKEEPING,
    LEARNING_RATE,
    NOT_VALUES,
    POSITION,
    as_number,
    direction,
    direction_from_name,
)

MONITORS = (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, EarlyStoppingCallback)


class AccuracyDrop(torchmetrics.Metric):
    """The error rate under a name that reads "higher is better" (`accuracy` in it): only the
    metric's own `higher_is_better` tells the truth."""

    higher_is_better = False

    def __init__(self):
        super().__init__()
        self.add_state("wrong", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, preds, target):
        self.wrong += (preds.argmax(-1) != target).float().sum()
        self.count += target.numel()

    def compute(self):
        return self.wrong / self.count


NAME = "val_accuracy_drop"  # how fitkit logs AccuracyDrop's validation value


def fit(callbacks, epochs=3, metrics=("accuracy",), lr=0.01, **options):
    model = Model(mlp()).compile("adam", "cross_entropy", list(metrics), learning_rate=lr)
    history = model.fit(*data(), batch_size=16, epochs=epochs, validation_data=data(16, 1), callbacks=callbacks,
                        verbose=0, seed=0, **options)
    return model, history


class Directions(TrainerCallback):
    """Keeps the `metric_directions` keyword of `on_train_begin`."""

    def __init__(self):
        self.seen = "not called"

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen = kwargs.get("metric_directions", "absent")


def evaluations(callback, values, directions=None, key=NAME, **kwargs):
    """Drive `callback` through a run by its events: one epoch per value, each ending with an
    evaluation whose metrics hold `{key: value}`. Returns the control and the epochs run."""
    args = TrainingArguments(eval_strategy="epoch", metric_for_best_model=key)
    state, control = TrainerState(num_train_epochs=len(values)), TrainerControl()
    begin = {} if directions is None else {"metric_directions": directions}
    callback.on_train_begin(args, state, control, **begin, **kwargs)
    run = 0
    for epoch, value in enumerate(values):
        state.epoch = float(epoch)
        callback.on_epoch_begin(args, state, control, **kwargs)
        state.epoch, state.global_step = float(epoch + 1), epoch + 1
        control.should_evaluate = True
        callback.on_epoch_end(args, state, control, **kwargs)
        callback.on_evaluate(args, state, control, metrics={key: value}, **kwargs)
        control.should_evaluate = False
        run += 1
        if control.should_training_stop:
            break
    callback.on_train_end(args, state, control, **kwargs)
    return control, run


# -- (a) one base under the four monitors -----------------------------------------------------------------------
@pytest.mark.parametrize("cls", MONITORS)
def test_the_four_monitors_share_the_base(cls):
    assert issubclass(cls, MonitorCallback)
    assert cls.order == Order.MONITOR == 10


def test_the_four_monitors_watch_the_same_fit(tmp_path):
    stop = EarlyStopping(monitor="val_loss", patience=10)
    plateau = ReduceLROnPlateau(monitor="val_loss", patience=10)
    best = ModelCheckpoint(str(tmp_path / "best.pt"), monitor="val_loss", save_best_only=True, save_weights_only=True)
    hf = EarlyStoppingCallback(early_stopping_patience=10)
    _, history = fit([stop, plateau, best, hf], epochs=3)
    losses = history.history["val_loss"]
    assert len(losses) == 3
    assert stop.best == pytest.approx(min(losses)) and plateau.best == pytest.approx(min(losses))
    assert hf.best_metric == pytest.approx(min(losses)) and best.best == pytest.approx(min(losses))
    assert os.path.isfile(tmp_path / "best.pt") and best.last_filepath == str(tmp_path / "best.pt")


def test_missing_value_warns_once_per_run_for_each_monitor(tmp_path):
    monitors = [EarlyStopping(monitor="val_f1"), ReduceLROnPlateau(monitor="val_f1"),
                ModelCheckpoint(str(tmp_path / "w.pt"), monitor="val_f1", save_best_only=True)]
    hf = EarlyStoppingCallback(0)
    for _ in range(2):  # each run warns again, once; then the run's best-metric check raises (HF 5.x)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="'val_f1' matches none of the evaluation's values"):
                fit([*monitors, hf], epochs=2, metric_for_best_model="val_f1")
        about = [str(w.message) for w in caught if "'val_f1'" in str(w.message)]
        assert len(about) == 4, about
    assert os.listdir(tmp_path) == ["w.pt"]  # ModelCheckpoint saves anyway, as Keras


def test_state_loaded_before_a_fit_survives_its_train_begin_only():
    stop = EarlyStopping(patience=3)
    stop.load_state({"wait": 2, "best": -1.0, "best_epoch": 0, "stopped_epoch": 0})
    evaluations(stop, [1.0], key="val_loss")  # kept: 2 + 1 evaluation without improvement = patience
    assert stop.stopped and stop.wait == 3 and stop.best == -1.0
    evaluations(stop, [1.0], key="val_loss")  # the next run starts afresh
    assert not stop.stopped and stop.wait == 0 and stop.best == 1.0


# -- (b) directions from the metric objects -------------------------------------------------------------------------
def test_name_alone_gets_the_direction_of_accuracy_drop_wrong():
    assert direction_from_name(NAME) == "max"
    assert metric_directions([AccuracyDrop()])[NAME] == "min"


def test_early_stopping_takes_the_direction_from_metric_directions():
    falling = [0.5, 0.4, 0.3, 0.2]  # an error rate going down: improving
    by_name = EarlyStopping(monitor=NAME, patience=1)
    assert evaluations(by_name, falling) == (TrainerControl(should_training_stop=True), 2)
    by_metric = EarlyStopping(monitor=NAME, patience=1)
    control, run = evaluations(by_metric, falling, metric_directions([AccuracyDrop()]))
    assert run == 4 and not control.should_training_stop and by_metric.best == 0.2
    # the next run without directions goes back to the name's direction
    assert evaluations(by_metric, falling)[1] == 2


def test_explicit_mode_and_other_names_ignore_metric_directions():
    falling = [0.5, 0.4, 0.3]
    explicit = EarlyStopping(monitor=NAME, patience=1, mode="max")
    assert evaluations(explicit, falling, {NAME: "min"})[1] == 2
    other = EarlyStopping(monitor="val_loss", patience=1)
    assert evaluations(other, [0.5, 0.6, 0.7], {NAME: "max"}, key="val_loss")[1] == 2


def test_reduce_lr_on_plateau_takes_the_direction_from_metric_directions():
    def rates(directions):
        optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        plateau = ReduceLROnPlateau(monitor=NAME, patience=1, factor=0.5)
        evaluations(plateau, [0.5, 0.4, 0.3], directions, optimizer=optimizer)
        return optimizer.param_groups[0]["lr"]

    assert rates(None) == pytest.approx(0.025)  # "max": two evaluations without improvement, two cuts
    assert rates(metric_directions([AccuracyDrop()])) == pytest.approx(0.1)  # "min": improving, no cut


def test_model_checkpoint_takes_the_direction_from_metric_directions(tmp_path):
    module = mlp()
    for folder, directions in (("by_name", None), ("by_metric", metric_directions([AccuracyDrop()]))):
        ckpt = ModelCheckpoint(str(tmp_path / folder / "w-{epoch}.pt"), monitor=NAME, save_best_only=True)
        evaluations(ckpt, [0.5, 0.6, 0.3], directions, model=module)
        names = sorted(os.listdir(tmp_path / folder))
        assert names == (["w-1.pt", "w-2.pt"] if directions is None else ["w-1.pt", "w-3.pt"]), folder


def test_hf_early_stopping_takes_the_direction_from_metric_directions():
    falling = [0.5, 0.4, 0.3, 0.2]
    by_name = EarlyStoppingCallback(1)  # "loss" not in the name: greater is better
    assert evaluations(by_name, falling)[1] == 2
    by_metric = EarlyStoppingCallback(1)
    assert evaluations(by_metric, falling, metric_directions([AccuracyDrop()]))[1] == 4
    assert by_metric.best_metric == 0.2
    # the bare name is looked up too, and greater_is_better, when given, still decides
    bare = EarlyStoppingCallback(1)
    args = TrainingArguments(eval_strategy="epoch", metric_for_best_model="accuracy_drop", greater_is_better=True)
    bare.on_train_begin(args, TrainerState(), TrainerControl(), metric_directions={"val_accuracy_drop": "min"})
    assert bare._greater
    args = args.replace(greater_is_better=None)
    bare.on_train_begin(args, TrainerState(), TrainerControl(), metric_directions={"val_accuracy_drop": "min"})
    assert not bare._greater


def test_the_handler_passes_metric_directions_to_on_train_begin_only():
    seen = Directions()
    stop = EarlyStopping(monitor=NAME, patience=1)
    handler = CallbackHandler([seen, stop])
    assert handler.metric_directions == {}
    handler.metric_directions = metric_directions([AccuracyDrop()])
    args, state, control = TrainingArguments(eval_strategy="epoch"), TrainerState(), TrainerControl()
    handler.on_train_begin(args, state, control)
    assert seen.seen == handler.metric_directions and seen.seen is not handler.metric_directions
    assert stop._direction == "min"

    class Other(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            self.kwargs = kwargs

    other = Other()
    handler.add_callback(other)
    handler.on_epoch_begin(args, state, control)
    assert "metric_directions" not in other.kwargs


def test_fit_with_a_custom_metric_follows_the_metric_s_direction():
    seen = Directions()
    stop = EarlyStopping(monitor=NAME, patience=1)
    hf = EarlyStoppingCallback(1)
    script = Script(NAME, [0.5, 0.4, 0.3, 0.2])  # falling: improving for an error rate
    _, history = fit([seen, script, stop, hf], epochs=4, metrics=[AccuracyDrop()], metric_for_best_model=NAME)
    assert seen.seen[NAME] == seen.seen["accuracy_drop"] == "min" and seen.seen["val_loss"] == "min"
    assert len(history.epoch) == 4  # by the name ("max") either monitor would stop after the second epoch
    assert not stop.stopped and stop.best == 0.2 and hf.best_metric == 0.2


def test_fit_with_named_metrics_passes_their_directions():
    seen = Directions()
    fit([seen], epochs=1, metrics=["acc", "f1"], lr=0.0)
    assert seen.seen["val_acc"] == seen.seen["acc"] == seen.seen["val_f1"] == "max"
    x, _ = data()
    regression = Model(mlp(d_out=1)).compile("adam", "mse", ["mae"])
    regression.fit(x, x.sum(1, keepdim=True), epochs=1, validation_split=0.25, callbacks=[seen], verbose=0)
    assert seen.seen["val_mae"] == seen.seen["mae"] == "min" and "val_acc" not in seen.seen


# -- metric_directions and direction ------------------------------------------------------------------------------
def test_metric_directions_of_names_objects_and_callables():
    def my_score(preds, target):
        return preds.mean()

    found = metric_directions(["accuracy", "f1", "precision", "recall", "auroc", "mae", "mse", "acc",
                               torchmetrics.MeanAbsoluteError(), AccuracyDrop(), my_score])
    for name in ("accuracy", "f1", "precision", "recall", "auroc", "acc"):
        assert found[name] == found["val_" + name] == "max", name
    for name in ("mae", "mse", "mean_absolute_error", "accuracy_drop", "loss"):
        assert found[name] == found["val_" + name] == "min", name
    assert "my_score" not in found and "val_my_score" not in found
    assert metric_directions(None) == {"loss": "min", "val_loss": "min"}
    assert metric_directions("auroc")["val_auroc"] == "max"


def test_metric_directions_builds_nothing():
    metric = AccuracyDrop()
    metric_directions([metric])
    assert metric.count == 0 and metric._update_count == 0


def test_direction_prefers_the_metric_then_the_name():
    assert direction("val_accuracy_drop", {"val_accuracy_drop": "min"}) == "min"
    assert direction("val_accuracy_drop", {}) == "max"
    assert direction("val_accuracy_drop", None) == "max"
    assert direction("val_loss", {"val_accuracy": "max"}) == "min"
    assert direction("val_custom_score", {"val_custom_score": "max"}) == "max"
    assert direction("val_custom_score") is None
    assert direction("val_custom_score", {"val_custom_score": "sideways"}) is None


# -- (c) as_number --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, number", [
    (0.5, 0.5), (3, 3.0), (-2, -2.0), (np.float32(0.25), 0.25), (np.float64(1.5), 1.5), (np.int64(7), 7.0),
    (torch.tensor(2.5), 2.5), (torch.tensor([3]), 3.0), (torch.tensor([[4.0]]), 4.0), (np.array([1.5]), 1.5),
])
def test_as_number_reads_numbers_as_floats(value, number):
    result = as_number(value)
    assert type(result) is float and result == number
    kept = as_number(value, keep_ints=True)
    integral = isinstance(value, (int, np.integer))
    integral = integral or (isinstance(value, torch.Tensor) and not value.is_floating_point())
    assert type(kept) is (int if integral else float) and kept == number


@pytest.mark.parametrize("value", [True, False, np.True_, torch.tensor(True), torch.tensor([False])])
def test_as_number_reads_bools_only_when_asked(value):
    assert as_number(value) is None
    assert as_number(value, bools=True) == float(bool(value)) and type(as_number(value, bools=True)) is float
    assert as_number(value, bools=True, keep_ints=True) == int(bool(value))
    assert type(as_number(value, bools=True, keep_ints=True)) is int


@pytest.mark.parametrize("value", [None, "1.0", torch.ones(2), torch.zeros(0), np.ones(3), 1 + 2j, [1.0], {"a": 1}])
def test_as_number_is_none_for_anything_else(value):
    assert as_number(value) is None and as_number(value, bools=True, keep_ints=True) is None


def test_as_number_keeps_nan_and_infinity():
    assert math.isnan(as_number(float("nan"))) and math.isnan(as_number(torch.tensor(float("nan"))))
    assert as_number(np.float32("inf")) == math.inf


def test_trackers_read_numbers_with_the_same_rule():
    from fitkit.integrations._common import as_number as tracked

    for value in (True, 3, np.int64(3), torch.tensor([3]), 2.5, torch.tensor(2.5), "x", torch.ones(2), None):
        assert tracked(value) == as_number(value, bools=True, keep_ints=True)
        assert type(tracked(value)) is type(as_number(value, bools=True, keep_ints=True))


def test_keys_that_are_not_values():
    assert POSITION == {"epoch", "step"}
    assert BOOKKEEPING == {"epoch", "step", "total_flos"}
    assert NOT_VALUES == BOOKKEEPING | {LEARNING_RATE} and LEARNING_RATE == "learning_rate"
    history = History()
    record = {"loss": 0.5, "learning_rate": 0.1, "epoch": 1.0, "step": 4, "total_flos": 9.0, "flag": True}
    history.on_log(TrainingArguments(), TrainerState(epoch=1.0), TrainerControl(), logs=record)
    assert history.history == {"loss": [0.5]} and history.epoch == [0]


# -- (d) Order ------------------------------------------------------------------------------------------------------
def test_order_values():
    assert (Order.FLOW, Order.USER, Order.MONITOR, Order.LOGGER, Order.EMISSIONS, Order.TRACKER, Order.DISPLAY) == (
        -(10**9), 0, 10, 50, 55, 60, 100)


def test_built_in_callbacks_use_the_named_orders():
    from fitkit.integrations._common import TrackingCallback
    from fitkit.integrations.codecarbon import CodeCarbonCallback

    assert DefaultFlowCallback.order == Order.FLOW
    assert TrainerCallback.order == PrinterCallback.order == Order.USER
    assert CSVLogger.order == Order.LOGGER
    assert CodeCarbonCallback.order == Order.EMISSIONS
    assert TrackingCallback.order == Order.TRACKER
    assert ProgressBar.order == Order.DISPLAY


def test_callbacks_fire_in_order_of_the_named_values():
    fired = []

    class Tap(TrainerCallback):
        def __init__(self, name, order):
            self.name, self.order = name, order

        def on_train_begin(self, args, state, control, **kwargs):
            fired.append(self.name)

    names = ["display", "tracker", "logger", "monitor", "user", "flow"]
    values = [Order.DISPLAY, Order.TRACKER, Order.LOGGER, Order.MONITOR, Order.USER, Order.FLOW]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # several Taps: the handler warns about repeated classes
        handler = CallbackHandler([Tap(n, v) for n, v in zip(names, values)])
    handler.on_train_begin(TrainingArguments(), TrainerState(), TrainerControl())
    assert fired == names[::-1]


# -- Stateful -------------------------------------------------------------------------------------------------------
def test_stateful_callbacks_and_the_hf_layout(tmp_path):
    class Counter(TrainerCallback):
        def __init__(self):
            self.steps = 0

        def state(self):
            return {"steps": self.steps}

        def load_state(self, state):
            self.steps = state["steps"] + 100

    class Exportable(TrainerCallback):  # HF's ExportableState: state() only
        def __init__(self):
            self.best = None

        def state(self):
            return {"args": {}, "attributes": {"best": self.best}}

    for cb in (Counter(), EarlyStopping(), ModelCheckpoint(str(tmp_path / "w.pt")), CSVLogger(str(tmp_path / "l.csv")),
               EarlyStoppingCallback()):
        assert isinstance(cb, Stateful), type(cb).__name__
    assert not isinstance(Exportable(), Stateful) and not isinstance(ProgressBar(), Stateful)

    counter, exportable = Counter(), Exportable()
    counter.steps, exportable.best = 3, 0.25
    handler = CallbackHandler([counter, exportable])
    saved = handler.export_states(TrainerControl())
    assert saved["Counter"] == {"steps": 3} and saved["Exportable"]["attributes"] == {"best": 0.25}
    fresh_counter, fresh_exportable = Counter(), Exportable()
    CallbackHandler([fresh_counter, fresh_exportable]).load_states(saved, TrainerControl())
    assert fresh_counter.steps == 103 and fresh_exportable.best == 0.25
