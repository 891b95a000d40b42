"""The Trainer's speed values and evaluation records come from one helper
(`fitkit.events.hf_view`): the names and rounding of `transformers.trainer_utils.speed_metrics`,
in fit's evaluation records under HF's arguments, in `evaluate(metric_key_prefix=...)` (built
once, the record it logs) and in the closing training record."""

import pytest
from helpers import Pairs, blobs, mlp

from fitkit import Model
from fitkit.events.hf_view import evaluation_record, speed_metrics
from fitkit.facade.hf_methods import HFMethods

transformers = pytest.importorskip("transformers")
from transformers import trainer_utils  # noqa: E402 - after the skip when transformers is absent

SPEED = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


@pytest.mark.parametrize("seconds, samples, steps", [
    (2.5, 100, 7), (1 / 3, 37, 2), (1.23456789, None, 3), (12.00004, 5, None), (0.0, 10, 1),
])
def test_speed_values_are_the_trainers(monkeypatch, seconds, samples, steps):
    monkeypatch.setattr(trainer_utils.time, "time", lambda: seconds)  # the Trainer's clock: `seconds` after 0
    theirs = trainer_utils.speed_metrics("eval", 0.0, num_samples=samples, num_steps=steps)
    assert list(speed_metrics("eval", seconds, samples, steps).items()) == list(theirs.items())


def test_an_evaluation_record_prefixes_each_name_once_then_the_speed():
    record = evaluation_record({"loss": 0.5, "eval_accuracy": 1.0}, "eval", 2.0, samples=10, steps=3)
    assert record == {"eval_loss": 0.5, "eval_accuracy": 1.0, "eval_runtime": 2.0,
                      "eval_samples_per_second": 5.0, "eval_steps_per_second": 1.5}
    assert list(evaluation_record({"loss": 0.5}, "test")) == ["test_loss"]  # no seconds: no speed
    with pytest.raises(ValueError, match="`metric_key_prefix`=''"):
        evaluation_record({"loss": 0.5}, "")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    pytest.importorskip("accelerate")  # transformers' TrainingArguments needs it to be built
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path_factory.mktemp("hf")), per_device_train_batch_size=8, per_device_eval_batch_size=4,
        num_train_epochs=1, eval_strategy="epoch", save_strategy="no", logging_strategy="epoch", report_to="none")
    x, y = blobs(40, 0)
    model = Model(mlp()).compile("sgd", "cross_entropy", ["accuracy"])
    model.fit(Pairs(x[:24], y[:24]), validation_data=Pairs(x[24:], y[24:]), args=args, verbose=0)
    return model


def test_fits_evaluation_record_has_the_trainers_names_in_its_order(fitted):
    record = next(r for r in fitted.state.log_history if "eval_loss" in r)
    assert list(record) == ["eval_loss", "eval_accuracy", *SPEED, "epoch", "step"]


def test_evaluate_returns_the_record_it_logs_built_once(fitted, monkeypatch):
    built = []
    named = HFMethods.hf_named

    def counted(self, *args, **kwargs):
        built.append(args[1] if len(args) > 1 else kwargs.get("prefix"))
        return named(self, *args, **kwargs)

    monkeypatch.setattr(HFMethods, "hf_named", counted)
    record = fitted.evaluate(metric_key_prefix="eval")
    assert built == ["eval"]  # one record: the one logged is the one returned
    assert fitted.state.log_history[-1] == {**record, "step": fitted.state.global_step}
    assert list(record) == ["eval_loss", "eval_accuracy", *SPEED, "epoch"]
    # 16 samples in batches of 4: the Trainer's steps, ceil(samples / batch size), and its rounding
    assert record["eval_samples_per_second"] / record["eval_steps_per_second"] == pytest.approx(4, rel=1e-2)


def test_the_closing_training_record_has_the_trainers_speed_names(fitted):
    closing = next(r for r in fitted.state.log_history if "train_runtime" in r)
    assert list(closing)[:3] == ["train_runtime", "train_samples_per_second", "train_steps_per_second"]
    assert closing["train_samples_per_second"] / closing["train_steps_per_second"] == pytest.approx(8, rel=1e-2)
