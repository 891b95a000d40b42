"""Keras' `evaluate` and `predict` of `Model` (a mixin): one engine `Trainer` call over the data,
in this process or in the processes a spawn strategy starts::

    test_loss, test_acc = model.evaluate(x_test, y_test)      # Keras' list (the loss alone without metrics)
    model.evaluate(x_test, y_test, return_dict=True)          # {"loss": ..., "accuracy": ...}
    model.evaluate(metric_key_prefix="eval")                  # HF's: the last fit's validation data, eval_loss, ...
    model.predict(x_test)                                     # the outputs, in input order, on CPU
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fitkit.callbacks.display.evaluation_line import evaluation_line_for
from fitkit.engine.overrides import StepOverrides
from fitkit.engine.trainer import Trainer
from fitkit.facade.keras_api import as_list
from fitkit.facade.members import ModelMembers
from fitkit.facade.steps import Steps

if TYPE_CHECKING:  # pragma: no cover
    from fitkit.config.arguments import TrainingArguments


class Evaluation(ModelMembers):
    """`evaluate` and `predict`, which `Model` inherits (HF's names and records through
    `fitkit.facade.hf_methods`)."""

    def evaluate(self, x: Any = None, y: Any = None, *, batch_size: int | None = None, verbose: int | str = "auto",
                 sample_weight: Any = None, steps: int | None = None, callbacks: Sequence[Any] | None = None,
                 return_dict: bool = False, metric_key_prefix: str | None = None,
                 **data_options: Any) -> dict[str, float] | list[float] | float:
        """Loss and metrics over `x` (exact averages over the data, or its first `steps`
        batches), as Keras 3 returns them: the loss alone, or a list in `metrics_names` order
        when there are metrics or several outputs (`test_loss, test_acc = model.evaluate(x, y)`);
        `return_dict=True`: a dict, unprefixed (`{"loss": ..., "accuracy": ...}`), the form of
        HF's `trainer.evaluate()`. `verbose` 1, 2 or "auto" prints Keras' line.
        `x` left out: the `validation_data` of the last fit (HF's `trainer.evaluate()`).
        `metric_key_prefix` ("eval", "test", ...): HF's names, `eval_loss`, with the `epoch`.
        `batch_size` (default: the `per_device_eval_batch_size` in force, else 32). Data options
        (`data_collator`, `compute_metrics`, ...: `fitkit.facade.hf_methods`) as in the last fit."""
        args = self._evaluation_arguments("evaluate", data_options)
        if x is None and y is None:
            x = self.fit_evaluation_data("evaluate")
        if self.runtime.must_spawn(args):
            return self._spawned("evaluate", args, dict(x=x, y=y, batch_size=batch_size, verbose=verbose,
                                                         sample_weight=sample_weight, steps=steps,
                                                         callbacks=callbacks, return_dict=return_dict,
                                                         metric_key_prefix=metric_key_prefix, **data_options))
        start = time.perf_counter()
        # the Trainer face: `on_evaluate` after the record is logged, with it (`hf_logged`), as HF's evaluate()
        metrics, _ = self._evaluate(args, x, y, batch_size, verbose, sample_weight, steps, callbacks,
                                    announce=not args.hf_trainer)
        speed = (time.perf_counter() - start, x if steps is None else None, evaluation_batch_size(args, batch_size))
        logged = self.hf_logged(args, metrics, metric_key_prefix, speed, callbacks)  # as HF's trainer.evaluate() logs
        if metric_key_prefix is not None:  # HF's record: the one logged, when it was
            return logged if logged is not None else self.hf_named(metrics, metric_key_prefix, speed)
        return metrics if return_dict else as_list(metrics, self.metrics_names)

    def _evaluate(self, args: TrainingArguments, x: Any, y: Any, batch_size: int | None, verbose: int | str,
                  sample_weight: Any, steps: int | None, callbacks: Sequence[Any] | None,
                  keep: bool = False, announce: bool = True) -> tuple[dict[str, float], tuple[Any, Any] | None]:
        """One evaluation in this process: its values and, with `keep`, (predictions, label_ids);
        `announce=False`: `on_evaluate` is left to the caller."""
        trainer = self._evaluation_trainer(args, callbacks, verbose)
        metrics = trainer.evaluate(x, y, sample_weight=sample_weight, batch_size=evaluation_batch_size(args, batch_size),
                                   state=self.state, control=self.control, steps=steps, keep=keep, announce=announce)
        self.control = trainer.control
        return metrics, trainer.collected

    def predict(self, x: Any, *, batch_size: int | None = None, verbose: int | str = "auto", steps: int | None = None,
                callbacks: Sequence[Any] | None = None, **data_options: Any) -> Any:
        """The module's outputs for every sample of `x` (or its first `steps` batches),
        concatenated in input order (padded with -100 where batches differ in length), on CPU.
        `verbose` 1, 2 or "auto" prints Keras' line; `batch_size` and data options as `evaluate`.
        HF's `trainer.predict` (predictions, label_ids, metrics) is `hf_predict`."""
        args = self._evaluation_arguments(None, data_options)
        if self.runtime.must_spawn(args):
            return self._spawned("predict", args, dict(x=x, batch_size=batch_size, verbose=verbose, steps=steps,
                                                        callbacks=callbacks, **data_options))
        trainer = self._evaluation_trainer(args, callbacks, verbose)
        out = trainer.predict(x, batch_size=evaluation_batch_size(args, batch_size), state=self.state,
                              control=self.control, steps=steps)
        self.control = trainer.control
        return out

    def _evaluation_trainer(self, args: TrainingArguments, callbacks: Sequence[Any] | None,
                            verbose: int | str) -> Trainer:
        """The engine call of one `evaluate` or `predict`: the callbacks given and Keras' line (none
        under the Trainer face with `disable_tqdm=True` unless `verbose` is given, as the Trainer shows none)."""
        if verbose == "auto" and args.hf_trainer and args.verbose == 0:
            verbose = 0
        return Trainer(self.runtime, self._module_for(args), self.config, args,
                       self._handler(callbacks, *evaluation_line_for(verbose)), StepOverrides.of(self, Steps))


def evaluation_batch_size(args: TrainingArguments, batch_size: int | None) -> int:
    """`batch_size` as given, else the `per_device_eval_batch_size` in force, else Keras' 32."""
    return args.eval_batch_size_or(32) if batch_size is None else batch_size
