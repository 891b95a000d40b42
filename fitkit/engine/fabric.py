"""A Lightning Fabric built from `TrainingArguments` (imported only when a run starts)."""

from __future__ import annotations

import os
import warnings
from typing import Any

from fitkit.arguments import TrainingArguments

ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")
STRATEGY_NAMES = (
    "auto", "single_device", "dp", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook",
    "ddp_find_unused_parameters_true", "fsdp", "deepspeed", "deepspeed_stage_1",
    "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
    "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme", "xla",
)


def check_devices(args: TrainingArguments) -> None:
    """Validate the device options without importing Fabric (run at `compile`)."""
    if isinstance(args.accelerator, str) and args.accelerator not in ACCELERATORS:
        raise ValueError(f"unknown accelerator {args.accelerator!r} for `accelerator`; valid names are: {', '.join(ACCELERATORS)}")
    if isinstance(args.strategy, str) and args.strategy not in STRATEGY_NAMES:
        raise ValueError(
            f"unknown strategy {args.strategy!r} for `strategy`; valid names are: {', '.join(STRATEGY_NAMES)} "
            "(or pass a lightning_fabric Strategy instance)"
        )


def _precision(args: TrainingArguments, accelerator: str) -> Any:
    precision = args.precision
    if precision is None:
        return "32-true"
    precision = str(precision)
    if precision in ("16-mixed", "16") and accelerator == "cpu":
        warnings.warn("precision='16-mixed' is not supported on CPU; using 'bf16-mixed' instead", stacklevel=3)
        return "bf16-mixed"
    return precision


def build_fabric(args: TrainingArguments):
    """Create and launch a Fabric for these arguments."""
    from lightning_fabric import Fabric

    check_devices(args)
    accelerator = args.accelerator
    if accelerator == "auto":
        import torch

        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    strategy = args.strategy
    if strategy == "fsdp":
        raise ValueError(
            "`strategy='fsdp'` (FSDP2 through ModelParallelStrategy) is not available yet; "
            "use strategy='ddp' or pass a ready lightning_fabric Strategy instance"
        )
    fabric = Fabric(
        accelerator=accelerator,
        devices=args.devices,
        strategy=strategy,
        precision=_precision(args, accelerator),
        num_nodes=args.num_nodes,
    )
    if not _launched_by_cli():
        fabric.launch()
    return fabric


def _launched_by_cli() -> bool:
    # `fabric run` sets this; calling launch() there raises.
    return os.environ.get("LT_CLI_USED") == "1"
