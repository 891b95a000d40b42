"""What a checkpoint directory is made of: its files' names, its manifest's format, the errors.

`output_dir/checkpoint-{global_step}/` holds `state.pt` (a file, or a directory when sharded),
`trainer_state.json`, `training_args.json` and, written last, the manifest `fitkit_checkpoint.json`
(every file's size and digest). The other checkpoint modules read these names from here::

    from fitkit.engine.checkpoint.layout import MANIFEST, CheckpointError

    if not os.path.isfile(os.path.join(path, MANIFEST)):
        raise CheckpointError(f"{path!r} is not a fitkit checkpoint")
"""

from __future__ import annotations

import re

STATE_FILE = "trainer_state.json"
ARGS_FILE = "training_args.json"
WEIGHTS = "state.pt"
#: What every checkpoint's manifest must list (`state.pt` is a file, or a directory when sharded).
REQUIRED = (WEIGHTS, STATE_FILE)
#: A checkpoint being written: `.tmp-checkpoint-{step}-{token}`, the token unique to the run.
TMP_PREFIX = ".tmp-checkpoint-"
FORMAT_VERSION = 2
MANIFEST = "fitkit_checkpoint.json"
#: The digests a manifest may name (new ones record `state_file.ALGORITHM`).
READABLE_DIGESTS = frozenset({"sha256", "blake2b"})
#: A committed checkpoint's directory name; the group is its global step.
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
#: The fix a damaged checkpoint's error names.
FIX_DAMAGED = ("resume from an earlier checkpoint (resume_from_checkpoint=True takes the newest one that verifies) "
               "or delete this checkpoint directory")


class CheckpointError(ValueError):
    """A checkpoint path that does not exist, is incomplete or corrupted, is not a fitkit
    checkpoint, or was written for another model or optimizer."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (disk full, read-only, quota): nothing half-written is
    left, the earlier checkpoints are intact and the run can be resumed once space is freed."""
