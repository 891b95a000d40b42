"""Where output goes: a terminal, a notebook or a pipe, and what Keras' `verbose="auto"` means there.

    resolved_verbose("auto")   # 1 (a progress bar) in a terminal or notebook, 2 (a line per epoch) elsewhere
    resolved_verbose(0)        # 0
"""

from __future__ import annotations

import sys
from typing import Any


def stdout_is_tty() -> bool:
    """True when standard output is a terminal (False for a pipe, a file, or a stream without
    `isatty` or already closed)."""
    try:
        return bool(sys.stdout.isatty())
    except (AttributeError, ValueError):
        return False


def in_notebook() -> bool:
    """True inside a Jupyter kernel, where a rich bar renders although stdout is not a tty."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


def resolved_verbose(verbose: Any) -> int:
    """Keras' `verbose`: "auto" is 1 (a bar) in a terminal or notebook and 2 (epoch lines)
    elsewhere; any other value as an int."""
    if verbose == "auto":
        return 1 if stdout_is_tty() or in_notebook() else 2
    return int(verbose)
