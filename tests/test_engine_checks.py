"""The first-batch checks (`fitkit.engine.checks`) and the checkpoint fit checks: every misuse of
data, loss, metrics or checkpoint fails before the first optimizer step and before anything is
written, with an error naming the argument; legitimate look-alikes train; and the checks change
nothing in a run (same losses, bit for bit, as with the checks switched off)."""

import os
import warnings

import numpy as np
import pytest
import torch
from helpers import Pairs, blobs, mlp

from fitkit import Model, TrainerCallback
from fitkit.engine import checks
from fitkit.engine import trainer as trainer_module
from fitkit.engine.checkpoint.layout import MANIFEST, CheckpointError
from fitkit.engine.checks import first_step, inputs


class Steps(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def _model(net=None, loss="cross_entropy", metrics=None, optimizer="adam"):
    return Model(net if net is not None else mlp()).compile(optimizer, loss, metrics)


def _refused(tmp_path, model, error, names, *args, **kwargs):
    """`model.fit(*args, **kwargs)` raises `error` naming `names`, with no step and no file."""
    out = tmp_path / "out"
    steps = Steps()
    start = {k: v.clone() for k, v in model.module.state_dict().items()}
    with pytest.raises(error) as caught:
        model.fit(*args, verbose=0, output_dir=str(out), save_strategy="epoch", callbacks=[steps], **kwargs)
    assert names in str(caught.value), str(caught.value)
    assert steps.steps == 0
    assert all(torch.equal(v, start[k]) for k, v in model.module.state_dict().items()), "the weights changed"
    assert not out.exists() or not any(out.iterdir()), "a file was written"
    return caught.value


@pytest.fixture
def data():
    return blobs(48)


# -- features ------------------------------------------------------------------------------------
def test_wrong_feature_count_names_x_and_the_first_layer(tmp_path, data):
    x, y = data
    err = _refused(tmp_path, _model(), ValueError, "`x`", torch.randn(48, 5), y)
    message = str(err)
    assert message.startswith("the module raised on the first batch of `x`: inputs of shape (32, 5) dtype torch.float32")
    assert "in_features=8" in message and "likely fix" in message
    assert isinstance(err.__cause__, RuntimeError)  # the module's own error, chained


def test_wrong_feature_count_in_validation_data_names_it(tmp_path, data):
    x, y = data
    err = _refused(tmp_path, _model(), ValueError, "`validation_data`", x, y,
                   validation_data=(torch.randn(16, 5), y[:16]))
    assert "the module raised on the first batch of `validation_data`" in str(err)


def test_integer_features_for_linear_layers_are_a_type_error(tmp_path, data):
    x, y = data
    err = _refused(tmp_path, _model(), TypeError, "`x`", (x * 10).long(), y)
    assert "x.float()" in str(err) and "Embedding" in str(err)


def test_float64_features_train_torch_and_numpy(data):
    x, y = data
    for features in (x.double(), x.double().numpy()):
        history = _model().fit(features, y, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"][0])


def test_a_float64_module_keeps_float64_features(data):
    x, y = data
    net = mlp().double()
    history = Model(net).compile("adam", "cross_entropy").fit(x.double(), y, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and net[0].weight.dtype == torch.float64


def test_integer_inputs_to_an_embedding_train(data):
    _, y = data
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(32, 3))
    history = _model(net).fit(torch.randint(0, 10, (48, 8)), y, epochs=1, verbose=0)
    assert len(history.history["loss"]) == 1


def test_embedding_indices_out_of_range_are_explained(tmp_path, data):
    _, y = data
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(), torch.nn.Linear(32, 3))
    err = _refused(tmp_path, _model(net), ValueError, "`x`", torch.randint(0, 12, (48, 8)), y)
    assert "num_embeddings=12" in str(err) and isinstance(err.__cause__, IndexError)


# -- class labels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("labels, error, text", [
    (lambda y: y + 3, ValueError, "labels in [0, 3)"),
    (lambda y: y - 1, ValueError, "negative class labels"),
    (lambda y: y.float(), ValueError, "y.long()"),
    (lambda y: y[:, None], ValueError, "y.reshape(-1)"),
    (lambda y: y.int(), TypeError, "torch.int64"),
])
def test_bad_class_labels_name_y_and_the_fix(tmp_path, data, labels, error, text):
    x, y = data
    err = _refused(tmp_path, _model(), error, "`y`", x, labels(y))
    assert text in str(err) and "`loss`='cross_entropy'" in str(err)


def test_bad_labels_in_validation_data_name_it(tmp_path, data):
    x, y = data
    _refused(tmp_path, _model(), ValueError, "`validation_data`", x, y, validation_data=(x[:16], y[:16] + 5))


def test_labels_in_a_dataloader_are_checked_too(tmp_path, data):
    x, y = data
    loader = torch.utils.data.DataLoader(Pairs(x, y + 3), batch_size=8, shuffle=True)
    err = _refused(tmp_path, _model(), ValueError, "the targets of `x`", loader)
    assert "labels in [0, 3)" in str(err)


def test_one_hot_targets_and_ignored_labels_are_fine(data):
    x, y = data
    _model().fit(x, torch.nn.functional.one_hot(y, 3).float(), epochs=1, verbose=0)
    ignored = torch.where(torch.arange(48) % 5 == 0, torch.full_like(y, -100), y)
    history = _model().fit(x, ignored, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


# -- binary and regression targets -------------------------------------------------------------------
def test_binary_targets_outside_0_1_and_other_shapes(tmp_path, data):
    x, y = data
    err = _refused(tmp_path, _model(mlp(d_out=1), "binary_crossentropy"), ValueError, "`y`", x, y.float()[:, None])
    assert "in [0, 1]" in str(err)
    flat = torch.nn.Sequential(mlp(d_out=1), torch.nn.Flatten(0))  # outputs (N,), targets (N, 1)
    err = _refused(tmp_path, _model(flat, "binary_crossentropy"), ValueError, "`y`", x, (y > 0).float()[:, None])
    assert "y.reshape(-1)" in str(err)


@pytest.mark.parametrize("loss", ["mse", "mae", "huber"])
def test_regression_shapes_must_match(tmp_path, data, loss):
    x, y = data
    err = _refused(tmp_path, _model(mlp(d_out=2), loss), ValueError, "`y`", x, y.float())
    assert "pass targets of shape (32, 2)" in str(err)
    flat = torch.nn.Sequential(mlp(d_out=1), torch.nn.Flatten(0))  # outputs (N,), targets (N, 1): N x N
    err = _refused(tmp_path, _model(flat, loss), ValueError, "`y`", x, y.float()[:, None])
    assert "y.reshape(-1)" in str(err)


def test_matching_regression_shapes_train(data):
    x, y = data
    # outputs (N, 1) with targets (N,): the loss squeezes the outputs (Keras does the same)
    assert len(_model(mlp(d_out=1), "mse").fit(x, y.float(), epochs=1, verbose=0).history["loss"]) == 1
    flat = torch.nn.Sequential(mlp(d_out=1), torch.nn.Flatten(0))
    assert len(_model(flat, "mse").fit(x, y.float(), epochs=1, verbose=0).history["loss"]) == 1
    assert len(_model(mlp(d_out=1), "mse").fit(x, y.float()[:, None], epochs=1, verbose=0).history["loss"]) == 1


# -- the loss and the metrics -------------------------------------------------------------------------
def test_a_loss_that_raises_is_re_raised_with_context(tmp_path, data):
    x, y = data

    def picky(outputs, targets):
        raise RuntimeError("picky loss")

    err = _refused(tmp_path, _model(loss=picky), ValueError, "`loss`='picky'", x, y)
    assert "outputs of shape (32, 3) dtype torch.float32, `y` of shape (32,) dtype torch.int64" in str(err)
    assert str(err.__cause__) == "picky loss"


def test_a_loss_returning_a_number_is_a_type_error(tmp_path, data):
    x, y = data
    _refused(tmp_path, _model(loss=lambda out, t: 1.0), TypeError, "`loss`", x, y)


def test_a_scalar_loss_cannot_weight_samples(tmp_path, data):
    x, y = data
    err = _refused(tmp_path, _model(loss=lambda out, t: torch.nn.functional.cross_entropy(out, t)), ValueError,
                   "`sample_weight`", x, y, sample_weight=torch.ones(len(x)))
    assert "per-sample losses" in str(err)


def test_no_loss_for_a_module_that_does_not_return_one(tmp_path, data):
    x, y = data
    err = _refused(tmp_path, _model(loss=None), ValueError, "`loss=None`", x, y)
    assert "pass `loss=` to compile" in str(err)


def _none_metric(preds, target):
    return None


def _per_sample(preds, target):
    return (preds.argmax(-1) == target).float()


def _as_float(preds, target):
    return float((preds.argmax(-1) == target).float().mean())


def _raising(preds, target):
    raise KeyError("oops")


@pytest.mark.parametrize("metric, error, text", [
    (_none_metric, TypeError, "returned NoneType"),
    (_per_sample, TypeError, "returned a tensor of shape (32,)"),
    (_raising, ValueError, "metric `_raising` in `metrics` raised on the first batch of `x`"),
])
def test_bad_metric_callables_name_metrics(tmp_path, data, metric, error, text):
    x, y = data
    err = _refused(tmp_path, _model(metrics=[metric]), error, "`metrics`", x, y)
    assert text in str(err)


def test_a_metric_returning_a_number_trains(data):
    x, y = data
    history = _model(metrics=[_as_float]).fit(x, y, epochs=2, verbose=0)
    assert len(history.history["_as_float"]) == 2 and 0.0 <= history.history["_as_float"][-1] <= 1.0


# -- empty and incomplete data --------------------------------------------------------------------------
def test_empty_list_one_tuple_and_empty_split(tmp_path, data):
    x, y = data
    _refused(tmp_path, _model(), ValueError, "`x` is an empty list", [])
    err = _refused(tmp_path, _model(), ValueError, "`validation_data`", x, y, validation_data=(x,))
    assert "(x_val, y_val)" in str(err)
    err = _refused(tmp_path, _model(), ValueError, "`validation_split`", x, y, validation_split=0.001)
    assert "validation split empty" in str(err)
    _refused(tmp_path, _model(), ValueError, "`validation_split`", Pairs(x, y), validation_split=0.001)


def test_a_dataset_without_batches_is_empty(tmp_path):
    class Nothing(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(())

    _refused(tmp_path, _model(), ValueError, "`x` is empty", Nothing())


def test_non_finite_inputs_warn_once_and_train(data):
    x, y = data
    x = torch.where(torch.arange(48)[:, None] == 0, float("nan"), x)
    with pytest.warns(UserWarning, match="`x` holds NaN or infinite values") as seen:
        _model().fit(x, y, epochs=2, verbose=0)
    assert sum("NaN or infinite" in str(w.message) for w in seen) == 1
    with pytest.warns(UserWarning, match="`y` holds NaN or infinite values"):
        targets = torch.where(torch.arange(48) == 0, float("inf"), y.float())[:, None]
        _model(mlp(d_out=1), "mse").fit(data[0], targets, epochs=1, verbose=0)


def test_nan_rows_in_the_shuffled_first_batch_are_named_not_called_finite():
    """With `shuffle=True` the first step's batch is not the data's first rows: the warning is
    about the batch the step took (here every batch but the data's first holds NaN rows)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    x[8:] = float("nan")
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.fit(x, x.sum(-1, keepdim=True), batch_size=8, epochs=1, shuffle=True, seed=1, verbose=0)
    said = [str(w.message) for w in seen]
    assert any("`x` holds NaN or infinite values" in s for s in said), said
    assert not any("whose values are finite" in s for s in said), said


# -- evaluate and predict ---------------------------------------------------------------------------------
def test_evaluate_and_predict_check_their_data(data):
    x, y = data
    model = _model()
    with pytest.raises(ValueError, match="first batch of `x`") as caught:
        model.evaluate(torch.randn(8, 5), y[:8])
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(ValueError, match="labels in \\[0, 3\\)"):
        model.evaluate(x, y + 3)
    with pytest.raises(ValueError, match="first batch of `x`"):
        model.predict(torch.randn(8, 5))
    assert Model(mlp()).predict(x).shape == (48, 3)  # no compile, no loss: predict still works


# -- the checks change nothing ------------------------------------------------------------------------------
class _Noise(torch.nn.Module):
    """Draws from the global RNG in every forward, eval mode included (the probe's too)."""

    def forward(self, x):
        return x + 0.01 * torch.randn_like(x)


def _dropout_net():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), _Noise(),
                               torch.nn.Linear(32, 3))


def _run(form, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr(trainer_module, "check_data", lambda *a, **k: None)
    x, y = blobs(96)
    if form == "tensors":
        data = dict(x=x, y=y)
    elif form == "dataset":
        data = dict(x=Pairs(x, y))
    elif form == "loader":  # its order comes from the global RNG
        data = dict(x=torch.utils.data.DataLoader(Pairs(x, y), batch_size=16, shuffle=True))
    else:  # its own generator
        g = torch.Generator().manual_seed(5)
        data = dict(x=torch.utils.data.DataLoader(Pairs(x, y), batch_size=16, shuffle=True, generator=g))
    model = Model(_dropout_net()).compile("adam", "cross_entropy", ["accuracy"])
    model.fit(**data, batch_size=16, epochs=2, seed=11, verbose=0, logging_strategy="steps", logging_steps=1,
              validation_data=(x[:32], y[:32]))
    if monkeypatch is not None:
        monkeypatch.undo()
    records = [{k: v for k, v in r.items() if not k.startswith("train_")} for r in model.state.log_history]
    return records, [p.detach().clone() for p in model.module.parameters()], torch.get_rng_state()


@pytest.mark.parametrize("form", ["tensors", "dataset", "loader", "loader-generator"])
def test_the_checks_change_nothing_in_a_seeded_run(monkeypatch, form):
    checked = _run(form)
    unchecked = _run(form, monkeypatch)
    assert checked[0] == unchecked[0]  # every logged value, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(checked[1], unchecked[1]))
    assert torch.equal(checked[2], unchecked[2])  # and the RNG where the run left it


def test_the_checks_call_the_module_no_extra_time_on_any_path(data):
    x, y = data
    calls = []

    class Counting(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, features):
            calls.append(self.training)
            return self.net(features)

    net = Counting()
    Model(net).compile("adam", "cross_entropy").fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert calls == [True, True, True] and net.training  # 3 steps: the first one is checked
    calls.clear()
    Model(Counting()).compile("adam", "cross_entropy", precision="bf16-mixed").fit(x, y, batch_size=16, epochs=1,
                                                                                   verbose=0)
    assert calls == [True, True, True]
    with pytest.raises(ValueError, match="labels in \\[0, 3\\)"):  # checked through a precision plugin too
        Model(Counting()).compile("adam", "cross_entropy", precision="bf16-mixed").fit(x, y + 3, verbose=0)
    with pytest.raises(TypeError, match="`x` holds integer values"):  # the checks without a forward still run
        Model(mlp()).compile("adam", "cross_entropy", precision="bf16-mixed").fit(x.long(), y, verbose=0)


# -- resuming a checkpoint of another model or optimizer ------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path, data):
    x, y = data
    _model().fit(x, y, epochs=1, verbose=0, output_dir=str(tmp_path / "out"), save_strategy="epoch")
    return tmp_path / "out" / "checkpoint-2"


def _resume_refused(checkpoint, model, names):
    x, y = blobs(48)
    start = {k: v.clone() for k, v in model.module.state_dict().items()}
    files = sorted(os.listdir(checkpoint.parent))
    with pytest.raises(CheckpointError) as caught:
        model.fit(x, y, epochs=2, verbose=0, output_dir=str(checkpoint.parent), save_strategy="epoch",
                  resume_from_checkpoint=True)
    message = str(caught.value)
    assert str(checkpoint) in message and names in message and "start a fresh `output_dir`" in message, message
    assert all(torch.equal(v, start[k]) for k, v in model.module.state_dict().items()), "weights half-loaded"
    assert sorted(os.listdir(checkpoint.parent)) == files
    return message


def test_resuming_another_architecture_names_the_parameters(checkpoint):
    message = _resume_refused(checkpoint, _model(mlp(hidden=24)), "0.weight (16, 8) in the checkpoint, (24, 8)")
    assert isinstance(CheckpointError(message), ValueError)


def test_resuming_another_number_of_classes_names_the_shapes(checkpoint):
    _resume_refused(checkpoint, _model(mlp(d_out=4)), "2.weight (3, 16) in the checkpoint, (4, 16) in this model")


def test_resuming_another_module_names_missing_and_unexpected_keys(checkpoint):
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 3))
    message = _resume_refused(checkpoint, _model(net), "not in the checkpoint: 4.weight (3, 16)")
    assert "other shapes: 2.weight (3, 16) in the checkpoint, (16, 16) in this model" in message


def test_resuming_with_another_optimizer_names_both(checkpoint):
    _resume_refused(checkpoint, _model(optimizer="sgd"), "written with the optimizer Adam and this run uses SGD")


def test_a_checkpoint_without_the_optimizer_class_is_checked_by_its_settings(checkpoint):
    import json

    manifest = json.loads((checkpoint / MANIFEST).read_text())
    del manifest["optimizer"]
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))
    _resume_refused(checkpoint, _model(optimizer="sgd"), "another optimizer class")


def test_resuming_the_same_model_and_optimizer_still_works(checkpoint):
    x, y = blobs(48)
    model = _model()
    model.fit(x, y, epochs=2, verbose=0, output_dir=str(checkpoint.parent), save_strategy="epoch",
              resume_from_checkpoint=True)
    assert model.state.global_step == 4


def test_check_data_is_the_function_fit_calls():
    assert trainer_module.check_data is checks.check_data


# -- checked once per data ----------------------------------------------------------------------------
def test_the_same_tensors_are_checked_once_and_again_after_an_in_place_change(data):
    x, y = data
    probes = []
    real = first_step._check_rules

    def spy(named, outputs, target, names, stats):
        probes.append(len(target))
        return real(named, outputs, target, names, stats)

    first_step._check_rules = spy
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, verbose=0)
    assert len(probes) == 1  # the first batch, checked
    model.fit(x, y, epochs=1, verbose=0)
    assert len(probes) == 1  # the same tensors: not checked again
    y += 3  # labels out of range now: a new version of the tensor
    try:
        with pytest.raises(ValueError, match="`y`"):
            model.fit(x, y, epochs=1, verbose=0)
    finally:
        first_step._check_rules = real
    assert len(probes) == 2


def test_trials_read_the_datas_first_batches_once_and_check_each_module(data, monkeypatch):
    """A search's trials share what was read from the data's first batches (keyed by the data
    and the loss kind) and which first steps passed the output checks (keyed by the data, loss,
    metrics and the outputs' shapes and dtypes): a module with outputs of another shape is
    checked again."""
    import optuna

    x, y = data
    reads = []
    real = inputs._read_stats
    for module in (inputs, first_step):  # the data's first batch, and the shuffled first step's
        monkeypatch.setattr(module, "_read_stats", lambda batch, loss: reads.append(batch.size) or real(batch, loss))
    model = Model(model_init=lambda trial: mlp(d_out=trial.suggest_int("classes", 1, 3))).compile("adam", "cross_entropy")
    model.launch()

    def trial_fit(number, classes, **options):
        trial_model = model.for_trial(optuna.trial.FixedTrial({"classes": classes}, number=number))
        return trial_model.fit(x, y, epochs=1, batch_size=16, verbose=0, validation_data=(x, y), **options)

    trial_fit(0, 3)
    first = len(reads)  # training and validation data before the step, the shuffled first batch at it
    assert first == 3
    trial_fit(1, 3)
    assert len(reads) == first  # outputs of the shapes checked on this data before: nothing is read
    trial_fit(2, 3, shuffle=False)
    assert len(reads) == first  # the same slices as those read: nothing is read again
    with pytest.raises(ValueError, match="`y`"):  # a module of 2 classes for labels up to 2: still refused
        trial_fit(3, 2, shuffle=False)
    with pytest.raises(ValueError, match="`y`"):  # ... however often (nothing is remembered of a failed check)
        trial_fit(4, 2)
    assert len(reads) == first + 1  # that shuffled first batch, read for the rules
    y[0] = 1  # an in-place change: a new version of `y`, read again
    trial_fit(5, 3, shuffle=False)
    assert len(reads) == first + 3


def test_a_trial_whose_checks_were_passed_before_still_has_its_loss_value_checked(data):
    """The output checks a search remembers are those of shapes; the loss value is each
    module's own: a trial whose module gives NaN on finite data is still warned about."""
    import optuna

    x, y = data

    def model_init(trial):
        module = mlp(d_out=3)
        if trial.suggest_int("broken", 0, 1):
            with torch.no_grad():
                module[0].weight.fill_(float("nan"))
        return module

    model = Model(model_init=model_init).compile("adam", "cross_entropy")
    model.launch()

    def trial_fit(number, broken):
        trial_model = model.for_trial(optuna.trial.FixedTrial({"broken": broken}, number=number))
        trial_model.fit(x, y, epochs=1, batch_size=16, verbose=0, validation_data=(x, y))

    trial_fit(0, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trial_fit(1, 1)
    said = [str(w.message) for w in caught]
    assert any("is nan on the first batch of `x`" in m for m in said), said  # (and of `validation_data`)


def test_the_same_change_of_arguments_is_made_once():
    from fitkit import TrainingArguments

    args = TrainingArguments()
    assert args.replace(shuffle=False, epochs=2) is args.replace(epochs=2, shuffle=False)
    with pytest.raises(ValueError, match="shuffle"):  # 0 is not False, whatever was remembered
        args.replace(shuffle=0, epochs=2)
    assert args.replace(report_to=["none"]) == args.replace(report_to=["none"])  # a list: not remembered, still right
    assert args.replace(epochs=2) == args.replace(epochs=2) and args.replace(epochs=2) != args


def test_a_loss_that_is_not_finite_on_finite_data_is_said_once(data):
    x, y = data

    def log_of_zero(outputs, targets):
        return torch.log(torch.zeros(())) + 0 * outputs.sum()

    model = Model(mlp()).compile("sgd", log_of_zero)
    with pytest.warns(UserWarning, match=r"`loss`=.* is -inf on the first batch of `x`"):
        model.fit(x, y, epochs=1, verbose=0)
