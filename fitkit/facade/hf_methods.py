"""Hugging Face Trainer habits of `Model` (a mixin): `save_model`, `hf_predict` (the Trainer's
`predict`), the evaluation data of the last fit, and the data options `evaluate` and `predict`
carry on from the last fit (`fitkit.config.option_merge`)::

    model.fit(train_ds, validation_data=eval_ds, args=hf_args, processing_class=tokenizer,
              compute_metrics=compute_metrics)
    model.evaluate(metric_key_prefix="eval")   # eval_ds, padded by the tokenizer: {"eval_loss": ...}
    predictions, label_ids, metrics = model.hf_predict(test_ds)   # metrics: {"test_loss": ...}
    model.save_model("final")                  # what from_pretrained reads, and the tokenizer
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from fitkit.config.arguments import TrainingArguments
from fitkit.config.option_merge import CARRIED, for_evaluation
from fitkit.engine.eval_prediction import PredictionOutput
from fitkit.events.hf_view import evaluated_metrics, evaluation_record
from fitkit.facade.evaluation import evaluation_batch_size
from fitkit.facade.members import ModelMembers


class HFMethods(ModelMembers):
    """`save_model` and the arguments of `evaluate` / `predict` (they use `config`, `module`,
    `_in_force` and `_last_output_dir` of the `Model`)."""

    _in_force: dict[str, Any] | None = None  # the last fit's data options (set by fit)
    _last_output_dir: str | None = None  # the last fit's output_dir (set by fit)
    _fit_validation_data: Any = None  # the last fit's validation_data (set by fit)

    def fit_evaluation_data(self, what: str = "evaluate") -> Any:
        """The `validation_data` of the last fit: what `evaluate()` and `hf_predict()` without
        data evaluate (HF's `trainer.evaluate()` on the `eval_dataset`)."""
        if self._fit_validation_data is None:
            raise ValueError(f"`{what}()` was given no data (`x`) and the last fit had no `validation_data`: pass `x` "
                             f"(`{what}(eval_ds)`), or give `validation_data=` to fit first")
        return self._fit_validation_data

    def hf_named(self, metrics: dict[str, Any], prefix: str, speed: tuple[float, Any, int] | None = None,
                 epoch: bool = True) -> dict[str, Any]:
        """`metrics` under HF's names, as the Trainer's `evaluate` and `predict` return them:
        `prefix_` before each (`eval_loss`); with `speed` (seconds, data, batch size),
        `prefix_runtime`, `prefix_samples_per_second` and `prefix_steps_per_second` for sized
        data; with `epoch`, the epoch the last fit reached."""
        seconds: float | None = None
        samples: int | None = None
        steps: int | None = None
        if speed is not None:
            seconds, data, batch_size = speed
            if hasattr(data, "__len__") and not isinstance(data, tuple):
                world = self.fabric.world_size if self.fabric is not None else 1
                samples, steps = len(data), math.ceil(len(data) / (batch_size * world))
        out = evaluation_record(metrics, prefix, seconds, samples, steps)
        if epoch and self.state.epoch is not None and self.state.global_step:
            out["epoch"] = self.state.epoch
        return out

    def hf_logged(self, args: TrainingArguments, metrics: dict[str, Any], prefix: str | None,
                  speed: tuple[float, Any, int], callbacks: Sequence[Any] | None) -> dict[str, Any] | None:
        """Under HF's arguments (`hf_trainer`), `evaluate` logs its record as the Trainer's
        `evaluate()` does: HF's names (`eval_loss`, the speed, `epoch`) appended with the step to
        `state.log_history` and sent to `on_log` (printed under `disable_tqdm`), then
        `on_evaluate` with it; returns it."""
        if not args.hf_trainer:
            return None
        record = self.hf_named(metrics, prefix or "eval", speed)
        self.state.log_history.append({**record, "step": self.state.global_step})
        from fitkit.facade.defaults import display_for

        printer = display_for(args, callbacks or ()) if args.verbose == 0 else []
        handler = self._handler(callbacks, *printer)
        logs = dict(record)
        self.control = handler.on_log(args, self.state, self.control, logs)
        # then on_evaluate with the same record (transformers' callbacks) and fitkit's names (the others)
        self.control = handler.on_evaluate(args, self.state, self.control,
                                           evaluated_metrics(metrics, args, self.state, logs))
        return record

    def hf_predict(self, test_dataset: Any = None, *, metric_key_prefix: str = "test", batch_size: int | None = None,
                   verbose: int | str = 0, callbacks: Sequence[Any] | None = None,
                   **data_options: Any) -> PredictionOutput:
        """HF's `trainer.predict`: `(predictions, label_ids, metrics)` over `test_dataset`
        (default: the last fit's `validation_data`): NumPy arrays over every sample, in input
        order, padded with -100 across batches; `label_ids` None without labels; `metrics` named
        `test_loss`, `test_<compute_metrics' names>` (`metric_key_prefix`). Keras' `predict`
        returns the module's outputs instead; this is a separate method so that neither form
        unpacks into the other's values. Data options as `evaluate`."""
        args = self._evaluation_arguments("hf_predict", data_options)
        x = self.fit_evaluation_data("hf_predict") if test_dataset is None else test_dataset
        start = time.perf_counter()
        if self.runtime.must_spawn(args):
            metrics, predictions, labels = self._spawned("hf_collect", args, dict(
                x=x, batch_size=batch_size, verbose=verbose, callbacks=callbacks, **data_options))
            collected, trainer = (_numpy(predictions), _numpy(labels)), None
        else:
            trainer = self._evaluation_trainer(args, callbacks, verbose)
            metrics = trainer.evaluate(x, None, batch_size=evaluation_batch_size(args, batch_size), state=self.state,
                                       control=self.control, keep=True, announce=False)
            self.control, kept = trainer.control, trainer.collected
            if kept is None and not args.prediction_loss_only:
                raise ValueError("`hf_predict` gathers the module's outputs, which an overridden `test_step` does "
                                 "not give: call `predict` (your `predict_step`) and `evaluate` instead")
            collected = kept or (None, None)  # `prediction_loss_only`: the loss alone, as the Trainer's predict
        speed = (time.perf_counter() - start, x, evaluation_batch_size(args, batch_size))
        record = self.hf_named(metrics, metric_key_prefix, speed, epoch=False)
        if trainer is not None:  # the Trainer's predict ends with on_predict and its metrics (not on_evaluate)
            self.control = trainer.handler.on_predict(args, self.state, self.control, dict(record))
        return PredictionOutput(collected[0], collected[1], record)

    def hf_collect(self, x: Any, batch_size: int | None = None, verbose: int | str = 0,
                   callbacks: Sequence[Any] | None = None, **data_options: Any) -> tuple:
        """`hf_predict`'s work in one process of a spawn strategy: (metrics, predictions,
        label_ids) with tensors, which travel back to the calling process."""
        args = self._evaluation_arguments("hf_predict", data_options)
        metrics, kept = self._evaluate(args, x, None, batch_size, verbose, None, None, callbacks, keep=True)
        if kept is None:
            raise ValueError("`hf_predict` gathers the module's outputs, which an overridden `test_step` does not give")
        as_tensors = [_tensors(v) for v in kept]  # lists too (`eval_do_concat_batches=False`)
        return metrics, as_tensors[0], as_tensors[1]

    def save_model(self, output_dir: str | None = None) -> str:
        """HF's `Trainer.save_model` for a Hugging Face model: `save_pretrained`'s files and the
        `processing_class` in `output_dir` (default: the last fit's `output_dir`); returns it."""
        from fitkit.engine.checkpoint.hf_export import save_model

        args = self.config.args if self.config is not None else TrainingArguments()
        args = for_evaluation(args, self._in_force, {})
        return save_model(output_dir or self._last_output_dir or args.output_dir, self.module, args)

    def _evaluation_arguments(self, what: str | None, data_options: dict[str, Any]) -> TrainingArguments:
        """Compile's arguments (`what` names the call that needs `compile`; None: defaults
        without it) with the last fit's data options and those given over them."""
        unknown = sorted(set(data_options) - set(CARRIED))
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(map(repr, unknown))}; evaluate and predict also take: "
                            f"{', '.join(CARRIED)}")
        if what is not None or self.config is not None:
            args = self._compiled(what or "predict").args
        else:
            args = TrainingArguments()
        return for_evaluation(args, self._in_force, data_options)


def _numpy(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_numpy(v) for v in value)
    if value is None or not hasattr(value, "numpy"):
        return value
    return value.numpy()


def _tensors(value: Any) -> Any:
    """NumPy arrays (in lists and tuples too) as tensors, which travel back from a spawned process."""
    import torch

    if isinstance(value, (list, tuple)):
        return type(value)(_tensors(v) for v in value)
    return torch.from_numpy(value) if hasattr(value, "dtype") and not isinstance(value, torch.Tensor) else value
