"""Extractive question answering as transformers' `run_qa.py` does it, offline.

`run_qa.py` trains with its own `QuestionAnsweringTrainer` (`trainer_qa.py`: a `Trainer` whose
`evaluate` and `predict` post-process the start/end logits into answer texts before
`compute_metrics`);
`run_qa_fitkit.py` is the same script with only the Trainer lines changed (the post-processing
passed as `post_process_function`; `tests/test_hf_ports.py` counts them and runs both):

    python examples/hf/run_qa.py --output_dir qa_out --num_train_epochs 3
    python examples/hf/run_qa_fitkit.py --output_dir qa_out_fitkit --num_train_epochs 3

A small BERT built from a config, a tokenizer and a SQuAD-like dataset made in-process
(`offline.py`); training features carry `start_positions` / `end_positions`, evaluation features
carry none (their `offset_mapping` and `example_id` serve the post-processing); SQuAD's EM and
F1; `train_results.json`, `eval_results.json`, `predict_results.json`, `all_results.json`,
`trainer_state.json`, `eval_predictions.json` and `predict_predictions.json` in `output_dir`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np
from offline import load_dataset, make_tokenizer, squad_scores
from trainer_qa import QuestionAnsweringTrainer
from transformers import (
    BertConfig,
    BertForQuestionAnswering,
    EvalPrediction,
    HfArgumentParser,
    TrainingArguments,
    default_data_collator,
    set_seed,
)


@dataclass
class DataTrainingArguments:
    max_seq_length: int = field(default=48, metadata={"help": "Longest tokenized question and context"})
    n_best_size: int = field(default=5, metadata={"help": "Start and end candidates looked at per feature"})
    max_answer_length: int = field(default=8, metadata={"help": "Longest answer, in tokens"})


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((DataTrainingArguments, TrainingArguments))
    data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    set_seed(training_args.seed)

    raw_datasets = load_dataset("qa")
    tokenizer = make_tokenizer("bert")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForQuestionAnswering(config)

    def prepare_train_features(examples):
        tokenized = tokenizer(examples["question"], examples["context"], truncation="only_second",
                              max_length=data_args.max_seq_length, padding="max_length",
                              return_offsets_mapping=True)
        starts, ends = [], []
        for i, offsets in enumerate(tokenized.pop("offset_mapping")):
            answer, sequence_ids = examples["answers"][i], tokenized.sequence_ids(i)
            first = answer["answer_start"][0]
            last = first + len(answer["text"][0])
            context = [j for j, s in enumerate(sequence_ids) if s == 1]
            start = next((j for j in context if offsets[j][0] <= first < offsets[j][1]), 0)
            end = next((j for j in context if offsets[j][0] < last <= offsets[j][1]), 0)
            starts.append(start)
            ends.append(end)
        tokenized["start_positions"], tokenized["end_positions"] = starts, ends
        return tokenized

    def prepare_validation_features(examples):
        tokenized = tokenizer(examples["question"], examples["context"], truncation="only_second",
                              max_length=data_args.max_seq_length, padding="max_length",
                              return_offsets_mapping=True)
        tokenized["example_id"] = examples["id"]
        tokenized["offset_mapping"] = [[o if s == 1 else None for o, s in zip(offsets, tokenized.sequence_ids(i))]
                                       for i, offsets in enumerate(tokenized["offset_mapping"])]
        return tokenized

    with training_args.main_process_first(desc="dataset map pre-processing"):
        columns = raw_datasets["train"].column_names
        train_dataset = raw_datasets["train"].map(prepare_train_features, batched=True, remove_columns=columns)
        eval_examples, predict_examples = raw_datasets["validation"], raw_datasets["test"]
        eval_dataset = eval_examples.map(prepare_validation_features, batched=True, remove_columns=columns)
        predict_dataset = predict_examples.map(prepare_validation_features, batched=True, remove_columns=columns)

    def post_processing_function(examples, features, predictions, stage="eval"):
        start_logits, end_logits = predictions
        answers = {}
        for i, feature in enumerate(features):
            offsets, context = feature["offset_mapping"], examples[i]["context"]
            best, text = -np.inf, ""
            for start in np.argsort(start_logits[i])[::-1][:data_args.n_best_size]:
                for end in np.argsort(end_logits[i])[::-1][:data_args.n_best_size]:
                    if start >= len(offsets) or end >= len(offsets) or offsets[start] is None or offsets[end] is None:
                        continue
                    if end < start or end - start + 1 > data_args.max_answer_length:
                        continue
                    score = start_logits[i][start] + end_logits[i][end]
                    if score > best:
                        best, text = score, context[offsets[start][0]:offsets[end][1]]
            answers[feature["example_id"]] = text
        with open(os.path.join(training_args.output_dir, f"{stage}_predictions.json"), "w") as writer:
            json.dump(answers, writer, indent=2)
        references = {ex["id"]: ex["answers"]["text"] for ex in examples}
        return EvalPrediction(predictions=answers, label_ids=references)

    def compute_metrics(p: EvalPrediction):
        return squad_scores(p.predictions, p.label_ids)

    os.makedirs(training_args.output_dir, exist_ok=True)
    trainer = QuestionAnsweringTrainer(model=model, args=training_args, train_dataset=train_dataset,
                                       eval_dataset=eval_dataset, eval_examples=eval_examples,
                                       processing_class=tokenizer, data_collator=default_data_collator,
                                       post_process_function=post_processing_function, compute_metrics=compute_metrics)

    train_result = trainer.train()
    metrics = train_result.metrics
    trainer.save_model()
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()

    metrics = trainer.evaluate()
    metrics["eval_samples"] = len(eval_dataset)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)

    results = trainer.predict(predict_dataset, predict_examples)
    metrics = results.metrics
    metrics["predict_samples"] = len(predict_dataset)
    trainer.log_metrics("predict", metrics)
    trainer.save_metrics("predict", metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
