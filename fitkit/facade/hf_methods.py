"""Hugging Face Trainer habits of `Model` (a mixin): `save_model`, and the data options
`evaluate` and `predict` carry on from the last fit (`fitkit.config.option_merge`)::

    model.fit(train_ds, args=hf_args, processing_class=tokenizer, compute_metrics=compute_metrics)
    model.evaluate(eval_ds)            # padded by the tokenizer, compute_metrics' values included
    model.save_model("final")          # what from_pretrained reads, and the tokenizer
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fitkit.config.arguments import TrainingArguments
from fitkit.config.option_merge import CARRIED, for_evaluation
from fitkit.facade.members import ModelMembers

if TYPE_CHECKING:  # pragma: no cover

    pass


class HFMethods(ModelMembers):
    """`save_model` and the arguments of `evaluate` / `predict` (they use `config`, `module`,
    `_in_force` and `_last_output_dir` of the `Model`)."""

    _in_force: dict[str, Any] | None = None  # the last fit's data options (set by fit)
    _last_output_dir: str | None = None  # the last fit's output_dir (set by fit)

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
