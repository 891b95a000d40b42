"""Summarization (sequence to sequence, evaluated by generation with ROUGE) as transformers'
`run_summarization.py` does it, offline.

`run_summarization.py` trains with `transformers.Seq2SeqTrainer`; `run_summarization_fitkit.py`
is the same script with only the Trainer lines changed (`tests/test_hf_ports.py` counts them and
runs both):

    python examples/hf/run_summarization.py --output_dir sum_out --predict_with_generate --num_train_epochs 3
    python examples/hf/run_summarization_fitkit.py --output_dir sum_out_fitkit --predict_with_generate --num_train_epochs 3

A small BART built from a config, a tokenizer and documents whose summary is their first three words
(`offline.py`), an optional `source_prefix`, labels padded with -100 by `DataCollatorForSeq2Seq`,
generation lengths and beams taken from the arguments (`generation_max_length`,
`generation_num_beams`), ROUGE-1/2/L and the generated length as metrics; the Trainer's result
files and `generated_predictions.txt` in `output_dir`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np
from offline import load_dataset, make_tokenizer, rouge_scores
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)


@dataclass
class DataTrainingArguments:
    text_column: str = field(default="document", metadata={"help": "The column of the full texts"})
    summary_column: str = field(default="summary", metadata={"help": "The column of the summaries"})
    source_prefix: str = field(default="", metadata={"help": "A prefix before every source text"})
    max_source_length: int = field(default=16, metadata={"help": "Longest tokenized source"})
    max_target_length: int = field(default=8, metadata={"help": "Longest tokenized summary"})


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DataTrainingArguments, Seq2SeqTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training_args.seed)

    raw_datasets = load_dataset("summarization")
    tokenizer = make_tokenizer("t5")
    config = BartConfig(vocab_size=tokenizer.vocab_size, d_model=32, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_position_embeddings=32, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.cls_token_id, decoder_start_token_id=tokenizer.eos_token_id,
                        forced_eos_token_id=tokenizer.eos_token_id)
    model = BartForConditionalGeneration(config)
    column_names = raw_datasets["train"].column_names

    def preprocess_function(examples):
        inputs = [data_args.source_prefix + text for text in examples[data_args.text_column]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, truncation=True)
        labels = tokenizer(text_target=examples[data_args.summary_column], max_length=data_args.max_target_length,
                           truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    with training_args.main_process_first(desc="dataset map pre-processing"):
        tokenized = raw_datasets.map(preprocess_function, batched=True, remove_columns=column_names)
    train_dataset, eval_dataset, predict_dataset = tokenized["train"], tokenized["validation"], tokenized["test"]
    data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = [p.strip() for p in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = [label.strip() for label in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        result = {k: v * 100 for k, v in rouge_scores(decoded_preds, decoded_labels).items()}
        result["gen_len"] = np.mean([np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds])
        return {k: round(float(v), 4) for k, v in result.items()}

    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                             processing_class=tokenizer, data_collator=data_collator,
                             compute_metrics=compute_metrics if training_args.predict_with_generate else None)

    train_result = trainer.train()
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

    predict_results = trainer.predict(predict_dataset, metric_key_prefix="predict")
    metrics = predict_results.metrics
    metrics["predict_samples"] = len(predict_dataset)
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    if trainer.is_world_process_zero() and training_args.predict_with_generate:
        ids = np.where(predict_results.predictions != -100, predict_results.predictions, tokenizer.pad_token_id)
        predictions = [p.strip() for p in tokenizer.batch_decode(ids, skip_special_tokens=True)]
        with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w", encoding="utf-8") as writer:
            writer.write("\n".join(predictions))
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
