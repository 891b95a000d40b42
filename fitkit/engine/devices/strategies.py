"""Strategies fitkit builds itself: `strategy="fsdp"` is PyTorch FSDP2 (`fully_shard`) through
Fabric's `ModelParallelStrategy`, which, unlike Fabric's FSDP1 strategy, also runs on CPU;
`fsdp_sharding="hybrid"` shards within each node and replicates across nodes.

    fsdp2_strategy("bf16-mixed", wrap={torch.nn.TransformerEncoderLayer}, sharding="hybrid")

On CPU every unit gets `fsdp_cpu.lean_cpu_units`' collectives (no layer held twice or kept
for an overlap gloo does not give), and the memory the layer-by-layer initialization left free
between live blocks goes back to the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fitkit.engine.devices.deferred_init import materialize_shards
from fitkit.engine.devices.fsdp_cpu import lean_cpu_units
from fitkit.engine.devices.host_allocator import map_large_blocks, release_freed_memory
from fitkit.engine.devices.load_once import scatter_from_rank0

SPAWN_STRATEGIES = ("ddp_spawn", "ddp_notebook", "ddp_fork", "ddp_spawn_find_unused_parameters_true",
                    "ddp_fork_find_unused_parameters_true", "ddp_notebook_find_unused_parameters_true")


def is_deepspeed(strategy: Any) -> bool:
    """`"deepspeed"`, `"deepspeed_stage_N[_offload]"`, a DeepSpeed config dict or a path to one."""
    if isinstance(strategy, dict):
        return True
    return isinstance(strategy, str) and (strategy.startswith("deepspeed") or strategy.endswith(".json"))


def deepspeed_strategy(strategy: Any):
    """A Fabric DeepSpeedStrategy for a config dict or JSON path; names pass through to Fabric."""
    if isinstance(strategy, str) and strategy.startswith("deepspeed"):
        return strategy
    import importlib.util

    autos = _auto_keys(strategy) if isinstance(strategy, dict) else []
    if autos:
        raise ValueError(f"the DeepSpeed config's {autos} are still 'auto' (the model's sizes and the run's steps, "
                         "which fitkit does not fill yet): give them numbers, or fill them with "
                         "fitkit.config.hf_deepspeed.finalize_deepspeed(config, model, num_training_steps, warmup) "
                         "as the Trainer fills them")
    if importlib.util.find_spec("deepspeed") is None:
        raise ValueError("`strategy` (or HF's `deepspeed`) is a DeepSpeed config, and the deepspeed package is not "
                         "installed: pip install deepspeed (CUDA GPUs), or use strategy='fsdp' (sharded parameters, "
                         "gradients and optimizer state)")
    from lightning_fabric.strategies import DeepSpeedStrategy

    return DeepSpeedStrategy(config=strategy)


def _auto_keys(config: dict, prefix: str = "") -> list[str]:
    """The dotted keys of `config` whose value is still "auto"."""
    keys = []
    for key, value in config.items():
        if isinstance(value, dict):
            keys += _auto_keys(value, f"{prefix}{key}.")
        elif value == "auto":
            keys.append(prefix + key)
    return keys


def single_device_strategy(accelerator: str, devices: Any) -> Any:
    """Fabric's `SingleDeviceStrategy` for `strategy="single_device"` (a name Fabric itself does
    not take): one process on the CPU or on one GPU (`devices` 1, "auto", or one index)."""
    from lightning_fabric.strategies import SingleDeviceStrategy

    index = 0
    if isinstance(devices, (list, tuple)) and len(devices) == 1:
        index = int(devices[0])
    elif devices not in (1, "1", "auto"):
        raise ValueError(f"`strategy`='single_device' runs on one device, but `devices`={devices!r}: pass devices=1 "
                         "(or one GPU index, devices=[2]), or a strategy for several devices such as 'ddp'")
    return SingleDeviceStrategy(device=torch.device("cpu") if accelerator == "cpu" else torch.device(accelerator, index))


def _wrap_policy(wrap: Any) -> Callable[[torch.nn.Module], bool]:
    """Which submodules become their own FSDP unit: by default every module that holds
    parameters directly (one unit per layer); or instances of the given classes; or a predicate."""
    if wrap is None:
        return lambda m: any(True for _ in m.parameters(recurse=False))
    if callable(wrap) and not isinstance(wrap, type):
        return wrap
    classes = tuple(wrap) if isinstance(wrap, (set, list, tuple, frozenset)) else (wrap,)
    return lambda m: isinstance(m, classes)


def _mixed_precision(precision: str | None):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision in ("bf16-mixed",):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if precision in ("16-mixed",):
        return MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def fsdp2_strategy(precision: str | None, wrap: Any = None, full_checkpoint: bool = False, sharding: str = "full",
                   tune_allocator: bool = True, reshard_after_forward: bool = True, cpu_offload: bool = False,
                   activation_checkpointing: bool = False):
    """FSDP2 (data parallel only), with per-layer sharding and the mixed-precision policy mapped
    from `precision`. `sharding="full"` shards over all processes; `"hybrid"` shards within each
    node and replicates across nodes (HSDP: a 2-D device mesh `(replicate, shard)` of
    `num_nodes x devices`), so the all-gathers stay on the fast links inside a node. Checkpoints
    are sharded (DCP) unless `full_checkpoint`. On CPU, `tune_allocator` (fit's
    `tune_cpu_allocator`) has glibc map the step's layer-size blocks (`map_large_blocks`).
    `reshard_after_forward=False` keeps each unit (not the root) gathered from its forward to its
    backward (HF's "shard_grad_op"); `cpu_offload` keeps parameters, gradients and optimizer state
    in host memory (FSDP2's `CPUOffloadPolicy`; on a CPU they are there already);
    `activation_checkpointing` recomputes each unit's (not the root's) activations in backward."""
    from lightning_fabric.strategies import ModelParallelStrategy

    policy = _mixed_precision(precision)

    class FSDP2Strategy(ModelParallelStrategy):
        """ModelParallelStrategy with every process in one data-parallel group: each reads its
        own share of the data; the parameters are sharded over all of them, or per node."""

        #: what `parallelize` applies (read by tests and by a user checking the mapping of HF's fsdp_config)
        settings = {"wrap": wrap, "sharding": sharding, "reshard_after_forward": reshard_after_forward,
                    "cpu_offload": cpu_offload, "activation_checkpointing": activation_checkpointing,
                    "full_checkpoint": full_checkpoint}

        def setup_environment(self) -> None:
            self._data_parallel_size = self.num_nodes * self.num_processes
            self._tensor_parallel_size = 1
            super().setup_environment()
            if tune_allocator and self.root_device.type == "cpu":  # before `model_init` builds anything
                map_large_blocks()  # whole layers, unmapped when freed: no heap fragmented among shards

        def parallelize(self, module: torch.nn.Module, device_mesh) -> torch.nn.Module:
            mesh = device_mesh["data_parallel"] if sharding == "full" else self.hybrid_mesh()
            on_cpu = self.root_device.type == "cpu"
            _shard(module, self.settings, _shard_options(mesh, policy, cpu_offload and not on_cpu))
            if on_cpu:
                lean_cpu_units(module)
            # a module model_init built on meta, or (fsdp_load_once) in rank 0 only
            built = materialize_shards(module, self.root_device) or scatter_from_rank0(module, self.root_device)
            if built and on_cpu:
                release_freed_memory()  # what the set-up left between live blocks
            return module

        def hybrid_mesh(self):
            """Ranks `node * devices + local rank` in rows by node: dim 0 replicates, dim 1 shards."""
            from torch.distributed.device_mesh import init_device_mesh

            return init_device_mesh(self.root_device.type, (self.num_nodes, self.num_processes),
                                    mesh_dim_names=("replicate", "shard"))

    strategy = FSDP2Strategy(parallelize_fn=lambda module, mesh: strategy.parallelize(module, mesh),
                             save_distributed_checkpoint=not full_checkpoint)
    return strategy


def _shard(module: torch.nn.Module, settings: dict[str, Any], options: dict[str, Any]) -> None:
    """`fully_shard` the units `settings["wrap"]` chooses (innermost first; checkpointed first
    with `activation_checkpointing`), then the root, with `options` (`_shard_options`)."""
    from torch.distributed.fsdp import fully_shard

    wrap = settings["wrap"]
    should_wrap = wrap.for_module(module) if hasattr(wrap, "for_module") else _wrap_policy(wrap)
    units = [sub for sub in list(module.modules())[1:][::-1] if should_wrap(sub)]
    if settings["activation_checkpointing"]:
        from torch.distributed._composable import checkpoint  # keeps the parameters' names

        for sub in units:
            checkpoint(sub)
    for sub in units:
        fully_shard(sub, reshard_after_forward=settings["reshard_after_forward"], **options)
    fully_shard(module, **options)


def _shard_options(mesh: Any, policy: Any, offload: bool) -> dict[str, Any]:
    """`fully_shard`'s keywords shared by every unit."""
    if not offload:
        return {"mesh": mesh, "mp_policy": policy}
    from torch.distributed.fsdp import CPUOffloadPolicy

    return {"mesh": mesh, "mp_policy": policy, "offload_policy": CPUOffloadPolicy()}


#: Fabric's DDP names and the start method each means.
DDP_START: dict[str, Any] = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork", "ddp_notebook": "fork"}
#: HF's default `ddp_timeout` (seconds): torch's default process-group timeout, which Fabric uses too.
DEFAULT_DDP_TIMEOUT = 1800


def ddp_strategy(strategy: Any, args: Any) -> Any:
    """A DDP strategy name (`DDP_START`) as Fabric's `DDPStrategy` with HF's `ddp_*` options
    (`ddp_backend`, `ddp_timeout` in seconds, `ddp_find_unused_parameters`, `ddp_bucket_cap_mb`,
    `ddp_broadcast_buffers`, `ddp_static_graph`); the name itself when none is set (or for
    another strategy)::

        ddp_strategy("ddp", TrainingArguments(ddp_timeout=60, ddp_backend="gloo"))  # DDPStrategy(...)
    """
    if not isinstance(strategy, str) or strategy not in DDP_START:
        return strategy
    model_options = {name: getattr(args, f"ddp_{name}", None) for name in
                     ("find_unused_parameters", "bucket_cap_mb", "broadcast_buffers", "static_graph")}
    model_options = {k: v for k, v in model_options.items() if v is not None}
    backend, timeout = getattr(args, "ddp_backend", None), getattr(args, "ddp_timeout", None)
    if not model_options and backend is None and timeout in (None, DEFAULT_DDP_TIMEOUT):
        return strategy
    import datetime

    from lightning_fabric.strategies import DDPStrategy

    return DDPStrategy(start_method=DDP_START[strategy], process_group_backend=backend,
                       timeout=datetime.timedelta(seconds=timeout or DEFAULT_DDP_TIMEOUT), **model_options)
