"""The callback system: event order, control semantics, the handler."""

import pytest
import torch
from helpers import Recorder, mlp

import fitkit
from fitkit import Model, TrainerCallback, TrainerControl, TrainerState
from fitkit.callbacks import CallbackHandler, DefaultFlowCallback, History, PrinterCallback, ProgressBar

STEP_WITH_SUBSTEP = ["on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]
STEP_SINGLE = ["on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]


def test_exact_event_sequence_with_gradient_accumulation():
    x = torch.randn(10, 8)
    y = torch.arange(10) % 3
    rec = Recorder()
    model = Model(mlp())
    model.add_callback(rec)
    model.compile("sgd", "cross_entropy", gradient_accumulation_steps=2)
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)  # 5 micro-batches -> steps of 2, 2, 1
    expected = (
        ["on_init_end", "on_train_begin", "on_epoch_begin"]
        + STEP_WITH_SUBSTEP * 2 + STEP_SINGLE
        + ["on_epoch_end", "on_log", "on_log", "on_train_end"]
    )
    assert rec.events == expected
    assert model.state.global_step == 3
    for event, names in rec.kwargs.items():
        if event != "on_init_end":
            assert {"model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"} <= set(names)
    assert "logs" in rec.kwargs["on_log"]


def test_evaluation_and_step_logging_sequence():
    x = torch.randn(8, 8)
    y = torch.arange(8) % 3
    rec = Recorder()
    Model(mlp()).compile("sgd", "cross_entropy").fit(
        x, y, batch_size=4, validation_data=(x[:4], y[:4]), logging_strategy="steps", logging_steps=1,
        eval_strategy="steps", eval_steps=2, eval_batch_size=4, callbacks=[rec], verbose=0,
    )
    step = ["on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]
    evaluation = ["on_prediction_step", "on_log", "on_evaluate"]
    assert rec.events == (
        ["on_train_begin", "on_epoch_begin"]
        + step + ["on_log"]
        + step + ["on_log"] + evaluation
        + ["on_epoch_end", "on_log", "on_train_end"]  # no epoch record under step logging: the closing log only
    )


def test_training_stops_at_the_step_a_callback_asks_and_train_end_fires(blobs):
    x, y = blobs

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                control.should_training_stop = True
            return control

    rec = Recorder()
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=3, batch_size=8, callbacks=[StopAt(), rec], verbose=0)
    assert model.state.global_step == 5
    assert rec.events[-1] == "on_train_end"
    assert rec.events.count("on_epoch_begin") == 1 and rec.events.count("on_step_end") == 5


def test_epoch_stop_is_reset_at_the_next_epoch(blobs):
    x, y = blobs

    class StopEpochs(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_epoch_stop = True

    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=3, batch_size=8, callbacks=[StopEpochs()], verbose=0)
    assert model.state.global_step == 3  # one step per epoch
    assert [r["epoch"] for r in model.state.log_history][:3] == [round(e + 1 / 30, 4) for e in range(3)]


def test_stop_training_exception_is_graceful(blobs, caplog):
    x, y = blobs

    class Quit(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise fitkit.StopTraining("enough for today")

    rec = Recorder()
    model = Model(mlp()).compile("adam", "cross_entropy")
    with caplog.at_level("WARNING", logger="fitkit"):
        model.fit(x, y, epochs=2, batch_size=8, callbacks=[Quit(), rec], verbose=0)
    assert model.state.global_step == 3
    assert rec.events[-1] == "on_train_end"
    assert "enough for today" in caplog.text
    assert [r["stopped"] for r in model.state.log_history if "stopped" in r] == ["enough for today"]


def test_returned_control_replaces_the_one_in_force(blobs):
    x, y = blobs
    seen = []

    class Replace(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            new = TrainerControl(should_training_stop=True)
            seen.append(new)
            return new

    class Check(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(control)

    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=2, callbacks=[Replace(), Check()], verbose=0)
    assert seen[1] is seen[0] and model.state.global_step == 1


def test_callbacks_fire_in_list_order_and_order_attribute(blobs):
    x, y = blobs
    calls = []

    def make(name, order=0):
        class C(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                calls.append(name)

        C.order = order
        C.__name__ = name
        return C()

    late = make("late", order=5)
    Model(mlp()).compile("adam", "cross_entropy").fit(
        x, y, verbose=0, callbacks=[late, make("a"), make("b"), make("c")]
    )
    assert calls == ["a", "b", "c", "late"]


def test_handler_only_calls_callbacks_that_override_an_event():
    class OnlyLog(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs = logs

    handler = CallbackHandler([DefaultFlowCallback(), OnlyLog(), TrainerCallback()])
    assert handler.listeners("on_step_begin") == []
    assert [m.__self__.__class__ for m in handler.listeners("on_step_end")] == [DefaultFlowCallback]
    assert [m.__self__.__class__ for m in handler.listeners("on_log")] == [OnlyLog]


def test_handler_skips_the_hooks_declared_no_op_and_calls_every_override(blobs):
    from fitkit.callbacks import Callback, no_op

    calls = []

    class Base(TrainerCallback):  # a class of one's own with declared empty defaults
        @no_op
        def on_step_begin(self, args, state, control, **kwargs):
            calls.append("never")

        @no_op
        def on_log(self, args, state, control, logs=None, **kwargs):
            ...

    class Busy(Base):
        def on_step_end(self, args, state, control, **kwargs):
            calls.append(state.global_step)

        def on_epoch_end(self, args, state, control, **kwargs):
            pass  # an override is a listener whatever its body: nothing reads bytecode

    base, busy = Base(), Busy()
    handler = CallbackHandler([base, busy, TrainerCallback()])
    assert CallbackHandler([Callback()]).listeners("on_log") == []  # Keras' base hooks are declared too
    for event in ("on_step_begin", "on_log", "on_evaluate", "on_save", "on_train_begin"):
        assert handler.listeners(event) == [], event  # the bases' hooks and the declared no-ops
    assert [m.__self__ for m in handler.listeners("on_step_end")] == [busy]
    assert [m.__self__ for m in handler.listeners("on_epoch_end")] == [busy]
    # an instance attribute set at run time is a listener too
    base.on_train_end = lambda args, state, control, **kwargs: calls.append("end")
    handler.invalidate()
    assert len(handler.listeners("on_train_end")) == 1
    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=1, batch_size=32, verbose=0,
                                                       callbacks=[base, busy])
    assert calls == list(range(1, -(-len(x) // 32) + 1)) + ["end"]


def test_add_pop_remove_callback_by_class_and_instance():
    model = Model(mlp())
    assert [type(c) for c in model.callbacks] == [DefaultFlowCallback]
    printer = PrinterCallback()
    model.add_callback(printer)
    model.add_callback(ProgressBar)
    assert [type(c) for c in model.callbacks] == [DefaultFlowCallback, PrinterCallback, ProgressBar]
    with pytest.warns(UserWarning, match="already one"):
        model.add_callback(PrinterCallback)
    assert model.pop_callback(printer) is printer
    popped = model.pop_callback(PrinterCallback)
    assert isinstance(popped, PrinterCallback) and popped is not printer
    assert model.pop_callback(PrinterCallback) is None
    model.remove_callback(ProgressBar)
    assert [type(c) for c in model.callbacks] == [DefaultFlowCallback]


def test_custom_event_reaches_only_callbacks_that_define_it():
    got = []

    class Verifier(TrainerCallback):
        def on_verify_batch(self, args, state, control, batch=None, **kwargs):
            got.append(batch)

    handler = CallbackHandler([DefaultFlowCallback(), Verifier(), TrainerCallback()])
    control = handler.call_event("on_verify_batch", None, TrainerState(), TrainerControl(), batch=7)
    assert got == [7] and isinstance(control, TrainerControl)


def test_hf_style_callback_uses_args_state_control(blobs, tmp_path):
    x, y = blobs
    seen = {}

    class HFStyle(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen["output_dir"] = args.output_dir
            seen["history"] = list(state.log_history)
            seen["epoch"] = state.epoch

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= 4:
                control.should_training_stop = True
            return control

    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, callbacks=[HFStyle], epochs=3, output_dir=str(tmp_path), verbose=0)
    assert seen["output_dir"] == str(tmp_path)
    assert model.state.global_step == 4 and seen["history"][-1]["step"] == 4
    assert seen["epoch"] == pytest.approx(4 / 8)


def test_trainer_state_json_round_trip(tmp_path):
    state = TrainerState(epoch=1.5, global_step=12, max_steps=40, log_history=[{"loss": 0.5, "step": 12}],
                         best_metric=0.25, trial_params={"lr": 0.1}, stateful_callbacks={"X": {"args": {}}})
    path = tmp_path / "trainer_state.json"
    state.save_to_json(str(path))
    assert TrainerState.load_from_json(str(path)) == state
    for name in ("epoch", "global_step", "max_steps", "num_train_epochs", "logging_steps", "eval_steps",
                 "save_steps", "train_batch_size", "num_input_tokens_seen", "total_flos", "log_history",
                 "best_metric", "best_model_checkpoint", "is_local_process_zero", "is_world_process_zero",
                 "is_hyper_param_search", "trial_name", "trial_params", "stateful_callbacks"):
        assert hasattr(state, name)


def test_control_flags_reset_as_in_hf():
    handler = CallbackHandler([])
    control = TrainerControl(should_training_stop=True, should_epoch_stop=True, should_save=True,
                             should_evaluate=True, should_log=True)
    handler.on_step_begin(None, TrainerState(), control)
    assert (control.should_save, control.should_evaluate, control.should_log) == (False, False, False)
    assert control.should_epoch_stop and control.should_training_stop
    handler.on_epoch_begin(None, TrainerState(), control)
    assert not control.should_epoch_stop and control.should_training_stop


def test_the_handler_takes_its_events_as_a_callback_does():
    """The handler stands where a callback is expected: each event takes a callback's signature,
    `event(args, state, control, **kwargs)`, and passes the keyword arguments on (it took only
    `(args, state, control)` for most events, and required `metrics` / `logs`)."""
    seen = {}

    class Keep(TrainerCallback):
        def on_epoch_end(self, args, state, control, **kwargs):
            seen["epoch_end"] = kwargs.get("note")

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            seen["evaluate"] = metrics

    handler, args = CallbackHandler([DefaultFlowCallback(), Keep()]), fitkit.TrainingArguments()
    control = TrainerControl(should_evaluate=True)
    assert handler.on_epoch_end(args, TrainerState(), control, note="x") is control
    handler.on_evaluate(args, TrainerState(), control)
    assert seen == {"epoch_end": "x", "evaluate": None} and not control.should_evaluate


def test_history_is_a_callback_with_keras_fields(blobs):
    x, y = blobs
    h = Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, verbose=0,
                                                          logging_strategy="steps", logging_steps=3)
    assert isinstance(h, History) and isinstance(h, TrainerCallback)
    assert h.epoch == [0, 1] and len(h.history["loss"]) == 2
    assert h.params == {"epochs": 2, "steps": 8, "verbose": 0}


def test_instance_attribute_handlers_are_listeners_and_removable_by_class():
    from fitkit.callbacks import LambdaCallback

    got = []
    cb = LambdaCallback(on_log=lambda args, state, control, logs=None, **kw: got.append(logs))
    handler = CallbackHandler([DefaultFlowCallback(), cb])
    assert len(handler.listeners("on_log")) == 1 and handler.listeners("on_step_end")[0].__self__ is not cb
    handler.on_log(None, TrainerState(), TrainerControl(), {"loss": 1.0})
    assert got == [{"loss": 1.0}]
    assert handler.pop_callback(LambdaCallback) is cb and handler.listeners("on_log") == []


def test_fitkits_own_events_are_the_handlers_methods_with_the_keywords_declared(blobs, monkeypatch):
    """fitkit's own events (`MOMENTS`) are fired through the handler's methods of their names, each
    with the keyword arguments `fitkit.events.state` lists; a run where nobody listens to
    `on_epoch_summary` never builds its `logs`."""
    from fitkit.engine import loop as loop_module
    from fitkit.events.state import MOMENTS

    seen, fired, built = {}, [], []

    def recorder(event):
        def method(self, args, state, control, **kwargs):
            seen.setdefault(event, []).append(kwargs)
        return method

    def spy(event):
        real = getattr(CallbackHandler, event)

        def method(self, *args, **kwargs):
            fired.append(event)
            return real(self, *args, **kwargs)
        return method

    for event in MOMENTS:
        monkeypatch.setattr(CallbackHandler, event, spy(event))  # raises when the handler has no such method
    real_values = loop_module.epoch_values
    monkeypatch.setattr(loop_module, "epoch_values", lambda loop: built.append(1) or real_values(loop))
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy", metrics=["accuracy"])
    model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    assert built == []  # no listener: the epoch's values are not built

    Moments = type("Moments", (TrainerCallback,), {event: recorder(event) for event in MOMENTS})
    model.fit(x, y, epochs=2, batch_size=32, verbose=0, validation_data=(x, y), callbacks=[Moments()])
    model.evaluate(x, y, verbose=0, callbacks=[Moments()])
    model.predict(x, verbose=0, callbacks=[Moments()])
    assert set(fired) == set(MOMENTS) and len(built) == 2
    common = {"model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader", "save_checkpoint"}
    extra = {event: {frozenset(set(kw) - common) for kw in calls} for event, calls in seen.items()}
    assert extra == {"on_evaluate_begin": {frozenset({"running_logs"})}, "on_prediction_step_begin": {frozenset()},
                     "on_predict_begin": {frozenset()}, "on_epoch_summary": {frozenset({"epoch", "logs"})}}
    summaries = seen["on_epoch_summary"]
    assert [kw["epoch"] for kw in summaries] == [0, 1]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(summaries[-1]["logs"])
