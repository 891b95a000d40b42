"""The callbacks a fit adds for you: the progress display (`verbose`) and the trackers
`report_to` names, each left out when the user already gave one of its class.

    defaults_for(args, given=[*model.callbacks, *fit_callbacks])   # [ProgressBar(...), TensorBoardCallback(), ...]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fitkit.common.terminal import resolved_verbose
from fitkit.events.handler import TrainerCallback


def defaults_for(args: Any, given: Sequence[Any]) -> list[TrainerCallback]:
    """The display and the trackers for a fit with `args`, except classes already in `given`;
    HF's `torch_empty_cache_steps` as an `EmptyDeviceCache` callback."""
    extra: list[TrainerCallback] = []
    every = getattr(args, "torch_empty_cache_steps", None)
    if every:
        from fitkit.callbacks.empty_cache import EmptyDeviceCache

        extra.append(EmptyDeviceCache(every))
    return [*display_for(args, given), *reporters_for(args, given), *extra]


def display_for(args: Any, given: Sequence[Any]) -> list[TrainerCallback]:
    """`verbose`: 1 a progress bar, 2 a line per epoch, 0 nothing, "auto" a bar in a terminal
    or notebook and lines elsewhere; nothing when a `ProgressBar` is already there. Under HF's
    arguments (`hf_trainer`), `verbose=0` (HF's `disable_tqdm=True`) prints each log record as the
    Trainer's `PrinterCallback` does, unless a `PrinterCallback` is there already."""
    from fitkit.callbacks.display.progress import ProgressBar

    verbose = resolved_verbose(args.verbose)
    if verbose == 0 and getattr(args, "hf_trainer", False):
        from fitkit.callbacks.display.printer import PrinterCallback

        return [] if any(isinstance(cb, PrinterCallback) for cb in given) else [PrinterCallback(hf_format=True)]
    if verbose == 0 or any(isinstance(cb, ProgressBar) for cb in given):
        return []
    return [ProgressBar(bar=verbose == 1)]


def reporters_for(args: Any, given: Sequence[Any]) -> list[TrainerCallback]:
    """The tracking callbacks `report_to` names (each integration imported only when named)."""
    if args.report_to in (None, "none", [], ["none"]):
        return []
    from fitkit.integrations import callbacks_for

    present = {cb if isinstance(cb, type) else type(cb) for cb in given}
    return [cb for cb in callbacks_for(args.report_to) if type(cb) not in present]

