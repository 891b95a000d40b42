"""Hugging Face's example scripts, token classification (issue 35): batches padded each to its own
length (`DataCollatorForTokenClassification`) are padded across batches with -100, as the
Trainer pads them, for `compute_metrics`, `evaluate` and `predict`; `eval_accumulation_steps`."""

import os
import sys

import numpy as np
import pytest
import torch

from fitkit import Model
from fitkit.engine.gather import BatchJoiner, pad_concat

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from text_classification import make_texts, make_tokenizer  # noqa: E402

TEXTS, _ = make_texts(40, seed=5)
TOKENIZER = make_tokenizer(TEXTS)
COLLATOR = transformers.DataCollatorForTokenClassification(TOKENIZER)


def tagged():
    """Each word tagged by its length (3 tags); the special tokens get -100, as run_ner.py does."""
    def tag(batch):
        enc = TOKENIZER(batch["text"], truncation=True)
        enc["labels"] = [[-100] + [min(len(w), 6) // 3 for w in text.split()] + [-100] for text in batch["text"]]
        return enc
    return datasets.Dataset.from_dict({"text": TEXTS}).map(tag, batched=True, remove_columns=["text"])


DATA = tagged()


def tiny_tagger(seed=0):
    transformers.set_seed(seed)
    cfg = transformers.BertConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                                  num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForTokenClassification(cfg)


def hf_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, save_strategy="no",
                num_train_epochs=1, per_device_train_batch_size=8, per_device_eval_batch_size=8, learning_rate=1e-3, dataloader_pin_memory=False)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def token_accuracy(eval_pred):
    logits, labels = eval_pred
    keep = labels != -100
    return {"token_accuracy": float((logits.argmax(-1)[keep] == labels[keep]).mean()),
            "width": float(labels.shape[1]), "padded_logits": float((logits == -100).all(-1).sum())}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny tagger trained one epoch by fitkit, and the Trainer over the same weights."""
    tmp = tmp_path_factory.mktemp("ner")
    net = tiny_tagger()
    model = Model(net).compile()
    args = hf_args(tmp)
    model.fit(DATA, args=args, data_collator=COLLATOR, compute_metrics=token_accuracy, shuffle=False)
    trainer = transformers.Trainer(model=net, args=args, data_collator=COLLATOR, compute_metrics=token_accuracy)
    return model, trainer


def test_evaluate_pads_across_batches_as_the_trainer(trained):
    model, trainer = trained
    ours = model.evaluate(DATA, verbose=0, batch_size=8, return_dict=True)
    theirs = trainer.evaluate(DATA)
    widths = {len(ids) for ids in DATA["input_ids"]}
    assert len(widths) > 1 and ours["width"] == max(widths)  # batches of several lengths met
    for name in ("loss", "token_accuracy", "width", "padded_logits"):
        assert ours[name] == pytest.approx(theirs["eval_" + name], abs=1e-5), name
    assert ours["padded_logits"] > 0


def test_predict_pads_outputs_with_minus_100_as_the_trainer(trained):
    model, trainer = trained
    logits = model.predict(DATA, verbose=0, batch_size=8)["logits"]
    theirs = trainer.predict(DATA).predictions
    assert logits.shape == theirs.shape
    np.testing.assert_allclose(logits.numpy(), theirs, atol=1e-5)


def test_eval_accumulation_steps_moves_gathered_values_to_the_cpu_with_the_same_values(trained):
    model, trainer = trained
    plain = model.evaluate(DATA, verbose=0, batch_size=8, return_dict=True)
    chunked = model.evaluate(DATA, verbose=0, batch_size=8, eval_accumulation_steps=2, return_dict=True)
    assert plain == chunked
    trainer.args.eval_accumulation_steps = 2
    assert trainer.evaluate(DATA)["eval_width"] == chunked["width"]
    logits = model.predict(DATA, verbose=0, batch_size=8, eval_accumulation_steps=2)["logits"]
    np.testing.assert_allclose(logits.numpy(), trainer.predict(DATA).predictions, atol=1e-5)
    joiner = BatchJoiner("predictions", every=2)
    for n in (3, 5, 4):
        joiner.add(torch.full((2, n), float(n)))
        assert all(t.device.type == "cpu" for t in joiner.moved)
    assert len(joiner.moved) == 1 and len(joiner.pending) == 1  # moved after two batches
    out = joiner.joined()
    assert out.shape == (6, 5) and out[0, 3].item() == -100 and out[5, 3].item() == 4


def test_pad_concat_keeps_structure_and_pads_only_the_second_dimension():
    parts = [{"a": torch.ones(1, 2, 3), "b": (torch.zeros(1, dtype=torch.long),)},
             {"a": torch.ones(2, 4, 3), "b": (torch.ones(2, dtype=torch.long),)}]
    out = pad_concat(parts)
    assert out["a"].shape == (3, 4, 3) and (out["a"][0, 2:] == -100).all() and out["b"][0].tolist() == [0, 1, 1]


def test_shapes_that_differ_elsewhere_name_the_batch_and_the_fix():
    joiner = BatchJoiner("predictions")
    joiner.add(torch.zeros(4, 7, 3))
    with pytest.raises(ValueError, match=r"predictions of batch 1 have shape \[4, 7, 5\].*\[4, 7, 3\].*second"):
        joiner.add(torch.zeros(4, 7, 5))


# -- the Trainer calls of run_ner.py, ported line for line ---------------------------------------------
def argmax_logits(logits, labels):  # what run_*.py pass as preprocess_logits_for_metrics
    return logits.argmax(-1)


def tag_accuracy(eval_pred):
    tags, labels = eval_pred
    keep = labels != -100
    return {"accuracy": float((tags[keep] == labels[keep]).mean())}


class InOrder(transformers.Trainer):  # the Trainer reading the data in order, as fitkit's shuffle=False
    def _get_train_sampler(self, *a, **k):
        return torch.utils.data.SequentialSampler(self.train_dataset)


class Counter(transformers.TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_prediction_step(self, args, state, control, **kwargs):
        self.steps.append(1)


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    """run_ner.py's Trainer lines and their port, on the same tiny tagger, data and order."""
    out = {}
    for who in ("hf", "fitkit"):
        tmp = tmp_path_factory.mktemp(who)
        args = hf_args(tmp, per_device_eval_batch_size=5, eval_strategy="epoch", logging_strategy="epoch")
        train, evaluation = DATA.select(range(24)), DATA.select(range(24, 40))
        net, counter = tiny_tagger(), Counter()
        steps = counter.steps
        if who == "hf":
            trainer = InOrder(model=net, args=args, train_dataset=train, eval_dataset=evaluation,
                              data_collator=COLLATOR, compute_metrics=tag_accuracy,
                              preprocess_logits_for_metrics=argmax_logits, callbacks=[counter])
            train_result = trainer.train()
            runner = trainer
        else:
            runner = Model(net).compile()
            runner.add_callback(counter)  # kept for every later call, as the Trainer's callbacks
            train_result = runner.fit(train, validation_data=evaluation, args=args, data_collator=COLLATOR,
                                      compute_metrics=tag_accuracy, preprocess_logits_for_metrics=argmax_logits,
                                      shuffle=False)
        runner.log_metrics("train", train_result.metrics)
        runner.save_metrics("train", train_result.metrics)
        runner.save_state()
        steps.clear()
        metrics = runner.evaluate(metric_key_prefix="eval")
        eval_steps = len(steps)
        runner.save_metrics("eval", metrics)
        prediction = (runner.predict if who == "hf" else runner.hf_predict)(evaluation)
        out[who] = dict(runner=runner, train_result=train_result, metrics=metrics, prediction=prediction, dir=args.output_dir,
                        eval_steps=eval_steps)
    return out


def test_train_output_fields_from_fit(ported):
    hf, ours = ported["hf"]["train_result"], ported["fitkit"]["train_result"]
    assert ours.global_step == hf.global_step == 3
    assert ours.training_loss == pytest.approx(hf.training_loss, abs=1e-5)
    assert set(hf.metrics) - set(ours.metrics) <= {"total_flos"}
    assert ours.history["loss"]  # still Keras' History


def test_evaluate_without_data_and_a_prefix_as_the_trainer(ported):
    hf, ours = ported["hf"], ported["fitkit"]
    assert set(ours["metrics"]) == set(hf["metrics"]) == {"eval_loss", "eval_accuracy", "epoch", "eval_runtime",
                                                          "eval_samples_per_second", "eval_steps_per_second"}
    for name in ("eval_loss", "eval_accuracy", "epoch"):
        assert ours["metrics"][name] == pytest.approx(hf["metrics"][name], abs=1e-5), name
    assert ours["eval_steps"] == hf["eval_steps"] == 4  # 16 samples by per_device_eval_batch_size=5


def test_hf_predict_gives_predictions_label_ids_and_test_metrics(ported):
    hf, ours = ported["hf"]["prediction"], ported["fitkit"]["prediction"]
    predictions, label_ids, metrics = ours
    np.testing.assert_array_equal(predictions, hf.predictions)  # tags, by preprocess_logits_for_metrics
    np.testing.assert_array_equal(label_ids, hf.label_ids)
    assert (label_ids == -100).any() and predictions.shape == label_ids.shape
    assert metrics["test_loss"] == pytest.approx(hf.metrics["test_loss"], abs=1e-5)
    assert metrics["test_accuracy"] == pytest.approx(hf.metrics["test_accuracy"], abs=1e-6)
    assert set(metrics) == set(hf.metrics)
    with pytest.raises(ValueError, match="not enough values"):
        a, b, c, d = ours  # exactly three, never a dict's keys


def test_result_files_as_the_trainers(ported):
    import json
    import pathlib

    for name in ("train_results.json", "eval_results.json", "all_results.json", "trainer_state.json"):
        hf = json.loads(pathlib.Path(ported["hf"]["dir"], name).read_text())
        ours = json.loads(pathlib.Path(ported["fitkit"]["dir"], name).read_text())
        if name == "trainer_state.json":
            assert ours["global_step"] == hf["global_step"]
            continue
        assert set(hf) - set(ours) <= {"total_flos"}, name
        assert ours.get("eval_loss") == pytest.approx(hf.get("eval_loss"), abs=1e-5)


def test_log_metrics_prints_the_trainers_lines(capsys, ported):
    metrics = {"eval_loss": 0.123456, "eval_runtime": 61.5, "epoch": 2.0, "train_mem_cpu_alloc_delta": 3 << 20}
    ported["hf"]["runner"].log_metrics("eval", metrics)
    theirs = capsys.readouterr().out
    Model(torch.nn.Linear(1, 1)).log_metrics("eval", metrics)
    assert capsys.readouterr().out == theirs and "0:01:01.50" in theirs


def test_evaluate_without_data_and_no_validation_data_names_the_fix():
    model = Model(torch.nn.Linear(1, 1)).compile("sgd", "mse")
    with pytest.raises(ValueError, match="validation_data"):
        model.evaluate()
