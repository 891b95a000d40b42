"""Building a `Model`'s module from its `model_init`, and what a spawn strategy's process runs
for a `Model` call (module level, so it pickles)::

    module = call_model_init(model_init, trial)   # model_init() or model_init(trial), checked
    module, start_rng = built_under_seed(model_init, 42)   # seeded first, as HF's Trainer builds it
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from fitkit.engine.data.rng import rng_state, seed_everything
from fitkit.engine.runtime import pack_result


def run_in_child(fabric: Any, key: tuple, model: Any, method: str, call: dict[str, Any]) -> dict[str, Any]:
    """What a spawn/fork strategy runs in each process (module level, so it pickles)."""
    model.runtime.adopt(fabric, key)
    value = getattr(model, method)(**call)
    result = pack_result(model.module, None if method == "fit" else value, model.state)
    history = model.history
    result["history"] = None if history is None else (history.history, history.epoch, history.params,
                                                      history.metrics, history.global_step)
    return result


def call_model_init(model_init: Callable[..., Any] | None, trial: Any = None) -> torch.nn.Module:
    if model_init is None:  # a model given an nn.Module, after `release()` or in `for_trial`
        raise ValueError("the model has no `model_init` to build a module with: build it with Model(model_init=fn)")
    try:
        n_params = len(inspect.signature(model_init).parameters)
    except (TypeError, ValueError):
        n_params = 1
    module = model_init() if n_params == 0 else model_init(trial)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"`model_init` must return a torch.nn.Module, got {type(module).__name__}")
    return module


def built_under_seed(model_init: Callable[..., Any], seed: int | None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The module `model_init` builds right after the global generators are seeded with `seed`, and
    their state after it: HF's Trainer seeds, builds the model from `model_init` and trains on from
    that state (`fit`'s `start_rng`), where a fit under fitkit's own order seeds after building.

        module, start_rng = built_under_seed(make_bert, 42)
    """
    seed_everything(seed)
    module = call_model_init(model_init)
    return module, rng_state()
