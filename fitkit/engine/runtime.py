"""`Runtime`: what outlives one call of a model: the Fabric (launched once per device options),
the module as Fabric set it up, the optimizer, and the processes of spawn strategies.

    runtime = Runtime()
    fabric, wrapped = runtime.setup(module, args)       # launches the Fabric on first use
    optimizer = runtime.optimizer_for("adam", args)    # built once, kept across fits (Keras)
    source = runtime.place(source, pad=True)           # this process's shard, on its device
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fitkit.adapters.optimizers import build_optimizer
from fitkit.adapters.weight_decay import parameter_groups
from fitkit.common.frozen import apply_trainable_flags, trainable_state
from fitkit.common.tensors import to_cpu
from fitkit.config.arguments import TrainingArguments
from fitkit.config.jit_compile import jit_kwargs
from fitkit.engine.checks import CheckMemo
from fitkit.engine.data.loader_parts import evaluation_shard
from fitkit.engine.data.loader_source import LoaderSource
from fitkit.engine.data.rebalance import RebalanceSampler
from fitkit.engine.data.sampling import BlockSampler
from fitkit.engine.data.sources import DataSource, TensorSource
from fitkit.engine.policy import KerasPolicy
from fitkit.engine.run_context import RunContext

_DEVICE_KEYS = ("accelerator", "devices", "strategy", "precision", "num_nodes")


def device_key(args: TrainingArguments) -> tuple:
    """The device options a Fabric was built for: another key needs another Fabric."""
    return tuple(repr(getattr(args, k)) for k in _DEVICE_KEYS)


class Runtime:
    """The Fabric, the set-up module and the optimizer of one `Model`."""

    def __init__(self) -> None:
        self.fabric: Any = None
        self.key: tuple | None = None
        self.wrapped: torch.nn.Module | None = None  # the module as Fabric set it up
        self.wrapped_of: torch.nn.Module | None = None
        self.wrapped_jit: dict[str, Any] | None = None  # the torch.compile keywords it was set up with
        self.optimizer: Any = None  # Fabric's wrapper around the optimizer
        self.scheduler: Any = None  # the last fit's learning-rate scheduler (None: constant rate)
        self.restore_optimizer: dict | None = None  # a state `Model.load` read, for the next optimizer built
        self.example: Any = None  # the first in-memory training input (summary's shapes)
        self.in_child = False  # inside a process a spawn strategy started
        self.checked = CheckMemo()  # in-memory data whose first batch was checked already
        self.batch_stepper: Any = None  # the Stepper `train_on_batch` and its kin keep (engine/on_batch.py)
        self.compiled_trainable: tuple[bool, ...] | None = None  # each parameter's requires_grad at compile
        self._call: RunContext | None = None  # the call under way (`running`); nothing of it outlives the call

    @property
    def call(self) -> RunContext | None:
        """The context of the call under way (None between calls): what the `Model` reaches
        while a call runs (`stop_training`, an overridden step's `module`, `optimizer`)."""
        return self._call

    @property
    def tools(self) -> Any:
        """The step tools of the call under way (`StepTools`), None without overridden steps or
        between calls."""
        return None if self._call is None else self._call.tools

    @contextlib.contextmanager
    def running(self, context: RunContext) -> Iterator[RunContext]:
        """`context` as the call under way, for the block; cleared at the end, also on an error::

            with runtime.running(context):
                loop.train(train, val, resume)
        """
        self._call = context
        try:
            yield context
        finally:
            self._call = None

    def using(self, tools: Any) -> contextlib.AbstractContextManager[RunContext]:
        """A call of one batch (`train_on_batch` and its kin) whose step tools are `tools`."""
        return self.running(RunContext(None, KerasPolicy(), tools=tools))

    def restore_optimizer_from(self, state: dict | None) -> None:
        """`Model.load`: the next optimizer built starts from this saved state (None: fresh)."""
        self.restore_optimizer = state

    def keep_batch_stepper(self, stepper: Any) -> None:
        """The `Stepper` that `train_on_batch` and its kin reuse while nothing it was built on changes."""
        self.batch_stepper = stepper

    def keep(self, *, scheduler: Any) -> None:
        """What a fit leaves for later calls: its learning-rate scheduler (for `Model.save`)."""
        self.scheduler = scheduler

    def keep_example(self, example: Any) -> None:
        """The first training input seen, once (`summary()`'s shapes)."""
        if self.example is None:
            self.example = example

    # -- Fabric, module, optimizer ------------------------------------------------------------
    def launch(self, args: TrainingArguments) -> Any:
        """The Fabric for these device options, created (and launched) once."""
        from fitkit.engine.devices.fabric import build_fabric

        key = device_key(args)
        if self.fabric is None or key != self.key:
            self.fabric, self.key = build_fabric(args), key
            self.wrapped = None
        return self.fabric

    def setup(self, module: torch.nn.Module, args: TrainingArguments) -> tuple[Any, torch.nn.Module]:
        """The Fabric and `module` as set up by it: again only when the module or the resolved
        `jit_compile` changed, so a compiled module (and torch's compiled code) serves every fit."""
        fabric = self.launch(args)
        jit = jit_kwargs(args.jit_compile)
        if self.wrapped is None or self.wrapped_of is not module or self.wrapped_jit != jit:
            before = _parameter_ids(self.wrapped) if self.wrapped_of is module else None
            # Fabric sets the strategy up on the module inside the OptimizedModule, then compiles
            # that again with the same keywords; state_dict and checkpoints see the plain module.
            target = module if jit is None else torch.compile(module, **jit)
            self.wrapped, self.wrapped_of, self.wrapped_jit = fabric.setup_module(target), module, jit
            if before is None or before != _parameter_ids(self.wrapped):
                self.optimizer = None  # only jit_compile changed: the optimizer (and its state) stays
        return fabric, self.wrapped

    def optimizer_for(self, spec: Any, args: TrainingArguments) -> Any:
        """The optimizer over the set-up module: built from `spec` on first use, then kept (its
        state carries over between fits, as Keras); `learning_rate` given again resets the rate."""
        if self.optimizer is None:
            wrapped = self.wrapped
            assert wrapped is not None  # `setup` comes first
            _check_bound_to(spec, wrapped)
            params = parameter_groups(wrapped, spec, args)  # HF's decay groups, when they apply
            opt = build_optimizer(spec, params, args.learning_rate, args.weight_decay, precision=args.precision,
                                  module=wrapped, adam=(args.adam_beta1, args.adam_beta2, args.adam_epsilon))
            saved, self.restore_optimizer = self.restore_optimizer, None
            if saved is not None:  # `Model.load`: continue from the saved optimizer state
                opt.load_state_dict(saved)
            self.optimizer = self.fabric.setup_optimizers(opt)
            if saved is None:
                return self.optimizer
        if args.learning_rate is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = args.learning_rate
                group.pop("initial_lr", None)
        return self.optimizer

    def forget_optimizer(self, module: torch.nn.Module | None = None) -> None:
        """Compiling again starts a fresh optimizer (Keras); the trainable state of `module` (its
        `trainable` flags applied) is what the compile saw (`check_trainable`)."""
        self.optimizer = self.restore_optimizer = self.scheduler = None
        if module is not None:
            apply_trainable_flags(module)
        self.compiled_trainable = trainable_state(module) if module is not None else None

    def check_trainable(self, module: torch.nn.Module, warn: bool = True) -> None:
        """Apply `module`'s `trainable` flags and warn, as Keras 3 does, when parameters were frozen
        or unfrozen since `compile`: the optimizer compiled before goes on at its rate (Keras asks
        for a recompile so the change takes effect). Warns once per compile."""
        apply_trainable_flags(module)
        now = trainable_state(module)
        if warn and self.compiled_trainable is not None and now != self.compiled_trainable:
            changed = sum(a != b for a, b in zip(now, self.compiled_trainable))
            warnings.warn(f"{changed} parameter tensors were frozen or unfrozen (`requires_grad`, `trainable`) since "
                          "`compile`: the optimizer compiled before trains them at its learning rate and with its "
                          "state; call `compile(...)` again before `fit` (a fresh optimizer and the new rate, as Keras "
                          "requires after changing `trainable`)", UserWarning, stacklevel=4)
        self.compiled_trainable = now

    def shared(self) -> Runtime:
        """A runtime on the same (already launched) Fabric, with nothing else but the values
        read from the data's first batches: a search trial's."""
        other = Runtime()
        other.fabric, other.key = self.fabric, self.key
        other.checked = self.checked.sharing()  # the data's first-batch values, read once for all trials
        return other

    def release(self) -> None:
        """Drop the Fabric, the set-up module, the optimizer and the example (after a trial)."""
        Runtime.__init__(self)

    # -- data ---------------------------------------------------------------------------------------
    def place(self, source: DataSource, pad: bool) -> DataSource:
        """This process's share of `source` (`pad`: every process gets as many batches, for
        training; else contiguous blocks, for exact evaluation), on the Fabric's device."""
        fabric = self.fabric
        if isinstance(source, TensorSource):
            if fabric.world_size > 1:
                source.shard(fabric.global_rank, fabric.world_size, pad)
            if fabric.device.type != "cpu":
                source.to(fabric.device)
            if self.example is None:
                self.example = source.x
        elif isinstance(source, LoaderSource) and isinstance(source.loader, torch.utils.data.DataLoader):
            loader, distributed = source.loader, fabric.world_size > 1
            if not distributed and fabric.device.type == "cpu":
                # The batches are already where the model is: Fabric's wrapper would only walk
                # each batch to move it nowhere (about 17 us a step).
                return source
            if distributed and not pad:
                loader = evaluation_shard(loader, fabric.global_rank, fabric.world_size)
            # a block of an evaluation, or rebalanced micro-batches, are this process's share already
            use_sampler = distributed and not isinstance(loader.sampler, BlockSampler) and not isinstance(
                loader.batch_sampler, RebalanceSampler)
            source.loader = fabric.setup_dataloaders(loader, use_distributed_sampler=use_sampler)
            source.distributed = distributed
        return source

    # -- spawn and fork strategies ----------------------------------------------------------------
    def must_spawn(self, args: TrainingArguments) -> bool:
        """True when `args` name a spawn/fork strategy and this is not one of its processes."""
        from fitkit.engine.devices.fabric import is_spawning

        return is_spawning(args) and not self.in_child

    def spawn(self, args: TrainingArguments, child: Callable[..., dict], *payload: Any,
              modules: tuple[torch.nn.Module | None, ...] = ()) -> dict:
        """Run `child(fabric, key, *payload)` in the processes the strategy starts (a module-level
        function, so it pickles); rank 0's return value comes back. `modules` (those inside the
        payload) get memory of their own in each process (`Sealed`)."""
        from fitkit.engine.devices.fabric import build_fabric, run_guarded

        return build_fabric(args).launch(run_guarded, _unsealed, child, device_key(args), Sealed(payload, modules))

    def adopt(self, fabric: Any, key: tuple) -> None:
        """In a spawned process: run on the Fabric that started it."""
        from fitkit.engine.devices.fabric import teardown_at_exit

        self.fabric, self.key, self.wrapped, self.in_child = fabric, key, None, True
        if fabric.world_size > 1:
            teardown_at_exit()  # the process group ends before this process's interpreter does


class Sealed:
    """What a spawn strategy's processes receive, out of sight of Lightning's launcher. The launcher
    walks the dataclasses, mappings and sequences among its arguments to give each module it finds
    memory of its own (torch pickles a tensor for a spawned process into shared memory): it fails on
    a frozen dataclass (a fitkit `TrainingArguments` given as `args=`) and never sees the module
    inside a `Model`, which then stayed shared, every process stepping the same parameters. Here
    `_unsealed` gives `modules` their own memory in each process (data tensors stay shared: only read)."""

    __slots__ = ("modules", "payload")

    def __init__(self, payload: tuple[Any, ...], modules: tuple[torch.nn.Module | None, ...]) -> None:
        self.payload, self.modules = payload, modules


def _unsealed(fabric: Any, child: Callable[..., dict], key: tuple, sealed: Sealed) -> dict:
    """In a spawned process: `sealed`'s modules in memory of their own, then `child(fabric, key, *payload)`."""
    with torch.no_grad():
        for module in sealed.modules:
            for tensor in () if module is None else (*module.parameters(), *module.buffers()):
                if tensor.is_shared():
                    tensor.data = tensor.data.clone()
    return child(fabric, key, *sealed.payload)


def _parameter_ids(module: torch.nn.Module | None) -> list[int] | None:
    return None if module is None else [id(p) for p in module.parameters()]


def _check_bound_to(spec: Any, module: torch.nn.Module) -> None:
    """An optimizer instance must hold this module's parameters, or nothing would train."""
    if not isinstance(spec, torch.optim.Optimizer):
        return
    own = {id(p) for p in module.parameters()}
    given = [p for group in spec.param_groups for p in group["params"]]
    if given and not any(id(p) in own for p in given):
        raise ValueError(
            "`optimizer` is an Optimizer instance built on the parameters of another module, so training would "
            "change nothing: build it on this model's parameters (`torch.optim.SGD(net.parameters(), ...)` with the "
            "`net` given to Model), or pass a name, an Optimizer class or a callable params -> optimizer"
        )


def pack_result(module: torch.nn.Module, value: Any, state: Any) -> dict:
    """What a spawned process sends back: the trained weights, a returned value and the state.
    Tensors travel as bytes: shared-memory handles die with the child process."""
    weights = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    buffer = io.BytesIO()
    torch.save({"weights": weights, "value": to_cpu(value)}, buffer)
    return {"tensors": buffer.getvalue(), "state": dataclasses.asdict(state)}


def unpack_result(result: dict, module: torch.nn.Module) -> tuple[Any, dict]:
    """Load the weights a spawned process sent into `module`; return `(value, state fields)`."""
    tensors = torch.load(io.BytesIO(result["tensors"]), weights_only=True)
    module.load_state_dict(tensors["weights"])
    return tensors["value"], result["state"]
