"""The rank variables of the processes a Fabric launcher starts, completed as torchrun sets them.

Lightning's script launcher (`strategy="ddp"` run as `python train.py`) starts each other process
with `LOCAL_RANK`, `NODE_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`, but no `RANK`.
A script that builds a `transformers.TrainingArguments` reaches accelerate's `PartialState`,
which sees `LOCAL_RANK` and joins the process group through `env://`: "environment variable RANK
expected, but not set". fitkit sets `RANK` (and `LOCAL_WORLD_SIZE`) in every such process:

- the launching process records the processes per node in `FITKIT_PROCESSES_PER_NODE`
  before `fabric.launch()` (`share_layout`), so the processes it starts inherit it (its own
  environment gets no `RANK`: processes a later launch starts would inherit that one);
- each started process completes its variables when `fitkit` is imported (`complete`), before
  the script builds its arguments.

Processes torchrun starts already have `RANK`; spawned ones (`ddp_spawn`) run the script's top
level without `LOCAL_RANK`, so nothing joins a group there. Only os is imported here.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

MARKER = "FITKIT_PROCESSES_PER_NODE"


def complete(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set `RANK` (and `LOCAL_WORLD_SIZE`) in a process fitkit's launch started, when missing."""
    per_node, local = environ.get(MARKER), environ.get("LOCAL_RANK")
    if per_node is None or local is None or "RANK" in environ:
        return
    try:
        rank = int(environ.get("NODE_RANK", "0") or 0) * int(per_node) + int(local)
    except ValueError:
        return
    environ["RANK"] = str(rank)
    environ.setdefault("LOCAL_WORLD_SIZE", str(per_node))


def share_layout(fabric: Any, environ: MutableMapping[str, str] = os.environ) -> None:
    """Before `fabric.launch()` of a script launcher: record the processes per node for the
    processes it starts."""
    launcher = getattr(getattr(fabric, "strategy", None), "launcher", None)
    per_node = getattr(launcher, "num_processes", None)
    if isinstance(per_node, int) and per_node > 1 and "RANK" not in environ:
        environ[MARKER] = str(per_node)
