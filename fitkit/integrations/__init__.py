"""Experiment tracking: `fit(report_to=...)` and the logger callbacks behind it.

Each integration lives in its own module and imports its library only when a run starts, so
`import fitkit` (and `import fitkit.integrations`) never loads TensorBoard, MLflow, W&B, ...::

    model.fit(x, y, report_to=["tensorboard", "mlflow"])       # by name
    model.fit(x, y, report_to="all")                            # every installed one
    model.fit(x, y, callbacks=[TensorBoardCallback("tb")])      # or as callbacks

Names: "csv", "tensorboard", "mlflow", "wandb", "comet_ml", "codecarbon", "all" and "none".
See docs/tracking.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from fitkit.common.options import did_you_mean
from fitkit.integrations._common import (
    INTEGRATIONS,
    MissingIntegrationError,
    TrackingCallback,
    is_available,
    looks_secret,
    mask_secrets,
    require,
)

__all__ = [
    "CSVStepLogger",
    "CodeCarbonCallback",
    "CometCallback",
    "MLflowCallback",
    "MissingIntegrationError",
    "TensorBoardCallback",
    "TrackingCallback",
    "WandbCallback",
    "available_integrations",
    "callbacks_for",
    "looks_secret",
    "mask_secrets",
]

_CLASSES = {spec.callback: spec.module for spec in INTEGRATIONS.values()}
VALID_NAMES = (*INTEGRATIONS, "all", "none")


def __getattr__(name: str) -> Any:  # lazy: `from fitkit.integrations import MLflowCallback`
    module = _CLASSES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def available_integrations() -> list[str]:
    """The `report_to` names whose package is installed here (what `"all"` selects)."""
    return [name for name in INTEGRATIONS if is_available(name)]


def _names(report_to: Any) -> list[str]:
    if report_to is None:
        return []
    raw = [report_to] if isinstance(report_to, str) else list(report_to)
    names: list[str] = []
    for item in raw:
        if not isinstance(item, str):
            raise TypeError(f"`report_to` takes names (str), got {item!r}; pass logger callbacks in `callbacks`")
        name = item.strip().lower()
        if name not in VALID_NAMES:
            raise ValueError(f"{did_you_mean(item, VALID_NAMES)}unknown `report_to` value {item!r}; "
                             f"valid names are: {', '.join(VALID_NAMES)}")
        found = available_integrations() if name == "all" else [] if name == "none" else [name]
        names.extend(n for n in found if n not in names)
    return names


def callbacks_for(report_to: Any) -> list:
    """New tracking callbacks for `report_to` (a name or a list of names).

    `"all"` means every integration whose package is installed; `"none"` (or `None`, or an
    empty list) means none. An unknown name raises `ValueError` listing the valid ones; a
    named integration whose package is missing raises `MissingIntegrationError` (an
    `ImportError`) naming the pip extra to install.
    """
    names = _names(report_to)
    for name in names:
        require(name)
    callbacks = []
    for name in names:
        spec = INTEGRATIONS[name]
        module = importlib.import_module(f"{__name__}.{spec.module}")
        callbacks.append(getattr(module, spec.callback)())
    return callbacks
