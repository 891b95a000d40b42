"""A Lightning Fabric built from `TrainingArguments` (imported only when a run starts)."""

from __future__ import annotations

import atexit
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from fitkit.common import launch_env
from fitkit.config.arguments import TrainingArguments
from fitkit.config.devices import auto_accelerator, check_devices
from fitkit.engine.devices import early_start
from fitkit.engine.devices.local import local_fabric
from fitkit.engine.devices.quiet import QuietWhenSpawned, import_lightning, quiet_lightning
from fitkit.engine.devices.strategies import (
    SPAWN_STRATEGIES,
    ddp_strategy,
    deepspeed_strategy,
    fsdp2_strategy,
    is_deepspeed,
    single_device_strategy,
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
    """Create and launch a Fabric for these arguments: Lightning's, or `LocalFabric` for a run
    that needs nothing from Lightning (one process, one device, full precision: see
    `fitkit.engine.devices.local`), which then does not import it."""
    check_devices(args)
    local = local_fabric(args)
    if local is not None:
        return local
    accelerator = args.accelerator
    if accelerator == "auto":
        accelerator = _strategy_device(args.strategy) or auto_accelerator()
    launched_here = not _launched_by_cli() and not is_spawning(args)
    started = early_start.start(args, accelerator) if launched_here else None
    try:
        fabric = _fabric(args, accelerator)
        if launched_here:
            if started is not None:
                early_start.adopt(fabric, started)
            launch_env.share_layout(fabric)  # the processes it starts get RANK (accelerate reads it)
            fabric.launch()
    except BaseException:
        if started is not None:  # no process started early outlives a launch that failed
            started.stop()
        raise
    if is_spawning(args):
        fabric.fitkit_quiet = QuietWhenSpawned(args)  # goes with the Fabric into the processes it starts
    if launched_here and fabric.world_size > 1:
        _watch_for_crash()
        _children.extend(getattr(getattr(fabric.strategy, "launcher", None), "procs", None) or ())
        teardown_at_exit()
    return fabric


def _strategy_device(strategy: Any) -> str | None:
    """The device type a ready strategy instance was built for (`SingleDeviceStrategy(device="cpu")`
    on a machine with a GPU runs on the CPU, as its owner asked); None for a name or no device."""
    if isinstance(strategy, str):
        return None
    device = getattr(strategy, "_root_device", None)
    return getattr(device, "type", None) if device is not None else None


def _fabric(args: TrainingArguments, accelerator: str) -> Any:
    """The Fabric itself (not launched)."""
    import_lightning()  # the first import, without the notebook note it makes tqdm print
    from lightning_fabric import Fabric

    strategy, devices = args.strategy, args.devices
    precision = _precision(args, accelerator)
    if strategy == "single_device":
        strategy = single_device_strategy(accelerator, devices)
        devices = 1 if accelerator == "cpu" else [strategy.root_device.index]
    elif is_deepspeed(strategy):
        if accelerator != "cuda":
            raise ValueError(
                f"`strategy`={strategy!r}: DeepSpeed runs only on CUDA GPUs and none is in use here "
                f"(accelerator={accelerator!r}). On CPU use strategy='ddp' (data parallel) or strategy='fsdp' "
                "(sharded parameters, gradients and optimizer state)"
            )
        strategy = deepspeed_strategy(strategy)
    elif strategy == "fsdp":
        strategy = fsdp2_strategy(precision, args.fsdp_wrap, full_checkpoint=args.fsdp_full_checkpoint,
                                  sharding=args.fsdp_sharding, tune_allocator=args.tune_cpu_allocator,
                                  reshard_after_forward=args.fsdp_reshard_after_forward,
                                  cpu_offload=args.fsdp_cpu_offload,
                                  activation_checkpointing=args.fsdp_activation_checkpointing)
        if precision in ("bf16-mixed", "16-mixed"):
            precision = "32-true"  # FSDP2's MixedPrecisionPolicy does the casting
    else:
        strategy = ddp_strategy(strategy, args)  # HF's ddp_* options, when set
    quiet_lightning(args)  # Lightning's banner and notices only when `log_level` asks
    fabric = Fabric(accelerator=accelerator, devices=devices, strategy=strategy, precision=precision,
                    num_nodes=args.num_nodes)
    quiet_lightning(args, fabric.global_rank, fabric.local_rank)  # the ranks, now known
    return fabric


def teardown_at_exit() -> None:
    """Run the exit teardown (`_teardown`) when this process exits; once per process. Called
    where a multi-process run starts: after `fabric.launch()`, and in each process a spawn
    strategy starts (`Runtime.adopt`), which ends through the interpreter's exit as well."""
    global _teardown_registered
    if not _teardown_registered:
        atexit.register(_teardown)
        _teardown_registered = True


_crashed = False
_teardown_registered = False
_children: list = []  # processes Fabric's launcher started from this one
_releases: list = []  # weak methods `_teardown` calls once the process group is destroyed


def _watch_for_crash() -> None:
    """Note an uncaught exception, so the exit teardown does not wait at a barrier for processes
    that are still training (the launcher stops them)."""
    previous = sys.excepthook

    def hook(kind, value, traceback):
        global _crashed
        _crashed = True
        previous(kind, value, traceback)

    sys.excepthook = hook


def run_guarded(fabric: Any, child: Callable[..., Any], *args: Any) -> Any:
    """`child(fabric, *args)` in a process a spawn strategy started: an exception it raises is
    noted as a crash (as `_watch_for_crash` does for a script), so the exit teardown does not
    wait at a barrier for the processes still training; the launcher stops them."""
    global _crashed
    try:
        return child(fabric, *args)
    except BaseException:
        _crashed = True
        raise


def is_spawning(args: TrainingArguments) -> bool:
    """Strategies whose processes are started by `fabric.launch(function)` (spawn or fork)."""
    return isinstance(args.strategy, str) and args.strategy in SPAWN_STRATEGIES


def release_at_exit(release: Callable[[], None]) -> None:
    """Have the exit teardown call `release` (a bound method, held weakly) once the process
    group is destroyed: it drops the caller's references to what holds the group (the module
    and optimizer as Fabric set them up), so that the group ends before the interpreter does."""
    ref = weakref.WeakMethod(release)
    _releases[:] = [r for r in _releases if r() is not None and r != ref] + [ref]  # no dead ones pile up


def _teardown() -> None:
    """End a multi-process run before the interpreter finalizes.

    `destroy_process_group()` only unregisters the group: the DDP module (its reducer) still
    holds it, and with it gloo's two worker threads and its socket thread and, in the process
    that launched the others, the rendezvous store's server thread. Left alone they run on into
    interpreter finalization and are torn down there, in whatever order the module teardown
    frees objects. A thread that needs the GIL then (a gloo worker letting go of the last
    reference to a tensor Python has dropped) is ended by Python 3.11 with `pthread_exit`,
    whose unwinding through torch's noexcept C++ frames calls std::terminate: "terminate called
    without an active exception", exit code -6. So the holders are released here and the group
    is destroyed now, its threads joined, while the interpreter is whole.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if _crashed:
        return  # the others may be mid-collective: a barrier would hang; the launcher cleans up
    group = dist.group.WORLD  # becomes the last reference (see the end)
    try:
        # A plain barrier: in 20-run trials a monitored barrier still let gloo abort now and then.
        # (A sibling that crashed takes the others down through its launcher, so this cannot hang.)
        dist.barrier()
    except Exception:  # noqa: BLE001 - another rank is gone; still release the group
        pass
    finally:
        dist.destroy_process_group()
    # This process hosts the rendezvous store its children talk to: let them exit first, or the
    # store can be torn down under a connected client.
    for proc in _children:
        try:
            proc.wait(timeout=60)
        except Exception:  # noqa: BLE001 - a child that hangs is the launcher's to kill
            pass
    _release_holders()
    # Now the last reference: the group's C++ destructor runs here, with the GIL released by
    # torch's binding, so a gloo thread that still needs the GIL (to let go of a tensor) can
    # finish while the destructor joins it.
    del group


def _release_holders() -> None:
    """Call what `release_at_exit` registered: fitkit's set-up modules and optimizers go."""
    import gc

    for ref in _releases:
        release = ref()
        if release is not None:
            release()
    _releases.clear()
    gc.collect()  # a DDP module sits in reference cycles (its hooks)


def _launched_by_cli() -> bool:
    # `fabric run` sets this; calling launch() there raises.
    return os.environ.get("LT_CLI_USED") == "1"
