"""`DefaultFlowCallback`: turns the logging / evaluation / save strategies into `control` switches."""

from __future__ import annotations

from fitkit.events.handler import Order, TrainerCallback


class DefaultFlowCallback(TrainerCallback):
    """Always first in a run's callbacks. Sets `control.should_log`, `should_evaluate` and
    `should_save` by steps or at epoch end as the arguments ask, honours
    `logging_first_step` and `eval_delay`, and stops training at `max_steps`, as Hugging
    Face's 5.x flow does: with `eval_strategy="steps"` the last step is evaluated too when it
    is not an evaluation step, and with `save_strategy="steps"` it is saved (with "epoch", the
    epoch end that follows saves it, once).

    Example (it is added for you; this shows what it reads)::

        model.fit(x, y, logging_strategy="steps", logging_steps=50,
                  eval_strategy="steps", eval_steps=200, validation_split=0.1)
    """

    takes_batch = False  # its step events ignore `batch`, `outputs` and `loss`
    drives_flow = True
    order = Order.FLOW

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if args.logging_strategy == "steps" and state.logging_steps > 0 and step % state.logging_steps == 0:
            control.should_log = True
        delay = getattr(args, "eval_delay", 0) or 0
        by_steps = args.eval_strategy == "steps" and state.eval_steps > 0 and delay <= step
        if by_steps and step % state.eval_steps == 0:
            control.should_evaluate = True
        if args.save_strategy == "steps" and state.save_steps > 0 and step % state.save_steps == 0:
            control.should_save = True
        if state.max_steps > 0 and step >= state.max_steps:
            control.should_training_stop = True
            if by_steps:  # the last step is evaluated even off the eval_steps grid (HF 5.x)
                control.should_evaluate = True
            if args.save_strategy == "steps":
                control.should_save = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        # Step logging logs no epoch record (HF): one record per step. History and the Keras-style
        # epoch callbacks read the epoch's values from `running_logs.epoch()` instead.
        if args.logging_strategy == "epoch":
            control.should_log = True
        delay = getattr(args, "eval_delay", 0) or 0
        if (args.eval_strategy == "epoch" and delay <= (state.epoch or 0)
                and round(state.epoch or 0) % getattr(args, "validation_freq", 1) == 0):
            control.should_evaluate = True  # Keras' validation_freq: every that many epochs
        if args.save_strategy == "epoch":
            control.should_save = True
        return control

