"""DESIGN section 7: every misuse fails early with an error naming the argument and the fix."""

import dataclasses

import pytest
import torch
from helpers import mlp

import fitkit
from fitkit import Model, TrainingArguments


@pytest.fixture
def data():
    return torch.randn(20, 8), torch.arange(20) % 3


def test_fit_before_compile(data):
    with pytest.raises(RuntimeError, match=r"compile\(.*before `fit\(\)`"):
        Model(mlp()).fit(*data)
    with pytest.raises(RuntimeError, match="before `evaluate"):
        Model(mlp()).evaluate(*data)


def test_model_needs_exactly_one_of_module_and_model_init():
    with pytest.raises(ValueError, match="exactly one of `module`.*`model_init`"):
        Model()
    with pytest.raises(ValueError, match="exactly one"):
        Model(mlp(), model_init=mlp)
    with pytest.raises(TypeError, match="`module` must be a torch.nn.Module"):
        Model("not a module")



def test_released_module_without_model_init_is_named():
    # `release()` drops the module; only a `model_init` can build it again (it used to call None)
    model = Model(mlp())
    model.release()
    with pytest.raises(ValueError, match="no `model_init` to build a module"):
        model.count_params()
    rebuilt = Model(model_init=lambda: mlp())
    rebuilt.release()
    assert isinstance(rebuilt.module, torch.nn.Module)


def test_for_trial_needs_model_init():
    # a search trial builds its module with `model_init(trial)` (it used to call None)
    with pytest.raises(ValueError, match="no `model_init` to build a module"):
        Model(mlp()).compile("adam", "cross_entropy").for_trial(object())

@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimizer": "adamx"}, r"unknown optimizer 'adamx' for `optimizer`; valid names are: adam, adamw, sgd"),
        ({"loss": "crossentropy"}, r"unknown loss 'crossentropy' for `loss`; valid names are: cross_entropy"),
        ({"metrics": ["acc@5"]}, r"unknown metric 'acc@5' in `metrics`; valid names are fitkit's accuracy, mae.*keras.metrics"),
        ({"strategy": "ddpp"}, r"unknown strategy 'ddpp' for `strategy`; valid names are: auto.*ddp"),
        ({"precision": "8-bit"}, r"`precision`='8-bit' is invalid: use one of \['32-true'"),
        ({"accelerator": "quantum"}, r"unknown accelerator 'quantum' for `accelerator`"),
        ({"lr_scheduler": "step"}, r"`lr_scheduler`='step' is invalid: use one of \['constant', 'linear', 'cosine'\]"),
        ({"learning_rate": -1}, r"`learning_rate`=-1 is invalid"),
        ({"gradient_accumulation_steps": 0}, r"`gradient_accumulation_steps`=0 is invalid: pass an integer > 0"),
    ],
)
def test_unknown_names_list_the_valid_ones(kwargs, message):
    kwargs = {"optimizer": "adam", "loss": "cross_entropy", **kwargs}
    with pytest.raises(ValueError, match=message):
        Model(mlp()).compile(**kwargs)


def test_unknown_option_is_named():
    with pytest.raises(TypeError, match="unknown option 'epoch'; valid options are: .*epochs"):
        Model(mlp()).compile("adam", "mse", epoch=3)


def test_x_y_length_mismatch(data):
    x, y = data
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match=r"`x` has 20 samples but `y` has 19"):
        model.fit(x, y[:-1])


def test_empty_data():
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match="`x` is empty"):
        model.fit(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("bad", [0, -4, 2.5])
def test_non_positive_batch_size(data, bad):
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match=r"`(batch_size|per_device_train_batch_size)`=.* is invalid: pass an integer > 0"):
        model.fit(*data, batch_size=bad)
    with pytest.raises(ValueError, match=r"`batch_size`=.* is invalid"):
        model.evaluate(*data, batch_size=bad)


def test_a_loss_with_a_shape_is_reduced_as_keras_does(data):
    x, y = data
    model = Model(mlp()).compile("adam", lambda out, y: (out - 1) ** 2)
    expected = float(((model.module(x) - 1) ** 2).mean())
    assert model.evaluate(x, y, batch_size=len(x), verbose=0, return_dict=True)["loss"] == pytest.approx(expected, rel=1e-6)


def test_validation_options_conflict_and_bad_split(data):
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match="either `validation_data` or `validation_split`"):
        model.fit(*data, validation_split=0.2, validation_data=data)
    with pytest.raises(ValueError, match=r"`validation_split`=1.5 is invalid"):
        model.fit(*data, validation_split=1.5)
    with pytest.raises(ValueError, match=r"`eval_strategy`='steps' needs `validation_data`"):
        model.fit(*data, eval_strategy="steps")


def test_y_with_a_dataset_is_refused(data):
    ds = torch.utils.data.TensorDataset(*data)
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match="`y` can only be given with tensors or arrays"):
        model.fit(ds, data[1])
    with pytest.raises(TypeError, match="one-shot iterator"):
        model.fit(iter([data]))


def test_missing_targets_for_training():
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match="training needs targets"):
        model.fit(torch.utils.data.TensorDataset(torch.randn(4, 8)))


def test_training_arguments_are_frozen_and_json():
    args = TrainingArguments(num_train_epochs=3, lr_scheduler=lambda opt, n: None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.num_train_epochs = 4
    d = args.to_dict()
    assert d["num_train_epochs"] == 3 and isinstance(d["lr_scheduler"], str)
    import json

    assert json.loads(args.to_json_string())["num_train_epochs"] == 3
    assert args.replace(epochs=5).num_train_epochs == 5 and args.num_train_epochs == 3


def test_sample_weight_with_a_loss_that_cannot_weight(data):
    model = Model(mlp()).compile("adam", lambda out, y: torch.nn.functional.cross_entropy(out, y))
    with pytest.raises(ValueError, match="`sample_weight` / `class_weight` need per-sample losses"):
        model.fit(*data, class_weight={0: 2.0})


def test_bad_files_for_load(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved model at `path`"):
        Model.load(str(tmp_path / "missing.pt"), mlp())
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(1)}, other)
    with pytest.raises(ValueError, match="is not a fitkit model file"):
        Model.load(str(other), mlp())


def test_log_levels_follow_hf():
    import logging

    args = TrainingArguments(log_level="error", log_level_replica="critical")
    assert args.get_process_log_level(0, 0) == logging.ERROR
    assert args.get_process_log_level(1, 1) == logging.CRITICAL
    assert args.get_process_log_level(2, 0) == logging.ERROR  # each node's main process
    assert TrainingArguments(log_on_each_node=False, log_level="info").get_process_log_level(2, 0) == logging.WARNING
    assert TrainingArguments().get_process_log_level(0, 0) is None  # passive
    with pytest.raises(ValueError, match="`log_level`='loud' is invalid"):
        TrainingArguments(log_level="loud")


def test_log_level_applies_to_the_fitkit_logger(data, caplog):
    import logging

    class Quit(fitkit.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise fitkit.StopTraining("quiet please")

    logger = logging.getLogger("fitkit")
    before = logger.level
    try:
        with caplog.at_level(logging.WARNING):
            model = Model(mlp()).compile("adam", "cross_entropy")
            model.fit(*data, verbose=0, log_level="error", callbacks=[Quit()])
        assert logger.level == logging.ERROR and "quiet please" not in caplog.text
    finally:
        logger.setLevel(before)
