"""ModelCheckpoint: file names, when files are written, what they hold, and best-only saving."""

import os
import warnings

import pytest
import torch
from helpers import blobs as data
from helpers import mlp

from fitkit import Model, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from fitkit.callbacks import ModelCheckpoint


def fit(callbacks, epochs=3, validation=True, model=None, **options):
    x, y = data()
    model = model or Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=0.01)
    history = model.fit(x, y, batch_size=16, epochs=epochs, validation_data=data(16, 1) if validation else None,
                        callbacks=callbacks, verbose=0, seed=0, **options)
    return model, history


class Script(TrainerCallback):
    """Replaces `key` in each evaluation's metrics by the next scripted value, and keeps a
    copy of the weights at each evaluation."""

    def __init__(self, key, values):
        self.key, self.values, self.weights = key, list(values), []

    def on_evaluate(self, args, state, control, metrics=None, model=None, **kwargs):
        metrics[self.key] = self.values[len(self.weights)]
        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})


def files(folder):
    return sorted(os.listdir(folder))


def test_one_file_per_epoch_and_no_temporary_files(tmp_path):
    ckpt = ModelCheckpoint(str(tmp_path / "w-{epoch:02d}.pt"), save_weights_only=True)
    fit([ckpt], epochs=3)
    assert files(tmp_path) == ["w-01.pt", "w-02.pt", "w-03.pt"]
    assert ckpt.last_filepath == str(tmp_path / "w-03.pt")


def test_file_names_take_logged_values(tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "w-{epoch:02d}-{val_loss:.3f}-{loss:.3f}.pt")
    _, history = fit([ckpt], epochs=2)
    h = history.history
    expected = [f"w-{i + 1:02d}-{h['val_loss'][i]:.3f}-{h['loss'][i]:.3f}.pt" for i in range(2)]
    assert files(tmp_path) == expected


def test_each_file_holds_the_weights_of_its_epoch(tmp_path):
    script = Script("val_loss", [3.0, 2.0, 1.0])
    fit([script, ModelCheckpoint(tmp_path / "w-{epoch}.pt", save_weights_only=True)], epochs=3)
    for i in range(3):
        saved = torch.load(tmp_path / f"w-{i + 1}.pt", weights_only=True)
        for k, v in script.weights[i].items():
            assert torch.equal(saved[k], v)


def test_save_best_only_writes_improvements_only(tmp_path):
    script = Script("val_loss", [3.0, 1.0, 2.0, 0.5])
    ckpt = ModelCheckpoint(tmp_path / "b-{epoch}.pt", save_best_only=True, save_weights_only=True)
    fit([script, ckpt], epochs=4)
    assert files(tmp_path) == ["b-1.pt", "b-2.pt", "b-4.pt"]
    assert ckpt.best == 0.5


def test_save_best_only_to_one_name_keeps_the_best_weights(tmp_path):
    script = Script("val_accuracy", [0.5, 0.9, 0.7])
    path = tmp_path / "best.pt"
    fit([script, ModelCheckpoint(path, monitor="val_accuracy", save_best_only=True, save_weights_only=True)], epochs=3)
    saved = torch.load(path, weights_only=True)
    for k, v in script.weights[1].items():
        assert torch.equal(saved[k], v)


def test_initial_value_threshold(tmp_path):
    script = Script("val_loss", [3.0, 1.0])
    fit([script, ModelCheckpoint(tmp_path / "b-{epoch}.pt", save_best_only=True, initial_value_threshold=2.0)],
        epochs=2)
    assert files(tmp_path) == ["b-2.pt"]


def test_weights_file_loads_into_a_fresh_module_and_predicts_the_same(tmp_path):
    path = tmp_path / "weights.pt"
    model, _ = fit([ModelCheckpoint(path, save_weights_only=True)], epochs=2)
    fresh = mlp(seed=123)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    x, _ = data(8, seed=5)
    with torch.no_grad():
        assert torch.allclose(fresh(x), model.predict(x))


def test_full_file_is_the_model_save_format_and_model_load_reads_it(tmp_path):
    script = Script("val_loss", [2.0, 1.0])
    model, _ = fit([script, ModelCheckpoint(tmp_path / "full-{epoch}.pt")], epochs=2)
    payload = torch.load(tmp_path / "full-2.pt", weights_only=True)
    assert set(payload) == {"format", "version", "state_dict", "config", "optimizer", "scheduler"}
    assert payload["format"] == "fitkit-model" and payload["config"] is None  # the callback sees the module only
    assert payload["optimizer"]["state"]  # the optimizer's state, as Keras' full-model file keeps it
    for epoch in (1, 2):
        loaded = Model.load(str(tmp_path / f"full-{epoch}.pt"), mlp(seed=9))
        for k, v in script.weights[epoch - 1].items():
            assert torch.equal(loaded.module.state_dict()[k], v)
    x, _ = data(8, seed=5)
    assert torch.allclose(loaded.predict(x), model.predict(x))  # the last file holds the final weights
    model.save(str(tmp_path / "saved.pt"))  # Model.save writes the same layout, with the compile configuration
    assert set(torch.load(tmp_path / "saved.pt", weights_only=True)) == set(payload)


def test_integer_save_freq_counts_optimizer_steps(tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "s-{step}.pt", save_freq=3)
    fit([ckpt], epochs=4)  # 2 steps per epoch, 8 steps
    assert files(tmp_path) == ["s-3.pt", "s-6.pt"]


def test_batch_in_the_name_is_the_step_within_its_epoch(tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "e{epoch}-b{batch}-s{step}.pt", save_freq=1, save_weights_only=True)
    fit([ckpt], epochs=2)  # 2 steps per epoch
    assert files(tmp_path) == ["e1-b1-s1.pt", "e1-b2-s2.pt", "e2-b1-s3.pt", "e2-b2-s4.pt"]


def test_batch_in_the_name_needs_an_integer_save_freq():
    with pytest.raises(ValueError, match=r"\{batch\}.*save_freq=<steps>"):
        ModelCheckpoint("w-{epoch}-{batch:02d}.pt")
    with pytest.raises(ValueError, match="not a valid format string"):
        ModelCheckpoint("w-{epoch.pt", save_freq=2)


def test_without_validation_it_saves_on_the_training_log(tmp_path):
    fit([ModelCheckpoint(tmp_path / "t-{epoch}-{loss:.2f}.pt", monitor="loss", save_best_only=True)],
        epochs=2, validation=False)
    names = files(tmp_path)
    assert len(names) == 2 and names[0].startswith("t-1-") and names[1].startswith("t-2-")


def test_unknown_name_in_filepath_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="val_auc"):
        fit([ModelCheckpoint(tmp_path / "w-{val_auc}.pt")], epochs=1)
    assert files(tmp_path) == []


def test_missing_monitor_with_save_best_only_warns_once_and_saves_as_keras(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit([ModelCheckpoint(tmp_path / "w-{epoch}.pt", monitor="val_f1", save_best_only=True)], epochs=3)
    assert len([w for w in caught if "val_f1" in str(w.message)]) == 1
    assert files(tmp_path) == ["w-1.pt", "w-2.pt", "w-3.pt"]


def test_verbose_messages_start_from_inf_as_keras(tmp_path, capsys):
    fit([Script("val_loss", [2.0, 3.0]), ModelCheckpoint(tmp_path / "l.pt", save_best_only=True, verbose=1),
         Script("val_accuracy", [0.5, 0.4]),
         ModelCheckpoint(tmp_path / "a.pt", monitor="val_accuracy", save_best_only=True, verbose=1)], epochs=2)
    out = capsys.readouterr().out
    assert "Epoch 1: val_loss improved from inf to 2.00000, saving model to" in out
    assert "Epoch 1: val_accuracy improved from -inf to 0.50000" in out
    assert "Epoch 2: val_loss did not improve from 2.00000" in out
    assert "None" not in out


def test_an_existing_directory_as_the_file_is_a_clear_error(tmp_path):
    (tmp_path / "w-1.pt").mkdir()
    with pytest.raises(IsADirectoryError, match="existing directory"):
        fit([ModelCheckpoint(tmp_path / "w-{epoch}.pt")], epochs=1)


def test_argument_checks():
    with pytest.raises(ValueError, match="mode='min'"):
        ModelCheckpoint("w.pt", monitor="val_custom", save_best_only=True)
    ModelCheckpoint("w.pt", monitor="val_custom")  # the monitor is unused without save_best_only
    with pytest.raises(ValueError, match="save_freq"):
        ModelCheckpoint("w.pt", save_freq="batch")
    with pytest.raises(ValueError, match="save_freq"):
        ModelCheckpoint("w.pt", save_freq=0)


def test_only_the_world_zero_process_writes(tmp_path):
    ckpt = ModelCheckpoint(tmp_path / "w-{epoch}.pt")
    args = TrainingArguments(eval_strategy="no")
    control = TrainerControl()
    module = mlp()
    for zero in (False, True):
        state = TrainerState(epoch=0.0, is_world_process_zero=zero)
        ckpt.on_train_begin(args, state, control)
        ckpt.on_epoch_begin(args, state, control)
        state.epoch, state.global_step = 1.0, 2
        ckpt.on_epoch_end(args, state, control, model=module, optimizer=None)
        ckpt.on_train_end(args, state, control, model=module, optimizer=None)
        assert ckpt.last_filepath == str(tmp_path / "w-1.pt")
        assert files(tmp_path) == (["w-1.pt"] if zero else [])


def test_state_round_trip(tmp_path):
    script = Script("val_loss", [3.0, 1.0])
    ckpt = ModelCheckpoint(tmp_path / "b-{epoch}.pt", save_best_only=True)
    fit([script, ckpt], epochs=2)
    again = ModelCheckpoint(tmp_path / "r-{epoch}.pt", save_best_only=True)
    again.load_state(ckpt.state())
    fit([Script("val_loss", [2.0, 0.5]), again], epochs=2)  # 2.0 does not beat the restored best 1.0
    assert [n for n in files(tmp_path) if n.startswith("r-")] == ["r-2.pt"]
