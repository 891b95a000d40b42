"""Hyperparameter search through Optuna (optuna is imported only when a search runs)."""

from __future__ import annotations

from typing import Any, NamedTuple


class BestRun(NamedTuple):
    """The best trial of a search (HF's fields)."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any = None
