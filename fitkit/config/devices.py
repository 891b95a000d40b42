"""The device options checked without importing Fabric (at `compile` and at each `fit`):
accelerator and strategy names, the `devices` value, and that the accelerator asked for is here."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from fitkit.common.options import unknown_name
from fitkit.config.arguments import TrainingArguments

ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")
#: The environment variable that says what `accelerator="auto"` (the default) resolves to: "cpu" keeps
#: such runs on the CPU on a machine with a GPU (the test suite sets it), "cuda" asks for the GPU.
#: Unset: a CUDA GPU when one is available, else the CPU. An explicit `accelerator=` is never changed.
AUTO_ACCELERATOR_VARIABLE = "FITKIT_ACCELERATOR"
_AUTO_CHOICES = ("cpu", "cuda", "gpu")
STRATEGY_NAMES = (
    "auto", "single_device", "dp", "ddp", "ddp_spawn", "ddp_fork", "ddp_notebook",
    "ddp_find_unused_parameters_true", "fsdp", "deepspeed", "deepspeed_stage_1",
    "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
    "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme", "xla",
)


def check_devices(args: TrainingArguments) -> None:
    """Validate the device options without importing Fabric (run at `compile` and at each `fit`):
    names, the `devices` value, and that the accelerator asked for is there."""
    if isinstance(args.accelerator, str) and args.accelerator not in ACCELERATORS:
        raise ValueError(unknown_name("accelerator", args.accelerator, "accelerator", ACCELERATORS))
    if isinstance(args.strategy, str) and args.strategy.endswith(".json") and not os.path.isfile(args.strategy):
        raise ValueError(f"`strategy`={args.strategy!r} looks like a DeepSpeed config file, but it does not exist")
    if isinstance(args.strategy, str) and args.strategy not in STRATEGY_NAMES and not args.strategy.endswith(".json"):
        raise ValueError(unknown_name("strategy", args.strategy, "strategy", STRATEGY_NAMES,
                                      " (or pass a lightning_fabric Strategy instance)"))
    if args.fsdp_sharding != "full" and args.strategy != "fsdp":
        raise ValueError(f"`fsdp_sharding`={args.fsdp_sharding!r} applies to strategy='fsdp', and this run uses "
                         f"strategy={args.strategy!r}: pass strategy='fsdp', or leave fsdp_sharding='full'")
    if args.fsdp_load_once and args.strategy != "fsdp":
        raise ValueError(f"`fsdp_load_once`=True applies to strategy='fsdp', and this run uses strategy={args.strategy!r}: "
                         "pass strategy='fsdp', or leave fsdp_load_once=False")
    for name, default in (("fsdp_reshard_after_forward", True), ("fsdp_cpu_offload", False),
                          ("fsdp_activation_checkpointing", False)):
        if getattr(args, name) != default and args.strategy != "fsdp":
            raise ValueError(f"`{name}`={getattr(args, name)!r} applies to strategy='fsdp', and this run uses "
                             f"strategy={args.strategy!r}: pass strategy='fsdp', or leave {name}={default!r}")
    accelerator = _available_accelerator(args.accelerator)
    _check_device_count(args.devices, accelerator)


def auto_accelerator() -> str:
    """What `accelerator="auto"` resolves to here: "cpu" or "cuda"::

        os.environ["FITKIT_ACCELERATOR"] = "cpu"   # "auto" stays on the CPU, GPU or not
        auto_accelerator()                          # -> "cpu"

    Without `FITKIT_ACCELERATOR`, "cuda" when torch sees a CUDA GPU, else "cpu"."""
    import torch

    chosen = os.environ.get(AUTO_ACCELERATOR_VARIABLE, "").strip().lower()
    if not chosen:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if chosen not in _AUTO_CHOICES:
        raise ValueError(f"the environment variable {AUTO_ACCELERATOR_VARIABLE}={chosen!r} is invalid: set it to "
                         f"'cpu' or 'cuda' (what accelerator='auto' resolves to), or unset it")
    if chosen != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"the environment variable {AUTO_ACCELERATOR_VARIABLE}={chosen!r} asks for a CUDA GPU, and "
                         f"none is available here (torch {torch.__version__}): set it to 'cpu', or unset it")
    return "cuda" if chosen == "gpu" else chosen


def _available_accelerator(accelerator: Any) -> str | None:
    """The accelerator a run will use ("cpu", "cuda", "mps", ...; None for an Accelerator object
    or "tpu"); an accelerator asked for by name that this machine lacks raises here."""
    import torch

    if not isinstance(accelerator, str):
        return None
    if accelerator == "auto":
        return auto_accelerator()
    cuda = torch.cuda.is_available()
    if accelerator in ("cuda", "gpu") and not cuda:
        raise ValueError(f"`accelerator`={accelerator!r} but no CUDA GPU is available here (torch "
                         f"{torch.__version__}): use accelerator='cpu', or 'auto' to take a GPU when there is one")
    if accelerator == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("`accelerator`='mps' but Apple's MPS is not available here: use accelerator='cpu' or 'auto'")
    return "cuda" if accelerator == "gpu" else accelerator if accelerator in ("cpu", "cuda", "mps") else None


def _check_device_count(devices: Any, accelerator: str | None) -> None:
    """`devices`: "auto", a count > 0, -1 (every GPU), a list of GPU indices, or such a string."""
    fix = ("pass a number of devices > 0 (processes on CPU), -1 for every GPU, 'auto', or a list of GPU indices "
           "such as [0, 1]")
    value = devices
    if isinstance(value, str) and value != "auto":
        text = value.strip()
        if text.lstrip("-").isdigit():
            value = int(text)
        elif text and all(part.strip().isdigit() for part in text.rstrip(",").split(",")):
            value = [int(part) for part in text.rstrip(",").split(",")]
        else:
            raise ValueError(f"`devices`={devices!r} is invalid: {fix}")
    if isinstance(value, str):  # "auto"
        return
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
            raise ValueError(f"`devices`={devices!r} is invalid: {fix}")
        if accelerator == "cpu":
            raise ValueError(f"`devices`={devices!r} lists device indices, which only GPUs have: on CPU pass a "
                             "number of processes, e.g. devices=2")
        _check_gpu_indices(devices, value, accelerator)
        return
    if not isinstance(value, int) or isinstance(value, bool) or not (value > 0 or value == -1):
        raise ValueError(f"`devices`={devices!r} is invalid: {fix}")
    if value == -1 and accelerator == "cpu":
        raise ValueError(f"`devices`={devices!r} means every GPU, and this run is on CPU: pass a number of processes, "
                         "e.g. devices=2")
    if value > 0 and accelerator == "cuda":
        _check_gpu_indices(devices, list(range(value)), accelerator)


def _check_gpu_indices(devices: Any, indices: Sequence[int], accelerator: str | None) -> None:
    import torch

    if accelerator != "cuda":
        return
    count = torch.cuda.device_count()
    if max(indices) >= count:
        raise ValueError(f"`devices`={devices!r} asks for more GPUs than the {count} here: pass at most "
                         f"devices={count}, or indices below {count}")
