"""Translation (sequence to sequence, evaluated by generation) as transformers'
`run_translation.py` does it, offline.

`run_translation.py` trains with `transformers.Seq2SeqTrainer`; `run_translation_fitkit.py` is
the same script with only the Trainer lines changed (`tests/test_hf_ports.py` counts them and
runs both):

    python examples/hf/run_translation.py --output_dir mt_out --predict_with_generate --num_train_epochs 3
    python examples/hf/run_translation_fitkit.py --output_dir mt_out_fitkit --predict_with_generate --num_train_epochs 3

A small T5 built from a config, a tokenizer and word-for-word translation pairs made in-process
(`offline.py`), `DataCollatorForSeq2Seq` (each batch padded to its own length, labels with
-100), evaluation and prediction by `generate` with a corpus BLEU; the Trainer's result files
and `generated_predictions.txt` in `output_dir`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np
from offline import corpus_bleu, load_dataset, make_tokenizer
from transformers import (
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
    set_seed,
)

from fitkit import Model


@dataclass
class DataTrainingArguments:
    max_source_length: int = field(default=16, metadata={"help": "Longest tokenized source"})
    max_target_length: int = field(default=16, metadata={"help": "Longest tokenized target"})
    val_max_target_length: int = field(default=12, metadata={"help": "generate's max_length in evaluation"})
    num_beams: int = field(default=2, metadata={"help": "generate's num_beams in evaluation"})


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DataTrainingArguments, Seq2SeqTrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training_args.seed)

    raw_datasets = load_dataset("translation")
    tokenizer = make_tokenizer("t5")
    config = T5Config(vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2,
                      dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    model = T5ForConditionalGeneration(config)
    column_names = raw_datasets["train"].column_names

    def preprocess_function(examples):
        inputs = [ex["src"] for ex in examples["translation"]]
        targets = [ex["tgt"] for ex in examples["translation"]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, truncation=True)
        labels = tokenizer(text_target=targets, max_length=data_args.max_target_length, truncation=True)
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
        decoded_preds = tokenizer.batch_decode(preds, skip_special_tokens=True)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = tokenizer.batch_decode(labels, skip_special_tokens=True)
        result = {"bleu": corpus_bleu([p.strip() for p in decoded_preds], [label.strip() for label in decoded_labels])}
        result["gen_len"] = np.mean([np.count_nonzero(pred != tokenizer.pad_token_id) for pred in preds])
        return {k: round(float(v), 4) for k, v in result.items()}

    trainer = Model(model).compile()

    train_result = trainer.fit(train_dataset, validation_data=eval_dataset, args=training_args,
                               processing_class=tokenizer, data_collator=data_collator,
                               compute_metrics=compute_metrics if training_args.predict_with_generate else None)
    trainer.save_model()
    metrics = train_result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    metrics = trainer.evaluate(generation_max_length=data_args.val_max_target_length,
                               generation_num_beams=data_args.num_beams, metric_key_prefix="eval")
    metrics["eval_samples"] = len(eval_dataset)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)

    predict_results = trainer.hf_predict(predict_dataset, metric_key_prefix="predict",
                                         generation_max_length=data_args.val_max_target_length,
                                         generation_num_beams=data_args.num_beams)
    metrics = predict_results.metrics
    metrics["predict_samples"] = len(predict_dataset)
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    if trainer.state.is_world_process_zero and training_args.predict_with_generate:
        ids = np.where(predict_results.predictions != -100, predict_results.predictions, tokenizer.pad_token_id)
        predictions = [p.strip() for p in tokenizer.batch_decode(ids, skip_special_tokens=True)]
        with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w", encoding="utf-8") as writer:
            writer.write("\n".join(predictions))
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
