"""The run policies: everything a Keras run and a Hugging Face Trainer run do differently, one
object per face, chosen once per call (`policy_for`); the loop asks its policy and holds no
branch of its own on the face::

    policy = policy_for(args)                 # KerasPolicy(), or TrainerPolicy() under `hf_trainer`
    loss = EpochLoss(fabric, per_step=policy.per_step_loss)
    record = policy.training_record(loop, epoch_end=True)   # None: nothing to log now

| decides | Keras (`KerasPolicy`) | Trainer (`TrainerPolicy`) |
| --- | --- | --- |
| the training loss logged | mean over samples | mean over steps (HF's `tr_loss / steps`) |
| a step's gradient norm | not measured | measured, logged as `grad_norm` |
| FLOPs (`total_flos`) | not counted | 6 x parameters x input tokens |
| the training record | the epoch's values at an epoch end; a step's since the last log | the same step record at a step and at an epoch end, a step logged once |
| a nan / inf step loss | added as it is | `logging_nan_inf_filter`: the mean of the steps since the last log |
| `epoch` in a record | rounded to 4 digits | as is |
| the evaluation record | `val_` names | `eval_` names and the speed (`eval_runtime`, ...) |
| retention at the end | every checkpoint the limit kept | `save_total_limit=1`: the best alone |
| a norm layer in a wholly frozen part | inference mode (Keras' frozen BatchNorm) | trains, as torch and the Trainer do |
| parameters frozen or unfrozen since `compile` | Keras' warning (recompile) | no warning |
| a model whose `forward` takes `**kwargs` and computes its loss | the micro-batches' mean | the window's label tokens as `num_items_in_batch` (`fitkit.engine.token_loss`) |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fitkit.events.hf_view import evaluation_record, hf_values

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fitkit.config.arguments import TrainingArguments
    from fitkit.engine.checkpoint.checkpointer import Checkpointer
    from fitkit.engine.token_loss import TokenLoss


class KerasPolicy:
    """A Keras run (the default face)."""

    per_step_loss = False  # the logged loss is a mean over samples
    measures_grad_norm = False
    freezes_frozen_norms = True  # a norm layer inside a wholly frozen part runs in inference mode (Keras)
    warns_on_trainable_change = True  # parameters frozen or unfrozen since compile: Keras' warning

    def flos(self, module: Any) -> tuple[str, int] | None:
        """What a step counts as FLOPs: nothing on this face."""
        return None

    def loss_adder(self, loss: Any, state: Any, args: TrainingArguments) -> Callable[[torch.Tensor, float], None]:
        """What adds a step's loss to the epoch's running sum (`EpochLoss.running.add`)."""
        return loss.running.add

    def loss_filter(self, loss: Any, state: Any, args: TrainingArguments) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What a micro-batch's loss goes through before a window's sum (None: nothing)."""
        return None

    def token_loss(self, stepper: Any, args: TrainingArguments) -> TokenLoss | None:
        """What counts the label tokens of each accumulation window: nothing on this face (each
        micro-batch's mean loss, divided by the window's length)."""
        return None

    def training_record(self, loop: Any, epoch_end: bool) -> dict[str, float] | None:
        """The training values to log now: at an epoch's end the epoch's values (put together
        once), else the step's since the last log."""
        if epoch_end:
            return loop.running_logs.epoch()
        return loop.step_record()

    def epoch(self, epoch: float) -> float:
        """`epoch` as a record carries it."""
        return round(epoch, 4)

    def evaluation_record(self, metrics: dict[str, float], seconds: float, evaluated: tuple[int, int]) -> dict:
        """An in-fit evaluation's record: the `val_` values."""
        return dict(metrics)

    def retain(self, checkpointer: Checkpointer, args: TrainingArguments) -> None:
        """Checkpoints kept once training ends: those the limit kept."""


class TrainerPolicy(KerasPolicy):
    """A run under Hugging Face's `TrainingArguments` (`hf_trainer`): the Trainer's records."""

    per_step_loss = True  # HF logs the mean of the steps' losses, not of the samples'
    measures_grad_norm = True  # logged with clipping off too; kept on the device until a log
    freezes_frozen_norms = False  # the Trainer trains a frozen part's BatchNorm as torch does
    warns_on_trainable_change = False  # not the Trainer's habit

    def __init__(self) -> None:
        self._logged_step = -1  # the step of the last training log: a step is logged once

    def flos(self, module: Any) -> tuple[str, int] | None:
        """HF's count: 6 x the parameters outside embeddings x the elements of the main input
        (`main_input_name`), for a module with `num_parameters` (a `PreTrainedModel`)."""
        count = getattr(module, "num_parameters", None)
        if not callable(count):
            return None
        return getattr(module, "main_input_name", "input_ids"), 6 * int(count(exclude_embeddings=True))

    def loss_adder(self, loss: Any, state: Any, args: TrainingArguments) -> Callable[[torch.Tensor, float], None]:
        """`logging_nan_inf_filter` (on by default): a nan or inf step loss counts as the mean of the
        steps' losses since the last log, as the Trainer's does (on the device, no host read)."""
        if not args.logging_nan_inf_filter:
            return loss.running.add
        return loss.nan_inf_filtered(lambda: state.global_step - max(self._logged_step, 0))

    def loss_filter(self, loss: Any, state: Any, args: TrainingArguments) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """`loss_adder`'s filter alone, for the micro-batches of an accumulation window, which the
        loop adds up and adds once a step (the Trainer filters each micro-batch's loss)."""
        if not args.logging_nan_inf_filter:
            return None
        return loss.nan_inf_filter(lambda: state.global_step - max(self._logged_step, 0))

    def token_loss(self, stepper: Any, args: TrainingArguments) -> TokenLoss | None:
        """The Trainer's `num_items_in_batch` for a module that computes its loss and takes loss
        keywords (`model_accepts_loss_kwargs`), `average_tokens_across_devices` honoured."""
        from fitkit.engine.token_loss import TokenLoss

        return TokenLoss.of(stepper, args)

    def training_record(self, loop: Any, epoch_end: bool) -> dict[str, float] | None:
        step = loop.state.global_step
        if step <= self._logged_step:
            return None
        self._logged_step = step
        return loop.step_record()

    def epoch(self, epoch: float) -> float:
        return epoch

    def evaluation_record(self, metrics: dict[str, float], seconds: float, evaluated: tuple[int, int]) -> dict:
        """The Trainer's record: `eval_` names and the speed (`on_evaluate` keeps fitkit's `val_`)."""
        return evaluation_record(hf_values(metrics) or {}, "eval", seconds, *evaluated)

    def retain(self, checkpointer: Checkpointer, args: TrainingArguments) -> None:
        """A limit of one keeps the best checkpoint alone once training ends, as the Trainer leaves it."""
        if args.save_total_limit == 1:
            checkpointer.keep_only_best()


def policy_for(args: TrainingArguments) -> KerasPolicy:
    """The policy of a call under `args`: a fresh one per call (the Trainer's remembers its last log)."""
    return TrainerPolicy() if args.hf_trainer else KerasPolicy()
