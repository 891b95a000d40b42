"""Multiple choice (SWAG) as transformers' `run_swag.py` does it, offline.

`run_swag.py` trains with `transformers.Trainer`; `run_swag_fitkit.py` is the same script with
only the Trainer lines changed (`tests/test_hf_ports.py` counts them and runs both):

    python examples/hf/run_swag.py --output_dir swag_out --num_train_epochs 3
    python examples/hf/run_swag_fitkit.py --output_dir swag_out_fitkit --num_train_epochs 3

A small BERT for multiple choice (`AutoModelForMultipleChoice` from a config, dropout on), a
tokenizer and a SWAG-shaped dataset made in-process (`offline.py`): each context paired with each
of its four endings, the choices of a batch padded together by the script's own collator
(`DataCollatorForMultipleChoice`), accuracy as the metric; `train_results.json`,
`eval_results.json`, `all_results.json`, `trainer_state.json` and the model in `output_dir`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch
from offline import load_dataset, make_tokenizer
from transformers import (
    AutoModelForMultipleChoice,
    BertConfig,
    HfArgumentParser,
    PreTrainedTokenizerBase,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

from fitkit import Model

ENDINGS = [f"ending{i}" for i in range(4)]


@dataclass
class DataTrainingArguments:
    max_seq_length: int = field(default=32, metadata={"help": "Longest tokenized context-ending pair"})
    pad_to_max_length: bool = field(default=False, metadata={"help": "Pad every pair to max_seq_length"})
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N samples only"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N samples only"})


@dataclass
class DataCollatorForMultipleChoice:
    """Pads the choices of every sample of a batch to one length: the batch's samples are
    flattened into `batch_size * num_choices` sequences, padded by the tokenizer, and reshaped
    back to `(batch_size, num_choices, length)`."""

    tokenizer: PreTrainedTokenizerBase
    pad_to_multiple_of: int | None = None

    def __call__(self, features):
        label_key = "label" if "label" in features[0] else "labels"
        labels = [feature.pop(label_key) for feature in features]
        choices = len(features[0]["input_ids"])
        flat = list(chain.from_iterable([{k: v[i] for k, v in feature.items()} for i in range(choices)]
                                        for feature in features))
        batch = self.tokenizer.pad(flat, padding=True, pad_to_multiple_of=self.pad_to_multiple_of, return_tensors="pt")
        batch = {k: v.view(len(features), choices, -1) for k, v in batch.items()}
        batch["labels"] = torch.tensor(labels, dtype=torch.int64)
        return batch


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DataTrainingArguments, TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training_args.seed)

    raw_datasets = load_dataset("swag")
    tokenizer = make_tokenizer("bert")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    model = AutoModelForMultipleChoice.from_config(config)
    max_seq_length = min(data_args.max_seq_length, config.max_position_embeddings)

    def preprocess_function(examples):
        # every context four times, beside the start of the next sentence with each ending
        first_sentences = [context for context in examples["sent1"] for _ in ENDINGS]
        second_sentences = [f"{header} {examples[end][i]}" for i, header in enumerate(examples["sent2"])
                            for end in ENDINGS]
        tokenized = tokenizer(first_sentences, second_sentences, truncation=True, max_length=max_seq_length,
                              padding="max_length" if data_args.pad_to_max_length else False)
        return {k: [v[i : i + len(ENDINGS)] for i in range(0, len(v), len(ENDINGS))] for k, v in tokenized.items()}

    train_dataset, eval_dataset = raw_datasets["train"], raw_datasets["validation"]
    if data_args.max_train_samples is not None:
        train_dataset = train_dataset.select(range(min(len(train_dataset), data_args.max_train_samples)))
    if data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))
    with training_args.main_process_first(desc="dataset map pre-processing"):
        train_dataset = train_dataset.map(preprocess_function, batched=True)
        eval_dataset = eval_dataset.map(preprocess_function, batched=True)
    data_collator = (default_data_collator if data_args.pad_to_max_length else
                     DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None))

    def compute_metrics(eval_predictions):
        predictions, label_ids = eval_predictions
        return {"accuracy": float((np.argmax(predictions, axis=1) == label_ids).astype(np.float32).mean())}

    trainer = Model(model).compile()

    train_result = trainer.fit(train_dataset, validation_data=eval_dataset, args=training_args,
                               processing_class=tokenizer, data_collator=data_collator, compute_metrics=compute_metrics,
                               resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    metrics = trainer.evaluate(metric_key_prefix="eval")
    metrics["eval_samples"] = len(eval_dataset)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
