"""`predict_with_generate` (issue 35): `evaluate` and `hf_predict` hand the module's `generate`
ids, padded across batches, to `compute_metrics`, as HF's `Seq2SeqTrainer` does; corpus-level
metrics see every sample at once."""

import numpy as np
import pytest
import torch

from fitkit import Model

transformers = pytest.importorskip("transformers")


def tiny_t5():
    transformers.set_seed(0)
    cfg = transformers.T5Config(vocab_size=20, d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                                dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(cfg)


def copy_task(n=10):
    """Sequences of varied length to copy (a translation-shaped task); whole batches of 5: the Trainer
    weighs a last, smaller batch's loss as a whole one, fitkit by its samples."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        ids = torch.randint(2, 20, (3 + i % 4,), generator=g).tolist() + [1]
        rows.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)})
    return rows


def collate(rows):
    """Each batch padded to its own length (as DataCollatorForSeq2Seq): inputs with 0, labels with -100."""
    width = max(len(r["input_ids"]) for r in rows)
    pad = lambda key, value: torch.tensor([r[key] + [value] * (width - len(r[key])) for r in rows])  # noqa: E731
    return {"input_ids": pad("input_ids", 0), "attention_mask": pad("attention_mask", 0), "labels": pad("labels", -100)}


def corpus_match(eval_pred):
    """A corpus-level value: matching tokens over all label tokens of the whole set."""
    ids, labels = eval_pred
    width = min(ids.shape[1], labels.shape[1])
    keep = labels[:, :width] != -100
    return {"token_match": float((ids[:, :width][keep] == labels[:, :width][keep]).sum() / keep.sum()),
            "width": float(ids.shape[1])}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp, data = tmp_path_factory.mktemp("gen"), copy_task()
    args = transformers.Seq2SeqTrainingArguments(
        output_dir=str(tmp), report_to="none", disable_tqdm=True, per_device_eval_batch_size=5,
        predict_with_generate=True, generation_max_length=9, generation_num_beams=2, dataloader_pin_memory=False)
    net = tiny_t5()
    model = Model(net).compile("adam", learning_rate=3e-2)
    model.fit(data, epochs=20, batch_size=5, data_collator=collate, verbose=0)  # so that it generates varied ids
    trainer = transformers.Seq2SeqTrainer(model=net, args=args, data_collator=collate, compute_metrics=corpus_match)
    theirs = (trainer.evaluate(data), trainer.predict(data))
    options = dict(data_collator=collate, compute_metrics=corpus_match, per_device_eval_batch_size=5,
                   predict_with_generate=True, generation_max_length=9, generation_num_beams=2)
    ours = (model.evaluate(data, metric_key_prefix="eval", **options), model.hf_predict(data, **options))
    return theirs, ours


def test_evaluate_hands_generated_ids_to_compute_metrics(both):
    (evaluated, _), (ours, _) = both
    assert ours["eval_width"] == evaluated["eval_width"] == 20  # the model's generation length, padded as HF pads
    assert ours["eval_token_match"] == pytest.approx(evaluated["eval_token_match"], abs=1e-6)
    assert ours["eval_loss"] == pytest.approx(evaluated["eval_loss"], abs=1e-5)


def test_hf_predict_returns_the_generated_ids(both):
    (_, predicted), (_, ours) = both
    np.testing.assert_array_equal(ours.predictions, predicted.predictions)
    np.testing.assert_array_equal(ours.label_ids, predicted.label_ids)
    assert len(np.unique(ours.predictions)) > 3  # varied ids, not padding alone


def test_a_module_without_generate_names_the_option():
    model = Model(torch.nn.Linear(2, 2)).compile("sgd", "cross_entropy")
    with pytest.raises(ValueError, match="predict_with_generate"):
        model.evaluate(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long), predict_with_generate=True,
                       compute_metrics=lambda p: {})
