"""`run_qa.py`'s `QuestionAnsweringTrainer`, as transformers' example keeps it beside the script
(`trainer_qa.py`): evaluation and prediction run the Trainer's loop without `compute_metrics`,
post-process the start/end logits into answers (`post_process_function(examples, features,
predictions, stage)`), then score them. fitkit needs no subclass: `post_process_function=` is an
option of `fit` / `evaluate` / `hf_predict` (`run_qa_fitkit.py`).

    trainer = QuestionAnsweringTrainer(model=model, args=args, eval_examples=examples,
                                       post_process_function=post_process, ...)
"""

from __future__ import annotations

import time

import numpy as np
from transformers import Trainer
from transformers.trainer_utils import PredictionOutput, speed_metrics


class QuestionAnsweringTrainer(Trainer):
    """`run_qa.py`'s trainer: evaluation and prediction post-process the logits into answers,
    then `compute_metrics` scores them (the features carry no labels)."""

    def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples, self.post_process_function = eval_examples, post_process_function

    def _loop(self, dataset, prefix, description):
        compute_metrics, self.compute_metrics = self.compute_metrics, None  # scored after post-processing
        start = time.time()
        try:
            output = self.evaluation_loop(self.get_eval_dataloader(dataset) if description == "Evaluation"
                                          else self.get_test_dataloader(dataset), description=description,
                                          metric_key_prefix=prefix)
        finally:
            self.compute_metrics = compute_metrics
        output.metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples,
                                            num_steps=int(np.ceil(output.num_samples / self.args.eval_batch_size))))
        return output

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix="eval"):
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        examples = self.eval_examples if eval_examples is None else eval_examples
        output = self._loop(dataset, metric_key_prefix, "Evaluation")
        scored = self.compute_metrics(self.post_process_function(examples, dataset, output.predictions))
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in scored.items()} | output.metrics
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, predict_dataset, predict_examples, ignore_keys=None, metric_key_prefix="test"):
        output = self._loop(predict_dataset, metric_key_prefix, "Prediction")
        processed = self.post_process_function(predict_examples, predict_dataset, output.predictions, "predict")
        scored = self.compute_metrics(processed)
        metrics = {f"{metric_key_prefix}_{k}": v for k, v in scored.items()} | output.metrics
        return PredictionOutput(predictions=processed.predictions, label_ids=processed.label_ids, metrics=metrics)
