"""Optional integrations (loggers, search); each imported only when used."""

from __future__ import annotations

from typing import Any


def callbacks_for(report_to: Any) -> list:
    """The tracking callbacks for `report_to` (a name or a list of names)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    names = [n for n in names if n != "none"]
    if names:
        raise ValueError(f"unknown `report_to` value(s) {names}: no tracking integration is available yet; use 'none'")
    return []
