"""Fine-tuning text classification the Hugging Face way, offline, trained by the HF Trainer or by fitkit.

The shape of transformers' text-classification example: a tokenizer (here trained in-process
and wrapped in `PreTrainedTokenizerFast`, so nothing is downloaded), a small BERT built from a
config, a `datasets.Dataset` with `text`, `label` and `idx` columns tokenized by `map`,
`DataCollatorWithPadding`, `compute_metrics`, `EarlyStoppingCallback`. Everything but the
train lines is the same for both::

    python examples/text_classification.py --trainer hf         # transformers.Trainer
    python examples/text_classification.py --trainer fitkit     # fitkit, the train lines swapped

It prints one JSON line: the epochs trained, the best checkpoint, the evaluation accuracy and
the predictions of the trained model on the evaluation set.
"""

from __future__ import annotations

import argparse
import json
import random

import datasets
import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    EarlyStoppingCallback,
    PreTrainedTokenizerFast,
    TrainingArguments,
)

GOOD = ["good", "great", "fine", "lovely", "superb", "nice"]
BAD = ["bad", "awful", "poor", "dreadful", "grim", "nasty"]
FILLER = ["the", "film", "was", "plot", "acting", "really", "quite", "a", "story", "and", "very", "music"]


def make_texts(n: int, seed: int) -> tuple[list[str], list[int]]:
    """Short reviews of varied length: the label is whether the sentiment word is a good one."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = rng.choices(FILLER, k=rng.randint(3, 12))
        words.insert(rng.randint(0, len(words)), rng.choice(GOOD if label else BAD))
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


def make_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on `texts`, wrapped as transformers wraps any fast tokenizer."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                              "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=["hf", "fitkit"], default="fitkit")
    parser.add_argument("--output-dir", default="text_classification_out")
    parser.add_argument("--epochs", type=int, default=8)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    transformers.set_seed(0)

    train_texts, train_labels = make_texts(320, seed=1)
    eval_texts, eval_labels = make_texts(64, seed=2)
    tokenizer = make_tokenizer(train_texts)
    raw = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": train_texts, "label": train_labels, "idx": list(range(320))}),
        "validation": datasets.Dataset.from_dict({"text": eval_texts, "label": eval_labels, "idx": list(range(64))}),
    })
    tokenized = raw.map(lambda batch: tokenizer(batch["text"], truncation=True), batched=True)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    training_args = TrainingArguments(
        output_dir=opts.output_dir, learning_rate=2e-3, per_device_train_batch_size=16, per_device_eval_batch_size=32,
        num_train_epochs=opts.epochs, weight_decay=0.01, eval_strategy="epoch", save_strategy="epoch",
        load_best_model_at_end=True, metric_for_best_model="accuracy", save_total_limit=2, report_to="none",
        logging_strategy="epoch", seed=0, disable_tqdm=True)
    data_collator = DataCollatorWithPadding(tokenizer)
    callbacks = [EarlyStoppingCallback(early_stopping_patience=2)]

    # -- the train lines: the only ones that differ ---------------------------------------------
    if opts.trainer == "hf":
        from transformers import Trainer

        trainer = Trainer(model=model, args=training_args, train_dataset=tokenized["train"],
                          eval_dataset=tokenized["validation"], processing_class=tokenizer, data_collator=data_collator,
                          compute_metrics=compute_metrics, callbacks=callbacks)
        trainer.train()
        state, accuracy = trainer.state, trainer.evaluate()["eval_accuracy"]
    else:
        from fitkit import Model

        trainer = Model(model).compile()
        trainer.fit(tokenized["train"], validation_data=tokenized["validation"], args=training_args,
                    processing_class=tokenizer, data_collator=data_collator, compute_metrics=compute_metrics,
                    callbacks=callbacks)
        state, accuracy = trainer.state, trainer.evaluate(tokenized["validation"], return_dict=True)["accuracy"]
    # ---------------------------------------------------------------------------------------------

    model.eval()
    with torch.no_grad():
        batch = data_collator([{k: v for k, v in s.items() if k in ("input_ids", "token_type_ids", "attention_mask")}
                               for s in tokenized["validation"]])
        predictions = model(**batch).logits.argmax(-1).tolist()
    print(json.dumps({"trainer": opts.trainer, "epochs": state.epoch, "global_step": state.global_step,
                      "best_checkpoint": state.best_model_checkpoint, "best_step": state.best_global_step,
                      "accuracy": accuracy, "predictions": predictions}))


if __name__ == "__main__":
    main()
