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
    ours = model.evaluate(DATA, verbose=0, batch_size=8)
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
    plain = model.evaluate(DATA, verbose=0, batch_size=8)
    chunked = model.evaluate(DATA, verbose=0, batch_size=8, eval_accumulation_steps=2)
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
