"""What a finished trial leaves in memory: its module, optimizer and their tensors freed before
the next trial starts, at the cost of the trial's own objects, not of the whole process.

    with TrialMemory(optuna_collects=False) as memory:   # around all the trials of a search
        ...
        memory.release(trial_model)                      # after each trial

fitkit's own run leaves no reference cycle around the module (`tests/test_search.py`), so
dropping the trial's model frees it by reference counting; a user's callback or `model_init` may
still hold it in a cycle, which reference counting alone leaves alive until Python's next full
collection, maybe several trials later (on a GPU: several models' weights at once). `release`
drops the trial's model and then looks (weak references) whether its module or its parameters
outlived that: only then does it run a collection. That collection is cheap because the objects
alive when the search started (torch, Optuna, the user's data: most of the heap) are moved out
of the collector's reach for the search (`gc.freeze`) and given back at its end
(`gc.unfreeze`); a full collection over such a heap costs hundreds of milliseconds, more than a
small trial. With Optuna's `gc_after_trial=True` (a full collection after every trial, done by
Optuna) nothing is frozen and Optuna's collection is the one that runs.
"""

from __future__ import annotations

import gc
import weakref
from types import TracebackType
from typing import Any


class TrialMemory:
    """Frees each finished trial's model; `collections` counts the collections that were needed."""

    def __init__(self, optuna_collects: bool = False) -> None:
        self.optuna_collects = optuna_collects
        self.collections = 0
        self._froze = False

    def __enter__(self) -> TrialMemory:
        # A process that froze objects itself keeps its own arrangement (unfreezing at the end
        # would give back its objects too).
        if not self.optuna_collects and gc.get_freeze_count() == 0:
            gc.freeze()
            self._froze = True
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._froze:
            self._froze = False
            gc.unfreeze()

    def release(self, trial_model: Any, optuna_follows: bool = True) -> bool:
        """Drop `trial_model`'s module, optimizer and Fabric wrappers; collect garbage only when the
        module or its parameters are still alive afterwards (held in reference cycles), or leave
        it to Optuna when `gc_after_trial=True` and Optuna runs the trial (`optuna_follows`).
        True when this call ran a collection."""
        watched = _watch(trial_model)
        trial_model.release()
        del trial_model
        collected = False
        if not (self.optuna_collects and optuna_follows) and any(ref() is not None for ref in watched):
            gc.collect()
            self.collections += 1
            collected = True
        _empty_device_cache()
        return collected


def _watch(trial_model: Any) -> list[weakref.ref]:
    """Weak references to what must not outlive the trial: its module and its first parameter
    (which the optimizer's state also keeps alive while the optimizer lives)."""
    module = trial_model.module  # a trial's model is built with its module (never None before `release`)
    refs = [weakref.ref(module)]
    first = next(iter(module.parameters()), None)
    if first is not None:
        refs.append(weakref.ref(first))
    return refs


def _empty_device_cache() -> None:
    """Give the freed device memory back to the device (only where CUDA is in use already)."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
