"""Evaluation features without labels, beside the real `transformers.Trainer` (issue 46): an
extractive-QA model returns `loss=None` on them. The in-fit evaluation, `evaluate`, `hf_predict`
and `predict` return predictions as the Trainer's do, `label_ids` None, no `eval_loss` invented,
and `compute_metrics` is called as the Trainer calls it (only with labels)."""

import numpy as np
import pytest
import torch

from fitkit import Model

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

LENGTH, VOCAB = 12, 20


def _features(n, seed, labeled):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
    columns = {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()}
    if labeled:
        start = torch.randint(0, LENGTH - 3, (n,), generator=g)
        columns |= {"start_positions": start.tolist(), "end_positions": (start + 2).tolist()}
    return datasets.Dataset.from_dict(columns)


TRAIN, EVAL = _features(24, 0, labeled=True), _features(10, 1, labeled=False)


def tiny_qa():
    transformers.set_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=LENGTH,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForQuestionAnswering(config)


def hf_args(tmp_path):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, save_strategy="no",
        eval_strategy="epoch", logging_strategy="epoch", num_train_epochs=2, per_device_train_batch_size=8,
        per_device_eval_batch_size=4, learning_rate=1e-3, seed=0, dataloader_pin_memory=False)


class Calls(list):
    def __call__(self, eval_pred):
        self.append(eval_pred.label_ids)
        return {"f1": 1.0}


def _records(history):
    drop = ("runtime", "per_second", "total_flos")
    return [{k: v for k, v in r.items() if not any(d in k for d in drop)} for r in history]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qa")
    theirs_calls, ours_calls = Calls(), Calls()
    trainer = transformers.Trainer(model=tiny_qa(), args=hf_args(tmp), train_dataset=TRAIN, eval_dataset=EVAL,
                                   compute_metrics=theirs_calls)
    trainer.train()
    # (the Trainer's own calls first: a fit afterwards resets Accelerate's process state)
    history = list(trainer.state.log_history)
    theirs = trainer.predict(EVAL), trainer.evaluate(EVAL), history
    model = Model(tiny_qa()).compile()
    model.fit(TRAIN, validation_data=EVAL, args=hf_args(tmp), compute_metrics=ours_calls, shuffle=True)
    return theirs, theirs_calls, model, ours_calls


def test_the_in_fit_evaluation_of_unlabeled_features_logs_what_the_trainer_logs(both):
    (_, _, history), theirs_calls, model, ours_calls = both
    theirs, ours = _records(history), _records(model.state.log_history)
    assert [sorted(r) for r in ours] == [sorted(r) for r in theirs]  # no eval_loss, no eval_f1 on either side
    assert not any("eval_loss" in r for r in ours)
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, abs=1e-5)
    assert theirs_calls == ours_calls == []  # compute_metrics: not called without labels


def test_evaluate_hf_predict_and_predict_return_the_trainers_predictions(both):
    (theirs, evaluated_by_trainer, _), theirs_calls, model, ours_calls = both
    ours = model.hf_predict(EVAL)
    assert theirs.label_ids is None and ours.label_ids is None
    assert len(ours.predictions) == len(theirs.predictions) == 2  # start and end logits
    for a, b in zip(ours.predictions, theirs.predictions):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert "test_loss" not in ours.metrics and "test_loss" not in theirs.metrics
    evaluated = model.evaluate(EVAL, verbose=0, return_dict=True)
    assert "loss" not in evaluated and "eval_loss" not in evaluated_by_trainer
    outputs = model.predict(EVAL, verbose=0)
    np.testing.assert_allclose(outputs["start_logits"].numpy(), theirs.predictions[0], atol=1e-5)
    assert theirs_calls == ours_calls == []


def test_training_still_needs_a_loss():
    model = Model(tiny_qa()).compile()
    with pytest.raises(ValueError, match="loss"):
        model.fit(EVAL, epochs=1, batch_size=4, verbose=0)
