"""Lightning's own output, as `log_level` asks (imported only when a run builds its Fabric).

Lightning Fabric logs its bookkeeping at INFO level on the "lightning_fabric" loggers
("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2", the dashed "All distributed
processes registered" block, "Using bfloat16 Automatic Mixed Precision"), and its
`all_gather` calls a torch collective that warns it is deprecated. None of it is the user's
business: a fit shows it only when the process's `log_level` (`log_level_replica` off the
main process) is "info" or "debug"::

    model.fit(x, y, log_level="info")   # Lightning's banner comes back

The levels are set on Lightning's logger (never by redirecting a stream), so a handler the
application installed still sees what passes the level.

Importing Lightning imports torchmetrics, which imports `tqdm.auto`; in a notebook without
ipywidgets that prints "IProgress not found. Please update jupyter and ipywidgets", about a
tqdm bar nothing here draws. `import_lightning` makes that first import without the note.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from fitkit.common.quiet_import import quiet_import
from fitkit.config.arguments import TrainingArguments

#: The logger every `lightning_fabric.*` module logs through.
LIGHTNING_LOGGER = "lightning_fabric"
#: What Lightning's `all_gather` makes torch say under several processes (a FutureWarning).
DEPRECATED_GATHER = r"torch\.distributed\.nn\.functional\.all_gather is deprecated"


def quiet_lightning(args: TrainingArguments, global_rank: int | None = None, local_rank: int | None = None) -> int:
    """Set Lightning's logger to this process's `log_level` ("passive": warning) and, unless
    that level shows info, hide the deprecation warning Lightning's `all_gather` triggers.

    The ranks default to what the launcher put in the environment (a process Fabric's launcher
    started has `LOCAL_RANK`); the main process of a run has 0. Returns the level set.
    """
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK") or 0)
    if global_rank is None:
        global_rank = int(os.environ.get("RANK") or local_rank)
    level = args.get_process_log_level(global_rank, local_rank)
    level = logging.WARNING if level is None else level
    logging.getLogger(LIGHTNING_LOGGER).setLevel(level)
    if level > logging.INFO:
        # Lightning calls the deprecated function; the user has nothing to change.
        warnings.filterwarnings("ignore", message=DEPRECATED_GATHER, category=FutureWarning,
                                module=r"lightning_fabric\.")
    return level


class QuietWhenSpawned:
    """Lightning's output settings, carried to the processes a spawn strategy starts.

    Fabric pickles itself into each process `ddp_spawn` starts; kept on it (`build_fabric` does
    this), this object is unpickled there before Fabric sets up the process group and logs its
    banner, and applies `quiet_lightning` in that process. The process's rank is not known yet
    at that point: every process uses `log_level`, the main process's level.
    """

    def __init__(self, args: TrainingArguments):
        self.args = args

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        quiet_lightning(self.args, 0, 0)


def import_lightning() -> None:
    """Import Lightning Fabric, the first time without tqdm's notebook note (see above)."""
    if "lightning_fabric" in sys.modules:
        return
    quiet_import("lightning_fabric")
