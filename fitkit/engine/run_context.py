"""`RunContext`: the state of one call (fit, evaluate, predict), made by the engine's `Trainer` and
handed explicitly to whatever needs it while the call runs (the loop, the step tools, the `Model`
through `Runtime.running`, the running logs). Nothing of it outlives the call::

    context = RunContext(args, policy_for(args), first_epoch=initial_epoch)
    with runtime.running(context):          # Model.stop_training, Model.optimizer see it
        loop.train(train, val, resume)
    context.stop_requested                  # True when a callback asked to stop (Keras' flag)

| field | what it holds |
| --- | --- |
| `args` | the call's settled `TrainingArguments` (`eval_strategy` decided) |
| `policy` | the face's run policy (`fitkit.engine.policy`) |
| `first_epoch` | Keras' `initial_epoch` |
| `stop_requested` | Keras' `stop_training`: set through `Model.stop_training` (or a callback's `model.stop_training` on the module); the loop reads it after each step and epoch |
| `tools` | the step tools of overridden steps (`StepTools`), None otherwise |
| `running_logs` | Keras' batch-end logs of the call (`RunningLogs`) |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fitkit.config.arguments import TrainingArguments
from fitkit.engine.policy import KerasPolicy


@dataclass(eq=False)
class RunContext:
    """One call's run state, passed explicitly (never stored on another object's `__dict__`)."""

    args: TrainingArguments | None  # None: a call of one batch (`train_on_batch`)
    policy: KerasPolicy
    first_epoch: int = 0
    stop_requested: bool = False
    tools: Any = None
    running_logs: Any = None

    def request_stop(self, value: bool = True) -> None:
        """Keras' `model.stop_training = value`: the loop ends training after the current step."""
        self.stop_requested = bool(value)
