"""Token classification (named entities) as transformers' `run_ner.py` does it, offline.

`run_ner.py` trains with `transformers.Trainer`; `run_ner_fitkit.py` is the same script with
only the Trainer lines changed (`tests/test_hf_ports.py` counts them and runs both):

    python examples/hf/run_ner.py --output_dir ner_out --num_train_epochs 3
    python examples/hf/run_ner_fitkit.py --output_dir ner_out_fitkit --num_train_epochs 3

A small BERT built from a config, a tokenizer and a dataset made in-process (`offline.py`),
`tokenize_and_align_labels` and `DataCollatorForTokenClassification` (each batch padded to its
own length), seqeval-style metrics; `train_results.json`, `eval_results.json`,
`predict_results.json`, `all_results.json`, `trainer_state.json` and `predictions.txt` in
`output_dir`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np
from offline import NER_TAGS, entity_scores, load_dataset, make_tokenizer
from transformers import (
    BertConfig,
    BertForTokenClassification,
    DataCollatorForTokenClassification,
    HfArgumentParser,
    TrainingArguments,
    set_seed,
)

from fitkit import Model


@dataclass
class DataTrainingArguments:
    label_all_tokens: bool = field(default=False, metadata={"help": "Tag every sub-token, not only the first"})
    max_seq_length: int = field(default=32, metadata={"help": "Longest tokenized input"})


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DataTrainingArguments, TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training_args.seed)

    raw_datasets = load_dataset("ner")
    label_list = NER_TAGS
    tokenizer = make_tokenizer("bert")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=len(label_list),
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForTokenClassification(config)

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(examples["tokens"], truncation=True, max_length=data_args.max_seq_length,
                              is_split_into_words=True)
        labels = []
        for i, tags in enumerate(examples["ner_tags"]):
            previous, ids = None, []
            for word in tokenized.word_ids(batch_index=i):
                if word is None:
                    ids.append(-100)
                elif word != previous or data_args.label_all_tokens:
                    ids.append(tags[word])
                else:
                    ids.append(-100)
                previous = word
            labels.append(ids)
        tokenized["labels"] = labels
        return tokenized

    with training_args.main_process_first(desc="dataset map pre-processing"):
        tokenized = raw_datasets.map(tokenize_and_align_labels, batched=True,
                                     remove_columns=raw_datasets["train"].column_names)
    train_dataset, eval_dataset, predict_dataset = tokenized["train"], tokenized["validation"], tokenized["test"]
    data_collator = DataCollatorForTokenClassification(tokenizer)

    def compute_metrics(p):
        predictions, labels = p
        predictions = np.argmax(predictions, axis=2)
        true_predictions = [[label_list[p] for (p, l) in zip(prediction, label) if l != -100]
                            for prediction, label in zip(predictions, labels)]
        true_labels = [[label_list[l] for (p, l) in zip(prediction, label) if l != -100]
                       for prediction, label in zip(predictions, labels)]
        results = entity_scores(true_predictions, true_labels)
        return {"precision": results["overall_precision"], "recall": results["overall_recall"],
                "f1": results["overall_f1"], "accuracy": results["overall_accuracy"]}

    trainer = Model(model).compile()

    train_result = trainer.fit(train_dataset, validation_data=eval_dataset, args=training_args,
                               processing_class=tokenizer, data_collator=data_collator, compute_metrics=compute_metrics)
    metrics = train_result.metrics
    trainer.save_model()
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    metrics = trainer.evaluate(metric_key_prefix="eval")
    metrics["eval_samples"] = len(eval_dataset)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)

    predictions, labels, metrics = trainer.hf_predict(predict_dataset, metric_key_prefix="predict")
    predictions = np.argmax(predictions, axis=2)
    true_predictions = [[label_list[p] for (p, l) in zip(prediction, label) if l != -100]
                        for prediction, label in zip(predictions, labels)]
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    if trainer.state.is_world_process_zero:
        with open(os.path.join(training_args.output_dir, "predictions.txt"), "w") as writer:
            writer.writelines(" ".join(prediction) + "\n" for prediction in true_predictions)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
