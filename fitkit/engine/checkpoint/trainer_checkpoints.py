"""Checkpoints of the Hugging Face Trainer, read into a fitkit run: recognised (a `checkpoint-N`
without fitkit's manifest, holding `trainer_state.json`), checked, and loaded so the run goes on
where the Trainer would have (weights, optimizer, scheduler, RNG, `TrainerState`, the data
position); and the guard that keeps a fitkit run from writing over them::

    path = checked("hf_out/checkpoint-32")                # CheckpointError naming what is missing
    load_weights(module, path)                            # model.safetensors or pytorch_model.bin
    load_optimizer(optimizer, path); load_scheduler(scheduler, path)
    rng = read_rng(path, rank=0, world_size=1)            # as `fitkit.engine.data.rng.rng_state` gives it
    epoch, batch = position(32, epoch_length=12, accumulation=1, ignore_data_skip=False)   # (2, 8)
    guard_output_dir("out", resume=None)                  # CheckpointError when "out" holds the Trainer's

The Trainer's checkpoints carry no digests: they are checked for their files and a readable
`trainer_state.json`, and every tensor file is read with `weights_only=True` (safetensors when the
`safetensors` package is installed).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from fitkit.common.options import error_line
from fitkit.common.schedule import steps_per_epoch
from fitkit.common.wrappers import torch_optimizer, unwrapped
from fitkit.engine.checkpoint.layout import CHECKPOINT_NAME, MANIFEST, STATE_FILE, WEIGHTS, CheckpointError
from fitkit.engine.checkpoint.loading import _state_differences
from fitkit.events.state import TrainerState

logger = logging.getLogger("fitkit")

#: The Trainer's weight files, in the order it reads them (one file, then an index of shards).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng_state.pth"

_FIX_OTHER = ("pass resume_from_checkpoint=... with another checkpoint (a Trainer checkpoint holds "
              f"{WEIGHT_FILES[0]} or {WEIGHT_FILES[2]}, {OPTIMIZER_FILE}, {SCHEDULER_FILE}, {RNG_FILE}, {STATE_FILE})")


def is_trainer_checkpoint(path: str) -> bool:
    """True for a directory the Trainer wrote: `trainer_state.json` and neither fitkit's manifest
    nor its `state.pt` (a fitkit checkpoint of a Hugging Face model holds `model.safetensors` too)."""
    return (os.path.isdir(path) and os.path.isfile(os.path.join(path, STATE_FILE))
            and not os.path.exists(os.path.join(path, MANIFEST)) and not os.path.exists(os.path.join(path, WEIGHTS)))


def checkpoint_step(path: str) -> int:
    """N of a `checkpoint-N` directory (-1 for another name)."""
    match = CHECKPOINT_NAME.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else -1


def trainer_checkpoints(output_dir: str) -> list[str]:
    """The Trainer's `checkpoint-N` directories in `output_dir`, oldest (smallest N) first."""
    if not os.path.isdir(output_dir):
        return []
    found = [os.path.join(output_dir, name) for name in os.listdir(output_dir) if CHECKPOINT_NAME.match(name)]
    return sorted((path for path in found if is_trainer_checkpoint(path)), key=checkpoint_step)


def checked(path: str) -> str:
    """`path`, after checking that it holds what a resume reads: the weights, the optimizer's
    state (a checkpoint of `save_only_model=True` has none: the run could not continue as the
    Trainer would) and a readable `trainer_state.json`. A CheckpointError names what is missing."""
    if weights_file(path) is None:
        read_weights(path)  # raises, naming the files it looked for
    if not os.path.isfile(os.path.join(path, OPTIMIZER_FILE)):
        raise CheckpointError(
            f"Trainer checkpoint {path!r} holds no {OPTIMIZER_FILE} (written with save_only_model=True?): training "
            "cannot continue as the Trainer's would without the optimizer's state; open its weights with "
            "`from_pretrained` and start a fresh fit, or " + _FIX_OTHER)
    trainer_state(path)
    return path


def trainer_state(path: str) -> TrainerState:
    """The Trainer's `trainer_state.json` as fitkit's `TrainerState` (the Trainer's own field
    names; keys fitkit does not know are left out); CheckpointError when unreadable."""
    try:
        return TrainerState.load_from_json(os.path.join(path, STATE_FILE))
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"Trainer checkpoint {path!r}: {STATE_FILE} cannot be read ({error_line(err)}); "
                              f"{_FIX_OTHER}") from None


def weights_file(path: str) -> str | None:
    """The weight file the Trainer would read in `path` (None when there is none)."""
    for name in WEIGHT_FILES:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    return None


def read_weights(path: str) -> dict[str, Any]:
    """Every tensor of the checkpoint's weights, on the CPU: `model.safetensors` (through the
    `safetensors` package), else `pytorch_model.bin` (weights-only), or the shards an index names."""
    import torch

    found = weights_file(path)
    if found is None:
        raise CheckpointError(f"Trainer checkpoint {path!r} holds no weights (none of {', '.join(WEIGHT_FILES)}); "
                              f"{_FIX_OTHER}")
    if found.endswith(".index.json"):
        with open(found, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        files = [os.path.join(path, name) for name in shards]
    else:
        files = [found]
    weights: dict[str, Any] = {}
    for file in files:
        if ".safetensors" in os.path.basename(file):
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise CheckpointError(f"reading {file!r} needs the `safetensors` package: pip install safetensors") \
                    from None
            weights.update(load_file(file, device="cpu"))
        else:
            weights.update(torch.load(file, map_location="cpu", weights_only=True))
    return weights


def load_weights(module: Any, path: str) -> None:
    """Load the checkpoint's weights into `module` (inside Fabric's or DDP's wrappers). Weights a
    `save_pretrained` left out because they are tied to one it kept may be missing; any other
    difference (a missing, unexpected or reshaped weight) is a CheckpointError, nothing loaded."""
    target = unwrapped(module)
    saved, current = read_weights(path), target.state_dict()
    loaded = {t.data_ptr() for name, t in current.items() if name in saved and t.numel()}
    missing = [k for k in current if k not in saved and not (current[k].numel() and current[k].data_ptr() in loaded)]
    unexpected = [k for k in saved if k not in current]
    reshaped = [k for k in saved if k in current and tuple(saved[k].shape) != tuple(current[k].shape)]
    if missing or unexpected or reshaped:
        kept = {k: v for k, v in current.items() if k in saved or k in missing}
        problems = _state_differences(saved, kept)
        raise CheckpointError(f"cannot resume from the Trainer checkpoint {path!r}: it holds the weights of another "
                              f"model ({problems}); resume with the model the Trainer trained")
    target.load_state_dict(saved, strict=False)


def load_optimizer(optimizer: Any, path: str) -> None:
    """Load `optimizer.pt` into the run's torch optimizer (inside Fabric's wrapper). Its parameter
    groups must have the sizes of the Trainer's (HF's two weight-decay groups: `args=` a
    `transformers.TrainingArguments`, or `exclude_from_weight_decay="hf"`), else CheckpointError."""
    import torch

    inner = torch_optimizer(optimizer)
    saved = torch.load(os.path.join(path, OPTIMIZER_FILE), map_location="cpu", weights_only=True)
    sizes = [len(g.get("params", ())) for g in saved.get("param_groups", [])]
    mine = [len(g["params"]) for g in inner.param_groups]
    if sizes != mine:
        raise CheckpointError(
            f"cannot resume from the Trainer checkpoint {path!r}: its optimizer has parameter groups of {sizes} "
            f"parameters and this run's {type(inner).__name__} has {mine}; train with the Trainer's optimizer: "
            "fit(args=the Trainer's TrainingArguments) or optim=... with exclude_from_weight_decay='hf'")
    inner.load_state_dict(saved)


def load_scheduler(scheduler: Any, path: str) -> None:
    """Load `scheduler.pt` into the run's scheduler (None: a constant rate, nothing to load). The
    Trainer skips both optimizer and scheduler when one of the two files is missing; fitkit
    warns, as the rate would then start the schedule over."""
    import torch

    file = os.path.join(path, SCHEDULER_FILE)
    if scheduler is None:
        return
    if not os.path.isfile(file):
        logger.warning("Trainer checkpoint %s holds no %s: the learning-rate schedule starts over", path,
                       SCHEDULER_FILE)
        return
    scheduler.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))


def read_rng(path: str, rank: int, world_size: int) -> dict[str, Any] | None:
    """The RNG states the Trainer saved for process `rank` (`rng_state.pth`, or
    `rng_state_{rank}.pth` under several processes), in the form
    `fitkit.engine.data.rng.set_rng_state` takes; None, with a warning, when there is none."""
    import numpy as np
    import torch

    name = RNG_FILE if world_size == 1 else f"rng_state_{rank}.pth"
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        logger.warning("Trainer checkpoint %s holds no %s: random draws after the resume differ from the Trainer's",
                       path, name)
        return None
    numpy_core = getattr(np, "_core", None) or np.core
    allowed = [numpy_core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    with torch.serialization.safe_globals(allowed):
        saved = torch.load(file, map_location="cpu", weights_only=True)
    version, internal, gauss = saved["python"]
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": saved["cpu"]}
    if "numpy" in saved:
        kind, keys, pos, has_gauss, cached = saved["numpy"]
        state["numpy"] = [kind, torch.from_numpy(np.asarray(keys).astype("int64")), pos, has_gauss, cached]
    if "cuda" in saved:
        cuda = saved["cuda"]
        state["cuda"] = list(cuda) if isinstance(cuda, (list, tuple)) else [cuda]
    return state


def position(global_step: int, epoch_length: int | None, accumulation: int, ignore_data_skip: bool) -> tuple[int, int]:
    """Where the Trainer continues at `global_step`, in this run's data: `(epoch, micro-batches of
    it to skip)`, from this run's batches per epoch (`epoch_length`; None for data of unknown
    length, one long epoch); with `ignore_data_skip` the epoch starts over (the Trainer's rule)."""
    if not epoch_length:
        return 0, (0 if ignore_data_skip else global_step * accumulation)
    per_epoch = steps_per_epoch(epoch_length, accumulation)
    epoch = global_step // per_epoch
    return epoch, (0 if ignore_data_skip else (global_step % per_epoch) * accumulation)


def guard_output_dir(output_dir: str, resume: str | None) -> None:
    """Refuse a run that writes checkpoints into an `output_dir` holding the Trainer's checkpoints
    while it does not resume from one of that directory's checkpoints: its `checkpoint-N` would
    replace the Trainer's of the same step. CheckpointError naming the ways on."""
    theirs = trainer_checkpoints(output_dir)
    if not theirs:
        return
    if resume is not None and os.path.realpath(os.path.dirname(os.path.abspath(resume))) == os.path.realpath(
            output_dir):
        return
    names = ", ".join(os.path.basename(p) for p in theirs)
    raise CheckpointError(
        f"`output_dir`={output_dir!r} holds checkpoints of the Hugging Face Trainer ({names}), and this run would write "
        "its own checkpoint-N over them: pass resume_from_checkpoint=True to continue the newest of them (or "
        f"resume_from_checkpoint={theirs[-1]!r}), or another `output_dir`; to start over there, move or delete "
        "those directories first")


def replaced_later(output_dir: str, resumed: str) -> list[str]:
    """The Trainer's checkpoints in `output_dir` after `resumed` (by step): a run resumed from
    `resumed` writes its own checkpoints of those steps in their place, as the Trainer would."""
    return [p for p in trainer_checkpoints(output_dir) if checkpoint_step(p) > checkpoint_step(resumed)]
