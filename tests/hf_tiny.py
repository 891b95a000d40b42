"""A tiny BERT classifier from a config (dropout off) and token data, shared by the tests that run
`transformers.Trainer` beside fitkit on the Trainer face (`tests/test_hf_face.py`,
`tests/test_hf_search.py`)."""

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

VOCAB = 40
SPEED = ("_runtime", "_per_second")  # timings: present in both runs, never equal


def classifier(seed=0, labels=2):
    """A one-layer BERT classifier, built under `seed` (the Trainer seeds again before training)."""
    transformers.set_seed(seed)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=labels,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(cfg)


def token_data(n, seed=0, length=8):
    """`n` samples of `length` token ids: label 1 when token 3 appears."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, VOCAB, size=(n, length))
    labels = (rng.random(n) < 0.5).astype(int)
    ids[labels == 1, rng.integers(0, length)] = 3
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})


def accuracy(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def assert_same_logs(theirs, ours, abs=1e-5):
    """The same records with the same keys in order, every value but the timings within `abs`."""
    assert [list(r) for r in ours] == [list(r) for r in theirs]
    for hf_record, record in zip(theirs, ours):
        for key, value in hf_record.items():
            if not key.endswith(SPEED):
                assert record[key] == pytest.approx(value, abs=abs), (key, hf_record.get("step"))
