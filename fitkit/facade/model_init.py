"""Building a `Model`'s module from its `model_init`, and what a spawn strategy's process runs
for a `Model` call (module level, so it pickles)::

    module = call_model_init(model_init, trial)   # model_init() or model_init(trial), checked
    module, start_rng = built_under_seed(model_init, 42)   # seeded first, as HF's Trainer builds it
    module, start_rng = module_for_fit(model_init, model.runtime, args)  # whichever of those fit needs
    module = call_model_init(model_init, fabric=model.launch(args))  # FSDP: on meta, sharded later
    module = call_model_init(model_init, fabric=fabric, load_once=True)  # FSDP: built in rank 0 only
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch

from fitkit.engine.data.rng import rng_state, seed_everything
from fitkit.engine.devices.deferred_init import build_on_meta
from fitkit.engine.devices.load_once import build_on_rank0, from_structure, keep_sources
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


def call_model_init(model_init: Callable[..., Any] | None, trial: Any = None, fabric: Any = None,
                    load_once: bool = False) -> torch.nn.Module:
    """`model_init()` (or `model_init(trial)`), checked. With `fabric` (an FSDP run's), built on
    the meta device and left for the strategy to initialize shard by shard (no process holds the
    whole module; `fitkit.engine.devices.deferred_init`), unless its values could not be replayed;
    with `load_once` too, built in global rank 0 only and sent from there, shard by shard, to the
    others, which get it on the meta device (`fitkit.engine.devices.load_once`)."""
    if model_init is None:  # a model given an nn.Module, after `release()` or in `for_trial`
        raise ValueError("the model has no `model_init` to build a module with: build it with Model(model_init=fn)")
    n_params = _parameter_count(model_init)

    def build() -> Any:
        return model_init() if n_params == 0 else model_init(trial)

    if fabric is not None and load_once:
        module = build_on_rank0(build, fabric)
    else:
        module = None if fabric is None else build_on_meta(build, fabric.init_module(empty_init=True))
    if module is None:
        module = build()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"`model_init` must return a torch.nn.Module, got {type(module).__name__}")
    return module


def _parameter_count(model_init: Callable[..., Any]) -> int:
    """How many parameters `model_init` takes (1 when its signature cannot be read): read once per
    function, as a search calls the same one at every trial (held weakly: a `model_init` often
    closes over the data, which the count must not keep alive)."""
    try:
        return _COUNTS[model_init]
    except (KeyError, TypeError):  # (TypeError: not weakly referable)
        pass
    try:
        count = len(inspect.signature(model_init).parameters)
    except (TypeError, ValueError):
        count = 1
    with contextlib.suppress(TypeError):
        _COUNTS[model_init] = count
    return count


_COUNTS: weakref.WeakKeyDictionary[Callable[..., Any], int] = weakref.WeakKeyDictionary()


def built_under_seed(model_init: Callable[..., Any], seed: int | None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The module `model_init` builds right after the global generators are seeded with `seed`, and
    their state after it: HF's Trainer seeds, builds the model from `model_init` and trains on from
    that state (`fit`'s `start_rng`), where a fit under fitkit's own order seeds after building.

        module, start_rng = built_under_seed(make_bert, 42)
    """
    seed_everything(seed)
    module = call_model_init(model_init)
    return module, rng_state()

def deferred_module(model_init: Callable[..., Any] | None, runtime: Any, args: Any) -> torch.nn.Module | None:
    """The module of a run with `args` (a `TrainingArguments`) under strategy="fsdp": the Fabric
    launched first (`runtime.launch`), then `model_init` run on the meta device, each process
    initializing only its shard at set-up. None for other strategies (or no `model_init`): the
    module is built whole, as `Model.module` builds it."""
    if model_init is None or args.strategy != "fsdp":
        return None
    return call_model_init(model_init, fabric=runtime.launch(args), load_once=args.fsdp_load_once)


def module_for_trial(model_init: Callable[..., Any] | None, trial: Any, runtime: Any, args: Any = None,
                     structure: bytes | None = None) -> torch.nn.Module:
    """A search trial's module from `model_init(trial)`, on the search's launched Fabric: under
    strategy="fsdp" (`args`) through the same deferred path as `fit` (on the meta device, each
    process initializing its shard); with `fsdp_load_once` built in rank 0 alone, whose
    `structure_of` the other processes take as `structure` (sent with the trial's plan).

        module = module_for_trial(model_init, trial, model.runtime, search_args)
    """
    if args is None or args.strategy != "fsdp" or runtime.fabric is None:
        return call_model_init(model_init, trial)
    if not args.fsdp_load_once:
        return call_model_init(model_init, trial, fabric=runtime.fabric)
    if runtime.fabric.global_rank != 0:
        if structure is None:
            raise ValueError("fsdp_load_once=True: a process other than rank 0 needs rank 0's module `structure`")
        return from_structure(structure)
    return keep_sources(call_model_init(model_init, trial))


def module_for_fit(model_init: Callable[..., Any] | None, runtime: Any,
                   args: Any) -> tuple[torch.nn.Module | None, dict[str, Any] | None]:
    """The module `fit` builds from `model_init` before its run, and the generators' state to train
    on from (None: fit seeds as usual): under strategy="fsdp" on the meta device after the launch
    (`deferred_module`); under HF's data order right after seeding (`built_under_seed`); otherwise
    None (built whole when first asked for)."""
    if model_init is None:
        return None, None
    if args.strategy == "fsdp":
        return deferred_module(model_init, runtime, args), None
    if args.data_order == "trainer":
        return built_under_seed(model_init, args.seed)
    return None, None
