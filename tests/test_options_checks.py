"""The options side of DESIGN section 7: every misuse of an option is a clear, early error naming
the argument and the fix (with "did you mean" for a misspelt name); nothing silently accepted,
nothing dropped. Each error is raised before any training step and before anything is written to
`output_dir`; the legitimate look-alikes do the right thing."""

import pathlib
import re

import numpy as np
import pytest
import torch
from helpers import blobs, mlp

from fitkit import Model, TrainerCallback, TrainingArguments
from fitkit.callbacks import EarlyStopping, LambdaCallback
from fitkit.common.options import check_output_dir, did_you_mean, parse_number
from fitkit.config.compile_config import CompileConfig


class Run:
    """A compiled model on 48 samples, its starting weights, and an `output_dir` that must stay empty."""

    def __init__(self, tmp_path: pathlib.Path, **compile_options):
        self.out = tmp_path / "out"
        self.x, self.y = blobs(48)
        self.model = Model(mlp()).compile("adam", "cross_entropy", **compile_options)
        self.start = {k: v.clone() for k, v in self.model.module.state_dict().items()}

    def fit(self, **options):
        options = {"verbose": 0, "output_dir": str(self.out), "save_strategy": "epoch", **options}
        return self.model.fit(self.x, self.y, **options)

    def untouched(self) -> bool:
        """No step ran, the weights are the starting ones, and nothing was written."""
        same = all(torch.equal(v, self.start[k]) for k, v in self.model.module.state_dict().items())
        return self.model.state.global_step == 0 and same and not self.out.exists()


def _raises(error, run: Run, match: str, **options) -> str:
    with pytest.raises(error, match=match) as caught:
        run.fit(**options)
    assert run.untouched(), "a step ran or a file was written before the error"
    return str(caught.value)


# -- 1. TrainingArguments: types and ranges of every field --------------------------------------
def test_numbers_given_as_text_are_converted():
    args = TrainingArguments.from_options(weight_decay="0.01", learning_rate="1e-3", epochs="3", seed=" 7 ",
                                          max_grad_norm="1", batch_size=np.int64(16), warmup_ratio=np.float32(0.25))
    assert args.weight_decay == pytest.approx(0.01) and isinstance(args.weight_decay, float)
    assert args.learning_rate == pytest.approx(1e-3)
    assert args.num_train_epochs == 3 and type(args.num_train_epochs) is int
    assert args.seed == 7 and args.max_grad_norm == 1.0 and type(args.max_grad_norm) is float
    assert args.per_device_train_batch_size == 16 and type(args.per_device_train_batch_size) is int
    assert args.warmup_ratio == 0.25
    assert '"weight_decay": 0.01' in args.to_json_string()
    path = TrainingArguments(output_dir=pathlib.Path("some/dir"))
    assert path.output_dir == "some/dir"


def test_compile_with_text_numbers_trains(tmp_path):
    run = Run(tmp_path, weight_decay="0.01", learning_rate="1e-3", epochs="2")
    assert run.model.config.args.weight_decay == pytest.approx(0.01)
    history = run.fit(save_strategy="no")
    assert len(history.epoch) == 2


@pytest.mark.parametrize("options, named, fix", [
    ({"learning_rate": "fast"}, "`learning_rate`='fast'", "finite number >= 0"),
    ({"weight_decay": "0.01x"}, "`weight_decay`='0.01x'", "finite number >= 0"),
    ({"weight_decay": -0.1}, "`weight_decay`=-0.1", ">= 0"),
    ({"learning_rate": float("nan")}, "`learning_rate`=nan", "finite"),
    ({"epochs": "three"}, "`epochs`='three'", "number of epochs > 0"),
    ({"epochs": "-1.5"}, "`epochs`='-1.5'", "number of epochs > 0"),  # HF: epochs may be a float (1.5)
    ({"epochs": 0.0}, "`epochs`=0.0", "number of epochs > 0"),
    ({"logging_steps": 1.5}, "`logging_steps`=1.5", r"integer > 0 \(steps\) or a fraction in \(0, 1\)"),
    ({"eval_delay": -1}, "`eval_delay`=-1", ">= 0"),
    ({"batch_size": 2.5}, "`batch_size`=2.5", "integer > 0"),
    ({"batch_size": True}, "`batch_size`=True", "integer > 0"),
    ({"max_steps": -5}, "`max_steps`=-5", "-1 to train by epochs"),
    ({"max_steps": 0}, "`max_steps`=0", "-1 to train by epochs"),
    ({"shuffle": "no"}, "`shuffle`='no'", "True or False"),
    ({"shuffle": 0}, "`shuffle`=0", "True or False"),
    ({"load_best_model_at_end": "yes"}, "`load_best_model_at_end`='yes'", "True or False"),
    ({"seed": True}, "`seed`=True", "integer or None"),
    ({"seed": "lucky"}, "`seed`='lucky'", "integer or None"),
    ({"verbose": True}, "`verbose`=True", r"0 \(silent\), 1"),
    ({"warmup_steps": -1}, "`warmup_steps`=-1", "integer >= 0"),
    ({"save_total_limit": 0}, "`save_total_limit`=0", "integer > 0, or None"),
    ({"output_dir": ""}, "`output_dir`=''", "path of a folder"),
    ({"metric_for_best_model": None, "load_best_model_at_end": True}, "`metric_for_best_model`=None",
     "name of a logged value"),
    ({"eval_strategy": "epochs"}, "`eval_strategy`='epochs'", "did you mean 'epoch'\\? use one of"),
    ({"save_strategy": "Best"}, "`save_strategy`='Best'", "did you mean 'best'\\?"),
    ({"precision": "bf16_mixed"}, "`precision`='bf16_mixed'", "did you mean 'bf16-mixed'\\?"),
    ({"lr_scheduler": "cosin"}, "`lr_scheduler`='cosin'", "did you mean 'cosine'\\?"),
    ({"log_level": "warn"}, "`log_level`='warn'", "did you mean 'warning'\\?"),
])
def test_bad_values_name_the_option_as_given_and_the_fix(options, named, fix):
    with pytest.raises(ValueError) as caught:
        TrainingArguments.from_options(**options)
    message = str(caught.value)
    assert message.startswith(named + " is invalid: "), message
    assert re.search(fix, message), message
    with pytest.raises(ValueError, match=re.escape(named)):  # replace() names it the same way
        TrainingArguments().replace(**options)


def test_fields_are_checked_when_built_directly():
    with pytest.raises(ValueError, match=r"^`per_device_train_batch_size`=0 is invalid: pass an integer > 0$"):
        TrainingArguments(per_device_train_batch_size=0)
    with pytest.raises(ValueError, match="`skip_memory_metrics`='false' is invalid: pass True or False"):
        TrainingArguments(skip_memory_metrics="false")
    with pytest.raises(TypeError, match="`report_to` takes names"):
        TrainingArguments(report_to=[42])
    assert TrainingArguments(max_steps=-1).max_steps == -1 and TrainingArguments(max_steps="5").max_steps == 5


def test_an_alias_and_its_field_together_are_refused():
    with pytest.raises(TypeError, match="`epochs` and `num_train_epochs` are the same option: pass only one"):
        TrainingArguments.from_options(epochs=3, num_train_epochs=2)


def test_fit_rejects_bad_values_before_any_step(tmp_path):
    run = Run(tmp_path)
    _raises(ValueError, run, r"^`max_steps`=-5 is invalid", max_steps=-5)
    _raises(ValueError, run, r"^`shuffle`='no' is invalid: pass True or False", shuffle="no")
    _raises(ValueError, run, r"^`epochs`=0 is invalid: pass a number of epochs > 0", epochs=0)
    _raises(ValueError, run, r"^`weight_decay`='heavy' is invalid", weight_decay="heavy")


# -- 2. unknown options: did you mean --------------------------------------------------------------
def test_did_you_mean_helper():
    assert did_you_mean("epoch", ["epochs", "seed"]) == "did you mean 'epochs'? "
    assert did_you_mean("EPOCHS", ["epochs"]) == "did you mean 'epochs'? "
    assert did_you_mean("zzz", ["epochs", "seed"]) == ""
    assert did_you_mean(["epoch", "sed"], ["epochs", "seed"]) == "did you mean 'epochs' for 'epoch', 'seed' for 'sed'? "
    assert parse_number("1e-3", float) == 1e-3 and parse_number("3", int) == 3
    assert parse_number(True, int) is None and parse_number("inf", float) is None and parse_number(2.0, int) is None
    assert parse_number(3, int) == 3 and parse_number(3, float) == 3.0 and type(parse_number(3, float)) is float
    assert parse_number(float("nan"), float) is None and parse_number(float("-inf"), float) is None
    assert parse_number(False, float) is None and parse_number(0.5, float) == 0.5


def test_replace_gives_what_dataclasses_replace_gives():
    """`TrainingArguments.replace` copies the fields instead of constructing anew: the same values,
    converted and checked as the constructor does, and a copy independent of the original."""
    import dataclasses

    from fitkit import TrainingArguments

    base = TrainingArguments(learning_rate=1e-3, output_dir="out", report_to=["none"])
    assert base.replace(epochs=2).num_train_epochs == 2 and "_replaced" in base.__dict__  # base holds a memo now
    changed = base.replace(lr="2e-3", epochs=3, eval_strategy="epoch")
    assert changed == dataclasses.replace(base, learning_rate=2e-3, num_train_epochs=3, eval_strategy="epoch")
    assert changed.learning_rate == 2e-3 and base.learning_rate == 1e-3 and base.eval_strategy is None
    assert "_replaced" not in changed.__dict__  # the original's memo of replacements is not copied
    assert changed.report_to == ["none"] and changed.names() == base.names() == [f.name for f in dataclasses.fields(base)]
    with pytest.raises(ValueError, match="`epochs`=0"):
        base.replace(epochs=0)
    with pytest.raises(ValueError, match="eval_strategy"):
        base.replace(eval_strategy="epochs")


def test_unknown_compile_option_leads_with_the_suggestion():
    with pytest.raises(TypeError) as caught:
        Model(mlp()).compile("adam", "mse", epoch=3)
    message = str(caught.value)
    assert message.startswith("did you mean 'epochs'? unknown option 'epoch'; valid options are: ")
    assert "learning_rate" in message  # then the list
    with pytest.raises(TypeError, match="did you mean 'learning_rate'\\? unknown option 'learning_rat'"):
        Model(mlp()).compile("adam", "mse", learning_rat=0.1)
    with pytest.raises(TypeError, match="^unknown option 'zzz'; valid options are: "):  # nothing close: the list
        TrainingArguments.from_options(zzz=1)
    with pytest.raises(TypeError, match="did you mean 'save_strategy'\\?"):
        TrainingArguments().replace(save_stratgy="epoch")


def test_unknown_fit_option_raises_even_when_none(tmp_path):
    run = Run(tmp_path)
    message = _raises(TypeError, run, "unknown option 'foo'", foo=None)
    assert "valid options are" in message
    _raises(TypeError, run, "^did you mean 'epochs'\\? unknown option 'epoch'", epoch=3)
    _raises(TypeError, run, "^did you mean 'eval_strategy'\\? unknown option 'eval_stratgy'", eval_stratgy=None)


def test_an_option_set_to_none_is_that_value(tmp_path):
    # None is "not given" only for fit's own batch_size / epochs / shuffle / max_steps
    model = Model(mlp()).compile("adam", "mse", seed=3, eval_steps=5)
    assert model.training_arguments(seed=None).seed is None
    assert model.training_arguments(eval_steps=None).eval_steps is None
    assert model.training_arguments(epochs=None, batch_size=None).num_train_epochs == 1
    with pytest.raises(ValueError, match="`logging_steps`=None is invalid"):
        model.training_arguments(logging_steps=None)


@pytest.mark.parametrize("options, message", [
    ({"strategy": "ddpp"}, "did you mean 'ddp'? unknown strategy 'ddpp' for `strategy`; valid names are: auto, "),
    ({"accelerator": "CPU"}, "did you mean 'cpu'? unknown accelerator 'CPU' for `accelerator`; valid names are: "),
    ({"accelerator": "quantum"}, "unknown accelerator 'quantum' for `accelerator`; valid names are: auto, cpu"),
])
def test_unknown_device_names_suggest_the_closest(options, message):
    with pytest.raises(ValueError) as caught:
        Model(mlp()).compile("adam", "mse", **options)
    assert str(caught.value).startswith(message), str(caught.value)


def test_unknown_report_to_name_suggests_the_closest(tmp_path):
    run = Run(tmp_path)
    _raises(ValueError, run, "^did you mean 'tensorboard'\\? unknown `report_to` value 'tensorbord'",
            report_to="tensorbord")


def test_lambda_callback_suggests_the_event():
    with pytest.raises(TypeError, match="^LambdaCallback: did you mean 'on_epoch_end'\\? `on_epoch_ends` is not one "):
        LambdaCallback(on_epoch_ends=print)


# -- 3. compile's options are fit's defaults; fit's explicit values win ------------------------------
def test_compile_epochs_and_batch_size_are_fit_defaults(tmp_path):
    run = Run(tmp_path, epochs=3, batch_size=16)
    history = run.fit(save_strategy="no")
    assert len(history.epoch) == 3 and run.model.state.global_step == 3 * 3  # 48 samples / 16
    history = run.fit(save_strategy="no", epochs=2, batch_size=24)  # explicit values win
    assert len(history.epoch) == 2 and run.model.state.global_step == 2 * 2


def test_compile_shuffle_and_max_steps_are_fit_defaults():
    model = Model(mlp()).compile("adam", "cross_entropy", shuffle=False, max_steps=2)
    args = model.training_arguments(batch_size=None, epochs=None, shuffle=None, max_steps=None)
    assert args.shuffle is False and args.max_steps == 2
    assert model.training_arguments(shuffle=True, max_steps=-1).shuffle is True
    x, y = blobs(48)
    model.fit(x, y, batch_size=8, epochs=5, verbose=0)
    assert model.state.global_step == 2
    # with nothing from compile, fit's documented defaults
    args = Model(mlp()).compile("adam", "mse").training_arguments(batch_size=None, epochs=None, shuffle=None)
    assert (args.per_device_train_batch_size, args.num_train_epochs, args.shuffle, args.max_steps) == (32, 1, True, -1)


# -- 4. args= and options together are merged -----------------------------------------------------
def test_args_and_options_are_merged_options_win(tmp_path):
    run = Run(tmp_path, epochs=5)  # compile < args= < fit's keywords (fitkit.config.option_merge)
    args = TrainingArguments(num_train_epochs=1, per_device_train_batch_size=16, verbose=0, output_dir=str(run.out))
    history = run.model.fit(run.x, run.y, args=args, epochs=3)
    assert len(history.epoch) == 3 and run.model.state.global_step == 3 * 3  # args' batch size kept
    assert run.model.training_arguments(args).num_train_epochs == 1  # args alone: as given
    assert args.num_train_epochs == 1  # the caller's args are not changed


def test_args_of_another_type_is_a_type_error(tmp_path):
    run = Run(tmp_path)
    _raises(TypeError, run, "^`args` must be a fitkit.TrainingArguments, got dict", args={"num_train_epochs": 2})


# -- 5. callbacks ------------------------------------------------------------------------------------
class NeedsArgs(TrainerCallback):
    def __init__(self, threshold):
        self.threshold = threshold


@pytest.mark.parametrize("callbacks, match", [
    (EarlyStopping(), r"^`callbacks` must be a list of callbacks; got EarlyStopping: pass it in a list: "
                      r"callbacks=\[EarlyStopping\(\.\.\.\)\]"),
    (EarlyStopping, r"^`callbacks` must be a list of callbacks; got EarlyStopping: .*callbacks=\[EarlyStopping\]"),
    ("early_stopping", r"^`callbacks` must be a list of callbacks; got str"),
    ([42], r"^`callbacks\[0\]`=42 \(int\) is not a callback: pass an instance of a fitkit.TrainerCallback"),
    ([EarlyStopping(), 1.5], r"^`callbacks\[1\]`=1.5 \(float\) is not a callback"),
    ([lambda *a: None], r"^`callbacks\[0\]` is the function <lambda>, not a callback: wrap it in a LambdaCallback, "
                        r"e.g. LambdaCallback\(on_epoch_end="),
    (["early_stopping"], r"^did you mean EarlyStopping\(\)\? `callbacks\[0\]`='early_stopping' is a string"),
    ([NeedsArgs], r"^`callbacks\[0\]` is the class NeedsArgs, whose constructor needs arguments: pass an instance"),
    ([int], r"^`callbacks\[0\]`=int is not a callback"),
])
def test_bad_callbacks_are_named_by_position(tmp_path, callbacks, match):
    _raises(TypeError, Run(tmp_path), match, callbacks=callbacks)


def test_evaluate_predict_and_add_callback_check_callbacks_too(tmp_path):
    run = Run(tmp_path)
    with pytest.raises(TypeError, match=r"^`callbacks\[0\]`=42"):
        run.model.evaluate(run.x, run.y, callbacks=[42])
    with pytest.raises(TypeError, match=r"^`callbacks` must be a list of callbacks; got EarlyStopping"):
        run.model.predict(run.x, callbacks=EarlyStopping())
    with pytest.raises(TypeError, match=r"^`callback`=42 \(int\) is not a callback"):
        run.model.add_callback(42)
    with pytest.raises(TypeError, match="class NeedsArgs, whose constructor needs arguments"):
        run.model.add_callback(NeedsArgs)
    assert [type(c).__name__ for c in run.model.callbacks] == ["DefaultFlowCallback"]


def test_good_callbacks_still_work(tmp_path):
    seen = []

    class DuckTyped:  # not a TrainerCallback subclass: its class defines an event method (as HF's do)
        def on_epoch_end(self, args, state, control, **kwargs):
            seen.append(state.global_step)

    run = Run(tmp_path)
    history = run.fit(callbacks=(EarlyStopping, DuckTyped(), NeedsArgs(1)), epochs=2, batch_size=16,
                      validation_split=0.25, save_strategy="no")
    assert len(history.epoch) == 2 and seen == [3, 6]


def test_a_transformers_callback_is_accepted(tmp_path):
    transformers = pytest.importorskip("transformers")
    calls = []

    class HFOnly(transformers.TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            calls.append(state.global_step)

    run = Run(tmp_path)
    run.fit(callbacks=[HFOnly], batch_size=16, save_strategy="no")
    run.model.add_callback(HFOnly())
    assert calls == [3]


# -- 6. devices and output_dir ------------------------------------------------------------------------
@pytest.mark.parametrize("options, match", [
    ({"devices": 0}, r"^`devices`=0 is invalid: pass a number of devices > 0"),
    ({"devices": -2}, r"^`devices`=-2 is invalid"),
    ({"devices": "abc"}, r"^`devices`='abc' is invalid"),
    ({"devices": True}, r"^`devices`=True is invalid"),
    ({"devices": [], "accelerator": "cpu"}, r"^`devices`=\[\] is invalid"),
    ({"num_nodes": 0}, r"^`num_nodes`=0 is invalid: pass an integer > 0"),
])
def test_bad_device_options_fail_at_compile(options, match):
    with pytest.raises(ValueError, match=match):
        Model(mlp()).compile("adam", "mse", **options)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
@pytest.mark.parametrize("accelerator", ["cuda", "gpu"])
def test_a_gpu_accelerator_without_cuda_fails_at_compile(accelerator):
    with pytest.raises(ValueError, match=rf"^`accelerator`='{accelerator}' but no CUDA GPU is available here.*"
                                         r"use accelerator='cpu', or 'auto'"):
        Model(mlp()).compile("adam", "mse", accelerator=accelerator)


def test_cpu_runs_refuse_gpu_only_device_values(tmp_path):
    with pytest.raises(ValueError, match=r"`devices`=-1 means every GPU, and this run is on CPU"):
        Model(mlp()).compile("adam", "mse", devices=-1)
    with pytest.raises(ValueError, match=r"`devices`='0,1' lists device indices, which only GPUs have"):
        Model(mlp()).compile("adam", "mse", devices="0,1")
    run = Run(tmp_path)
    _raises(ValueError, run, r"^`devices`=0 is invalid", devices=0)  # fit's options are checked too


def test_output_dir_that_is_a_file(tmp_path):
    run = Run(tmp_path)
    run.out.write_text("not a folder")
    with pytest.raises(ValueError, match=r"^`output_dir`='.*out' is an existing file, not a folder"):
        run.fit()  # save_strategy="epoch"
    with pytest.raises(ValueError, match="`output_dir`"):
        run.fit(save_strategy="no", report_to="csv")
    assert run.out.read_text() == "not a folder" and run.model.state.global_step == 0
    run.fit(save_strategy="no")  # nothing is written there: no error
    assert run.model.state.global_step > 0 and run.out.read_text() == "not a folder"
    check_output_dir(TrainingArguments(output_dir=str(tmp_path)))  # a folder is fine


# -- 7. search ------------------------------------------------------------------------------------------
def _search_model():
    return Model(model_init=lambda trial=None: mlp()).compile("adam", "cross_entropy")


def _space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-2)}


def _search(tmp_path, **options):
    pytest.importorskip("optuna")
    x, y = blobs(48)
    options = {"n_trials": 1, "hp_space": _space, "epochs": 1, "verbose": 0, "output_dir": str(tmp_path / "out"),
               **options}
    return _search_model().hyperparameter_search(x, y, **options)


@pytest.mark.parametrize("hp_space, named", [(lambda t: None, "None"), (lambda t: [("learning_rate", 0.1)], "list")])
def test_hp_space_must_return_a_dict(tmp_path, hp_space, named):
    with pytest.raises(ValueError, match=rf"^`hp_space` returned {named}: it must return a dict of option values"):
        _search(tmp_path, hp_space=hp_space)
    assert not (tmp_path / "out").exists()


def test_search_direction_aliases_and_unknown_directions(tmp_path):
    best = _search(tmp_path, direction="max", validation_split=0.25)
    assert best.run_id == "0"
    with pytest.raises(ValueError, match=r"^`direction`='up' is invalid: use 'minimize' or 'maximize'"):
        _search(tmp_path, direction="up")
    with pytest.raises(ValueError, match=r"^`direction`=\['min', 'maximise'\] is invalid: did you mean 'maximize'\?"):
        _search(tmp_path, direction=["min", "maximise"])


@pytest.mark.parametrize("n_trials", [True, 0, "5", 2.0])
def test_n_trials_must_be_a_positive_int(tmp_path, n_trials):
    with pytest.raises(ValueError, match=r"^`n_trials`=.* is invalid: pass an integer > 0"):
        _search(tmp_path, n_trials=n_trials)


def test_unknown_search_option_suggests_the_closest(tmp_path):
    with pytest.raises(TypeError, match=r"^unknown option\(s\) \['n_trial'\] for hyperparameter_search: did you mean "
                                        r"'n_trials'\? valid: "):
        _search(tmp_path, n_trial=3)
    with pytest.raises(TypeError, match=r"did you mean 'study_name'\?"):
        _search(tmp_path, studyname="s")
    with pytest.raises(TypeError, match=r"^`callbacks` must be a list of callbacks; got EarlyStopping"):
        _search(tmp_path, callbacks=EarlyStopping())
    assert not (tmp_path / "out").exists()


def test_compile_config_arguments_merges_in_order():
    config = CompileConfig.build("adam", "mse", epochs=3, seed=1)
    assert config.arguments().num_train_epochs == 3
    assert config.arguments(epochs=None).num_train_epochs == 3
    assert config.arguments(epochs=2).num_train_epochs == 2
    with pytest.warns(UserWarning, match=r"compile\(seed=1\) and args.seed=5 -> args= is used"):
        merged = config.arguments(TrainingArguments(seed=5))  # compile < args= < fit (fitkit.config.option_merge)
    assert merged.num_train_epochs == 3 and merged.seed == 5  # args= does not set epochs: compile's kept
    with pytest.warns(UserWarning, match="seed"):
        assert config.arguments(TrainingArguments(seed=5), epochs=4).seed == 5


@pytest.mark.parametrize("kwargs, suggestion", [
    ({"optimizer": "adamm"}, "did you mean 'adam'? unknown optimizer 'adamm'"),
    ({"loss": "crossentropy"}, "did you mean 'cross_entropy'? unknown loss 'crossentropy'"),
    ({"metrics": ["acuracy"]}, "did you mean 'accuracy'? unknown metric 'acuracy'"),
])
def test_optimizer_loss_and_metric_names_suggest_the_closest(kwargs, suggestion):
    kwargs = {"optimizer": "adam", "loss": "cross_entropy", **kwargs}
    with pytest.raises(ValueError) as caught:
        Model(torch.nn.Linear(8, 3)).compile(**kwargs)
    assert str(caught.value).startswith(suggestion)


def test_a_copy_changing_fields_that_stand_alone_checks_them_as_a_full_build_does():
    """`replace` of fields whose checks read no other field (`ALONE`: a search trial's learning
    rate, output folder, batch size...) checks only those, with the same conversions and errors
    as building the arguments whole."""
    from fitkit.config.checks import ALONE

    base = TrainingArguments(output_dir="out")
    values = [None, True, 0, -1, 1, 3, "3", "1e-3", 2.5, 0.5, "x", "", pathlib.Path("p"), "auto", 2]
    for name in sorted(ALONE):
        for value in values:
            try:
                whole = TrainingArguments(**{**{f: getattr(base, f) for f in TrainingArguments.names()}, name: value})
            except (ValueError, TypeError) as err:
                with pytest.raises(type(err), match=re.escape(str(err))):
                    base.replace(**{name: value})
                continue
            copy = base.replace(**{name: value})
            assert getattr(copy, name) == getattr(whole, name), (name, value)
            assert type(getattr(copy, name)) is type(getattr(whole, name)), (name, value)
    assert {"learning_rate", "output_dir", "per_device_train_batch_size", "num_train_epochs"} <= ALONE
