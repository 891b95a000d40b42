"""Causal language modeling as transformers' `run_clm.py` does it, offline.

`run_clm.py` trains with `transformers.Trainer`; `run_clm_fitkit.py` is the same script with
only the Trainer lines changed (`tests/test_hf_ports.py` counts them and runs both):

    python examples/hf/run_clm.py --output_dir clm_out --num_train_epochs 3
    python examples/hf/run_clm_fitkit.py --output_dir clm_out_fitkit --num_train_epochs 3

A small Llama built from a config, a tokenizer and a text dataset made in-process
(`offline.py`), `group_texts` into blocks, `default_data_collator`,
`preprocess_logits_for_metrics` (the argmax, so that evaluation keeps ids, not every logit), the
next-token accuracy and the perplexity; the Trainer's result files in `output_dir`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from itertools import chain

from offline import load_dataset, make_tokenizer
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


@dataclass
class DataTrainingArguments:
    block_size: int = field(default=16, metadata={"help": "Tokens per training sample after grouping"})


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DataTrainingArguments, TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training_args.seed)

    raw_datasets = load_dataset("text")
    tokenizer = make_tokenizer("gpt2")
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    column_names = raw_datasets["train"].column_names

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized_datasets = raw_datasets.map(tokenize_function, batched=True, remove_columns=column_names)
    block_size = data_args.block_size

    def group_texts(examples):
        concatenated = {k: list(chain(*examples[k])) for k in examples}
        total_length = (len(concatenated["input_ids"]) // block_size) * block_size
        result = {k: [t[i:i + block_size] for i in range(0, total_length, block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized_datasets.map(group_texts, batched=True)
    train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["validation"]

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels = labels[:, 1:].reshape(-1)
        preds = preds[:, :-1].reshape(-1)
        return {"accuracy": float((preds == labels).mean())}

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                      processing_class=tokenizer, data_collator=default_data_collator,
                      compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics)

    train_result = trainer.train()
    trainer.save_model()
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    metrics = trainer.evaluate()
    metrics["eval_samples"] = len(eval_dataset)
    try:
        perplexity = math.exp(metrics["eval_loss"])
    except OverflowError:
        perplexity = float("inf")
    metrics["perplexity"] = perplexity
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
