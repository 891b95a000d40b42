"""Issue 35: each task shape of HF's example scripts trained by `transformers.Trainer` (or
`Seq2SeqTrainer`) and by fitkit under the same `args=`, data, seed and tiny model (dropout off):
the same log history (every loss, `grad_norm`, learning rate and metric within 1e-5, the same
keys in the same order, no extra record), the same best checkpoint and the same
`predictions` / `label_ids`. Token classification (dynamic padding), causal LM (`group_texts`,
perplexity), seq2seq (generation, a corpus-level metric) and image classification."""

import math
import os
import sys

import numpy as np
import pytest
import torch

from fitkit import Model

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from text_classification import make_texts, make_tokenizer  # noqa: E402

TEXTS, _ = make_texts(40, seed=3)
TOKENIZER = make_tokenizer(TEXTS)
VOCAB = TOKENIZER.vocab_size
SPEED = ("_runtime", "_per_second")  # timings: present in both, never equal


def hf_args(output_dir, seq2seq=False, **kw):
    """The arguments both runs get: 2 epochs of 3 steps, a log every 2 steps (one log spans an
    epoch end), an evaluation and a checkpoint per epoch, one checkpoint kept."""
    base = dict(output_dir=str(output_dir), report_to="none", disable_tqdm=True, num_train_epochs=2,
                per_device_train_batch_size=8, per_device_eval_batch_size=5, learning_rate=5e-3, logging_steps=2,
                eval_strategy="epoch", save_strategy="epoch", save_total_limit=1, seed=0,
                dataloader_pin_memory=False)
    base.update(kw)
    cls = transformers.Seq2SeqTrainingArguments if seq2seq else transformers.TrainingArguments
    return cls(**base)


def both(tmp, make_model, train, evaluation, *, seq2seq=False, args=None, **options):
    """The Trainer's run and fitkit's, each from a fresh model: (log_history, best checkpoint name,
    checkpoints left, predict's output) per runner; an `evaluate()` after training adds its record."""
    out = {}
    for who in ("hf", "fitkit"):
        arguments = hf_args(tmp / who, seq2seq=seq2seq, **(args or {}))
        net = make_model()
        if who == "hf":
            cls = transformers.Seq2SeqTrainer if seq2seq else transformers.Trainer
            runner = cls(model=net, args=arguments, train_dataset=train, eval_dataset=evaluation, **options)
            runner.train()
            prediction = runner.predict(evaluation)
            runner.evaluate()  # logs its record after training's, as fitkit's below
        else:
            runner = Model(net).compile()
            runner.fit(train, validation_data=evaluation, args=arguments, **options)
            prediction = runner.hf_predict(evaluation)
            runner.evaluate(return_dict=True)
        best = runner.state.best_model_checkpoint
        out[who] = dict(logs=runner.state.log_history, best=best and os.path.basename(best),
                        kept=sorted(os.listdir(arguments.output_dir)) if os.path.isdir(arguments.output_dir) else [],
                        prediction=prediction, best_metric=runner.state.best_metric)
    return out["hf"], out["fitkit"]


def assert_same_run(hf, ours):
    hf_logs = hf["logs"]
    assert [list(r) for r in ours["logs"]] == [list(r) for r in hf_logs]  # the same records, keys in order
    assert "eval_loss" in hf_logs[-1] and "train_runtime" in hf_logs[-2]  # evaluate() after training logged
    for theirs, mine in zip(hf_logs, ours["logs"]):
        for key, value in theirs.items():
            if not key.endswith(SPEED):
                assert mine[key] == pytest.approx(value, abs=1e-5), (key, theirs["step"])
    assert any("grad_norm" in r for r in ours["logs"])
    assert ours["best"] == hf["best"] and ours["kept"] == hf["kept"]
    assert (ours["best_metric"] is None) == (hf["best_metric"] is None)
    if hf["best_metric"] is not None:
        assert ours["best_metric"] == pytest.approx(hf["best_metric"], abs=1e-5)
    mine, theirs = ours["prediction"], hf["prediction"]
    np.testing.assert_allclose(mine.predictions, theirs.predictions, atol=1e-5)
    np.testing.assert_array_equal(mine.label_ids, theirs.label_ids)
    for key, value in theirs.metrics.items():
        if not key.endswith(SPEED):
            assert mine.metrics[key] == pytest.approx(value, abs=1e-5), key


def argmax_logits(logits, labels):  # run_ner / run_clm pass this as preprocess_logits_for_metrics
    return logits.argmax(-1)


# -- token classification (run_ner.py): batches padded each to its own length ---------------------
def tagger():
    transformers.set_seed(0)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=32, num_labels=3,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForTokenClassification(cfg)


def tagged():
    def tag(batch):
        enc = TOKENIZER(batch["text"], truncation=True)
        enc["labels"] = [[-100] + [min(len(w), 6) // 3 for w in text.split()] + [-100] for text in batch["text"]]
        return enc
    return datasets.Dataset.from_dict({"text": TEXTS}).map(tag, batched=True, remove_columns=["text"])


def tag_accuracy(eval_pred):
    tags, labels = eval_pred
    keep = labels != -100
    return {"accuracy": float((tags[keep] == labels[keep]).mean())}


def test_token_classification_as_the_trainer(tmp_path):
    data = tagged()
    hf, ours = both(tmp_path, tagger, data.select(range(24)), data.select(range(24, 40)),
                    args=dict(metric_for_best_model="accuracy"),
                    data_collator=transformers.DataCollatorForTokenClassification(TOKENIZER),
                    compute_metrics=tag_accuracy, preprocess_logits_for_metrics=argmax_logits)
    assert_same_run(hf, ours)
    assert ours["best"] is not None and ours["kept"] == [ours["best"]]  # a limit of 1 keeps the best alone


# -- causal language modelling (run_clm.py): group_texts, perplexity --------------------------------
BLOCK = 8


def grouped():
    def group_texts(examples):  # run_clm.py's: concatenate, cut into blocks, labels = inputs
        joined = {k: sum(examples[k], []) for k in examples}
        total = len(joined["input_ids"]) // BLOCK * BLOCK
        out = {k: [t[i:i + BLOCK] for i in range(0, total, BLOCK)] for k, t in joined.items()}
        out["labels"] = out["input_ids"].copy()
        return out
    tokens = datasets.Dataset.from_dict({"text": TEXTS}).map(lambda b: TOKENIZER(b["text"]), batched=True,
                                                              remove_columns=["text"])
    return tokens.map(group_texts, batched=True)


def tiny_gpt2():
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=BLOCK, n_embd=16, n_layer=1, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    net = transformers.GPT2LMHeadModel(cfg)
    # Named, as a pretrained causal LM's is: with `loss_type` None, Trainer 5.23 counts the first label of
    # each block into `num_items_in_batch` too and logs the loss scaled by (BLOCK - 1) / BLOCK
    net.loss_type = "ForCausalLM"
    return net


def next_token_accuracy(eval_pred):
    preds, labels = eval_pred
    return {"accuracy": float((preds[:, :-1] == labels[:, 1:]).mean())}


def test_causal_lm_as_the_trainer_with_perplexity(tmp_path):
    blocks = grouped()
    assert len(blocks) >= 40
    hf, ours = both(tmp_path, tiny_gpt2, blocks.select(range(24)), blocks.select(range(24, 39)),
                    data_collator=transformers.default_data_collator, compute_metrics=next_token_accuracy,
                    preprocess_logits_for_metrics=argmax_logits)
    assert_same_run(hf, ours)
    assert hf["best"] is ours["best"] is None and ours["kept"] == ["checkpoint-6"]  # no best asked for: none kept
    evaluations = [r for r in ours["logs"] if "eval_loss" in r]
    perplexity = math.exp(evaluations[-1]["eval_loss"])  # run_clm.py's line, unchanged
    assert perplexity == pytest.approx(math.exp([r for r in hf["logs"] if "eval_loss" in r][-1]["eval_loss"]))


# -- seq2seq with generation (run_translation.py): a corpus-level metric ----------------------------
def tiny_t5():
    transformers.set_seed(0)
    cfg = transformers.T5Config(vocab_size=20, d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                                dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    return transformers.T5ForConditionalGeneration(cfg)


def reversals(n):
    g = torch.Generator().manual_seed(1)
    rows = []
    for i in range(n):
        ids = torch.randint(2, 20, (3 + i % 4,), generator=g).tolist()
        rows.append({"input_ids": ids + [1], "attention_mask": [1] * (len(ids) + 1), "labels": ids[::-1] + [1]})
    return datasets.Dataset.from_list(rows)


def corpus_match(eval_pred):
    """Matching tokens over every label token of the set (corpus-level, as BLEU)."""
    ids, labels = eval_pred
    width = min(ids.shape[1], labels.shape[1])
    keep = labels[:, :width] != -100
    return {"token_match": float((ids[:, :width][keep] == labels[:, :width][keep]).sum() / keep.sum())}


def test_seq2seq_with_generation_as_the_trainer(tmp_path):
    data = reversals(34)
    collator = transformers.DataCollatorForSeq2Seq(TOKENIZER, label_pad_token_id=-100)
    hf, ours = both(tmp_path, tiny_t5, data.select(range(24)), data.select(range(24, 34)), seq2seq=True,
                    args=dict(predict_with_generate=True, generation_max_length=8, generation_num_beams=2,
                              metric_for_best_model="token_match", learning_rate=3e-2),
                    data_collator=collator, compute_metrics=corpus_match)
    assert_same_run(hf, ours)
    assert ours["prediction"].predictions.shape[1] == 20  # generated ids padded to generation's default max_length


# -- image classification (run_image_classification.py) -----------------------------------------
def tiny_vit():
    transformers.set_seed(0)
    cfg = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=32, num_labels=3, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    return transformers.ViTForImageClassification(cfg)


def images(n):
    g = torch.Generator().manual_seed(2)
    labels = torch.arange(n) % 3
    pixels = torch.randn(n, 3, 8, 8, generator=g) + labels.view(-1, 1, 1, 1).float()
    return datasets.Dataset.from_dict({"pixel_values": pixels.numpy(), "labels": labels.numpy()}).with_format("torch")


def accuracy(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def test_image_classification_as_the_trainer(tmp_path):
    data = images(40)
    hf, ours = both(tmp_path, tiny_vit, data.select(range(24)), data.select(range(24, 40)),
                    args=dict(metric_for_best_model="loss", max_grad_norm=0.0),
                    compute_metrics=accuracy)
    assert_same_run(hf, ours)  # grad_norm logged with clipping off too, as the Trainer measures it


# -- the printed logs under disable_tqdm ------------------------------------------------------------
def test_disable_tqdm_prints_each_log_as_the_trainer(tmp_path, capsys):
    data = images(16)
    args = hf_args(tmp_path, eval_strategy="no", save_strategy="no", num_train_epochs=1)
    trainer = transformers.Trainer(model=tiny_vit(), args=args, train_dataset=data)
    trainer.train()
    trainer.evaluate(data)
    theirs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    model = Model(tiny_vit()).compile()
    model.fit(data, args=args)
    model.evaluate(data, verbose=0)
    ours = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(ours) == len(theirs) == 3  # the log at step 2, the closing record, evaluate()'s record
    assert ours[0] == theirs[0]
    assert ours[1].startswith("{'train_runtime': '") and theirs[1].startswith("{'train_runtime': '")
    assert ours[2].split(", 'eval_runtime'")[0] == theirs[2].split(", 'eval_runtime'")[0]  # eval_loss printed


def test_a_log_spanning_an_epoch_end_is_the_same_after_a_resume_there(tmp_path):
    """The steps after an epoch's last log are carried into the next epoch's first log, also
    through a checkpoint written at that epoch's end."""
    data = images(24)
    options = dict(eval_strategy="no", lr_scheduler_type="constant", save_total_limit=None)

    def losses(model):
        return [(r["step"], r["loss"]) for r in model.state.log_history if "loss" in r]

    whole = Model(tiny_vit()).compile()
    whole.fit(data, args=hf_args(tmp_path / "whole", **options))
    first = Model(tiny_vit()).compile()
    first.fit(data, args=hf_args(tmp_path / "cut", num_train_epochs=1, **options))
    assert losses(first) == losses(whole)[:1]  # step 3 ended epoch 1 unlogged
    resumed = Model(tiny_vit()).compile()
    resumed.fit(data, args=hf_args(tmp_path / "cut", resume_from_checkpoint=True, **options))
    assert [s for s, _ in losses(resumed)] == [2, 4, 6]
    assert losses(resumed)[1][1] == pytest.approx(losses(whole)[1][1], abs=1e-6)  # steps 3 and 4, as uninterrupted
