"""Hugging Face's `deepspeed` field as the config of Fabric's `DeepSpeedStrategy`, its "auto"
values filled as transformers' `HfTrainerDeepSpeedConfig` fills them.

The field is a DeepSpeed config dict or a JSON file's path. When the arguments are read
(`deepspeed_config`): the batch sizes, clipping, optimizer and warm-up rate, fp16/bf16; when the
model and the number of steps are known (`finalize_deepspeed`): the bucket sizes from the model's
hidden size and the scheduler's steps. A value that is not "auto" and disagrees with
the arguments is an error naming both, as the Trainer's. `train_batch_size` counts every process:
read before fitkit starts them (one process so far), an "auto" one is left to DeepSpeed, which
derives it as the same product::

    deepspeed_config({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}, hf_args)
    # {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
"""

from __future__ import annotations

import copy
import math
from typing import Any

from fitkit.config.hf_distributed import read_config


class _Filler:
    """The config being filled, and the values that disagree with the arguments."""

    def __init__(self, config: dict) -> None:
        self.config, self.mismatches = config, list[str]()

    def node(self, key: str) -> tuple[dict | None, str]:
        *path, leaf = key.split(".")
        node: Any = self.config
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, leaf
        return (node if isinstance(node, dict) else None), leaf

    def is_auto(self, key: str) -> bool:
        node, leaf = self.node(key)
        return node is not None and node.get(leaf) == "auto"

    def fill(self, key: str, value: Any, hf_name: str | None = None) -> None:
        """An "auto" at `key` becomes `value`; another value must equal it when `hf_name` names the argument."""
        node, leaf = self.node(key)
        if node is None:
            return
        if node.get(leaf) == "auto":
            node[leaf] = value
        elif hf_name is not None and node.get(leaf) is not None and node.get(leaf) != value:
            self.mismatches.append(f"{key}={node.get(leaf)!r} vs {hf_name}={value!r}")

    def check(self) -> dict:
        if self.mismatches:
            raise ValueError("`deepspeed`: these DeepSpeed config values disagree with the TrainingArguments: "
                             + "; ".join(self.mismatches) + " (set them to 'auto', or to the arguments' values)")
        return self.config


def deepspeed_config(config: Any, hf_args: Any) -> dict:
    """A copy of HF's `deepspeed` config with the values the arguments give filled in (see the module
    docstring)."""
    filler = _Filler(copy.deepcopy(read_config(config, "deepspeed")))
    micro, accumulation = hf_args.per_device_train_batch_size, hf_args.gradient_accumulation_steps
    auto_batch = bool(getattr(hf_args, "auto_find_batch_size", False))
    filler.fill("train_micro_batch_size_per_gpu", micro, None if auto_batch else "per_device_train_batch_size")
    filler.fill("gradient_accumulation_steps", accumulation, "gradient_accumulation_steps")
    world = int(getattr(hf_args, "world_size", 1) or 1)
    if world > 1:  # launched already (torchrun): the Trainer's figure
        filler.fill("train_batch_size", world * micro * accumulation,
                    None if auto_batch else "train_batch_size (world_size x per_device x accumulation)")
    elif filler.is_auto("train_batch_size"):  # fitkit starts the processes later: DeepSpeed derives the same product
        del filler.config["train_batch_size"]
    filler.fill("gradient_clipping", hf_args.max_grad_norm, "max_grad_norm")
    filler.fill("optimizer.params.lr", hf_args.learning_rate, "learning_rate")
    filler.fill("optimizer.params.betas", [hf_args.adam_beta1, hf_args.adam_beta2], "adam_beta1+adam_beta2")
    filler.fill("optimizer.params.eps", hf_args.adam_epsilon, "adam_epsilon")
    filler.fill("optimizer.params.weight_decay", hf_args.weight_decay, "weight_decay")
    filler.fill("scheduler.params.warmup_min_lr", 0)
    filler.fill("scheduler.params.warmup_max_lr", hf_args.learning_rate, "learning_rate")
    if getattr(hf_args, "save_on_each_node", False):
        filler.config.setdefault("checkpoint", {})["use_node_local_storage"] = True
    fp16 = bool(hf_args.fp16 or getattr(hf_args, "fp16_full_eval", False))
    bf16 = bool(hf_args.bf16 or getattr(hf_args, "bf16_full_eval", False))
    filler.fill("fp16.enabled", fp16, "fp16|fp16_full_eval")
    filler.fill("bf16.enabled", bf16, "bf16|bf16_full_eval")
    return filler.check()


_HIDDEN_KEYS = ("zero_optimization.reduce_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.stage3_param_persistence_threshold")


def _hidden_size(module: Any) -> int | None:
    config = getattr(module, "config", None)
    for source in (config, getattr(config, "text_config", None)):
        if source is None:
            continue
        if getattr(source, "hidden_size", None) is not None:
            return int(source.hidden_size)
        if getattr(source, "hidden_sizes", None):
            return int(max(source.hidden_sizes))
    return None


def finalize_deepspeed(config: dict, module: Any, num_training_steps: int, warmup: float) -> dict:
    """`config` (filled by `deepspeed_config`) with the model's and the run's "auto" values, in
    place: the ZeRO bucket sizes from the model's hidden size h (h*h; under ZeRO-3 also 0.9*h*h
    and 10*h), the scheduler's `total_num_steps` and `warmup_num_steps` (`warmup`: steps, or
    below 1 a share of the steps; at least 1, as DeepSpeed needs)."""
    filler = _Filler(config)
    autos = [k for k in _HIDDEN_KEYS if filler.is_auto(k)]
    if autos:
        hidden = _hidden_size(module)
        if hidden is None:
            raise ValueError(f"`deepspeed`: {autos} are 'auto', and {type(module).__name__} has no config.hidden_size "
                             "to fill them from: give them numbers in the DeepSpeed config")
        filler.fill("zero_optimization.reduce_bucket_size", hidden * hidden)
        if (config.get("zero_optimization") or {}).get("stage") == 3:
            filler.fill("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
            filler.fill("zero_optimization.stage3_param_persistence_threshold", 10 * hidden)
    filler.fill("scheduler.params.total_num_steps", num_training_steps, "num_training_steps")
    steps = int(warmup) if warmup >= 1 else math.ceil(num_training_steps * warmup)
    filler.fill("scheduler.params.warmup_num_steps", max(1, steps), "warmup_steps")
    return filler.check()
