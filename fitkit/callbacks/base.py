"""The public import path of the callback base class: `from fitkit.callbacks.base import TrainerCallback`.

The contract itself (the event set, `TrainerState`, `TrainerControl`, `CallbackHandler`) lives in
`fitkit.events`, below the engine that fires it; this module only re-exports it.
"""

from fitkit.events.handler import CallbackHandler, TrainerCallback
from fitkit.events.state import StopTraining, TrainerControl, TrainerState

__all__ = ["CallbackHandler", "StopTraining", "TrainerCallback", "TrainerControl", "TrainerState"]
