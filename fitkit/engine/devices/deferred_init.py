"""Building a module for FSDP without any process holding it whole: `model_init` runs on the meta
device, and each parameter is later initialized full-size one layer at a time, by the module's own
`reset_parameters`, from the random state an eager build had at that point; each process keeps
only its shard. The values equal an eager (unsharded) build from the same seed, bit for bit::

    module = build_on_meta(model_init)          # meta parameters; the init calls are recorded
    fully_shard(module, mesh=mesh)              # FSDP2 shards the meta parameters
    materialize_shards(module, device)          # one layer at a time: init full-size, keep the shard

How: while `model_init` runs, every `reset_parameters` (and `_reset_parameters`, torch's
attention) called on a module with meta tensors runs for real on full-size temporaries of that
module's tensors, to advance the random generator exactly as the eager build would, then drops
them; the call and the generator state before it are recorded. `materialize_shards` replays the
calls in order from those states. Peak extra memory: the largest module one such call covers.

A build this cannot reproduce returns None from `build_on_meta` (the caller builds eagerly, as
before): a parameter or buffer no recorded call covers (e.g. `nn.Parameter(torch.zeros(3))`
in `__init__`, a buffer computed in `__init__`), a tensor written in place outside
`reset_parameters` (e.g. `load_state_dict`, a Hugging Face `_init_weights`), or a build that
raises on the meta device (Hugging Face's `from_pretrained`; `fitkit.engine.devices.load_once`
builds such a module in one process instead).
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: The method names whose calls are recorded and replayed (torch's attention uses the private one).
RESET_NAMES = ("reset_parameters", "_reset_parameters")
#: In-place methods that change no tensor values.
_HARMLESS = frozenset({"requires_grad_", "share_memory_", "retain_grad", "__set__", "__get__"})


@dataclasses.dataclass
class _Call:
    """One recorded outermost `reset_parameters` call: the module, the unbound method, its
    arguments, the CPU generator state before it, and the tensors it covers (owner, kind, name)."""

    module: torch.nn.Module
    method: Callable[..., Any]
    args: tuple
    kwargs: dict
    rng: torch.Tensor
    tensors: list[tuple[torch.nn.Module, str, str]]


@dataclasses.dataclass
class _Record:
    calls: list[_Call] = dataclasses.field(default_factory=list)
    depth: int = 0
    stray: str | None = None  # the first in-place write to a meta tensor outside a recorded call
    covered: set[tuple[int, str, str]] = dataclasses.field(default_factory=set)

    def written(self, swap: _Swap) -> list[tuple[torch.nn.Module, str, str]]:
        """The tensors a call (run on NaN-filled temporaries) set whole. One it set in part,
        after an earlier call had set it, needs values a replay does not keep: a stray write."""
        out = []
        for (owner, kind, name), full in zip(swap.tensors, swap.full):
            untouched = torch.isnan(full) if full.is_floating_point() else torch.zeros((), dtype=torch.bool, device="cpu")
            key = (id(owner), kind, name)
            if bool(untouched.all()) and full.numel():
                continue
            if bool(untouched.any()) and key in self.covered and self.stray is None:
                self.stray = f"{type(owner).__name__}.{name} (in part, after an earlier reset_parameters)"
            self.covered.add(key)
            out.append((owner, kind, name))
        return out


_RECORDS: weakref.WeakKeyDictionary[torch.nn.Module, _Record] = weakref.WeakKeyDictionary()
_active: _Record | None = None


def _meta_tensors(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, str]]:
    """(owner, "_parameters" or "_buffers", name) of every meta tensor under `module`."""
    out = []
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            for name, t in getattr(owner, kind).items():
                if t is not None and t.is_meta:
                    out.append((owner, kind, name))
    return out


@dataclasses.dataclass
class _Swap:
    """Full-size CPU tensors put in place of a module's tensors for one call, then put back."""

    tensors: list[tuple[torch.nn.Module, str, str]]
    fill: float | None = None  # the temporaries' value before the call (NaN: to see what it wrote)
    shapes: list[torch.Tensor] = dataclasses.field(default_factory=list)  # what was there before
    full: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def __enter__(self) -> _Swap:
        for owner, kind, name in self.tensors:
            old = getattr(owner, kind)[name]
            full = torch.empty(old.shape, dtype=old.dtype, device="cpu")
            if self.fill is not None and full.is_floating_point():
                full.fill_(self.fill)
            if kind == "_parameters":
                full = torch.nn.Parameter(full, requires_grad=old.requires_grad)
            getattr(owner, kind)[name] = full
            self.shapes.append(old)
            self.full.append(full)
        return self

    def __exit__(self, *exc: Any) -> None:
        for (owner, kind, name), old in zip(self.tensors, self.shapes):
            getattr(owner, kind)[name] = old


def _recording(original: Callable[..., Any]) -> Callable[..., Any]:
    def reset(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        record = _active
        tensors = _meta_tensors(self) if record is not None and record.depth == 0 else []
        if record is None or not tensors:
            return original(self, *args, **kwargs)
        call = _Call(self, original, args, kwargs, torch.random.get_rng_state(), tensors)
        record.depth += 1
        try:  # for real, on full-size temporaries: the generator advances as in an eager build
            with _Swap(tensors, fill=float("nan")) as swap, torch.device("cpu"), torch.no_grad():
                result = original(self, *args, **kwargs)
        finally:
            record.depth -= 1
        call.tensors = record.written(swap)
        record.calls.append(call)
        return result

    reset.__wrapped__ = original  # type: ignore[attr-defined]
    return reset


def _module_classes() -> Iterator[type]:
    """Every subclass of `nn.Module` defined so far (those `model_init` can build)."""
    seen: set[type] = set()
    todo: list[type] = [torch.nn.Module]
    while todo:
        cls = todo.pop()
        subs: list[type] = cls.__subclasses__()
        for sub in subs:
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                yield sub


class _StrayWrites(TorchFunctionMode):
    """Notes an in-place write to a meta tensor made outside a recorded call: a value the replay
    would not reproduce."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        record = _active
        name = getattr(func, "__name__", "")
        if (record is not None and record.depth == 0 and record.stray is None and name not in _HARMLESS
                and (name.endswith("_") and not name.endswith("__") or name == "__setitem__")
                and args and isinstance(args[0], torch.Tensor) and args[0].is_meta):
            record.stray = name
        return func(*args, **(kwargs or {}))


def build_on_meta(build: Callable[[], Any], context: Any = None) -> torch.nn.Module | None:
    """Run `build` (a `model_init`) with its tensors on the meta device (inside `context`, e.g.
    Fabric's `init_module(empty_init=True)`; default `torch.device("meta")`), recording its
    `reset_parameters` calls; the module, or None when a replay could not reproduce its values
    (see the module docstring), with the random state restored to what it was before."""
    global _active
    if _active is not None:
        raise RuntimeError("build_on_meta is already running (a model_init that builds another model on meta)")
    rng = torch.random.get_rng_state()
    record = _Record()
    patched: list[tuple[type, str, Any]] = []
    for cls in _module_classes():
        for name in RESET_NAMES:
            original = cls.__dict__.get(name)
            if callable(original) and not isinstance(original, (staticmethod, classmethod)):
                patched.append((cls, name, original))
                setattr(cls, name, _recording(original))
    _active = record
    failed: str | None = None
    try:
        with context if context is not None else torch.device("meta"), _StrayWrites():
            module = build()
    except Exception as error:  # noqa: BLE001 - e.g. from_pretrained refuses the meta device: built whole
        module, failed = None, f"it failed on the meta device ({type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]})"
    finally:
        _active = None
        for cls, name, original in patched:
            setattr(cls, name, original)
    why = failed or ("model_init returned no nn.Module" if not isinstance(module, torch.nn.Module)
                     else _cannot_replay(module, record))
    if why is not None:
        if isinstance(module, torch.nn.Module) or failed:
            warnings.warn(f"strategy='fsdp': `model_init` builds the whole module in every process, because {why}: "
                          "give each module with parameters or buffers a reset_parameters() that sets all of them, "
                          "or (pretrained weights) pass fsdp_load_once=True to build it in one process",
                          UserWarning, stacklevel=3)
        torch.random.set_rng_state(rng)
        return None
    _RECORDS[module] = record
    return module


def _cannot_replay(module: torch.nn.Module, record: _Record) -> str | None:
    if record.stray is not None:
        return f"`{record.stray}` wrote into a tensor outside reset_parameters()"
    for owner, kind, name in _meta_tensors(module):
        if (id(owner), kind, name) not in record.covered:
            return f"{type(owner).__name__}.{name} is set by no reset_parameters()"
    if not any(True for _ in _meta_tensors(module)):
        return "model_init made no tensor on the meta device"
    return None


def is_deferred(module: torch.nn.Module) -> bool:
    """Whether `module` was built by `build_on_meta` and awaits `materialize_shards`."""
    return module in _RECORDS


def materialize_shards(module: torch.nn.Module, device: torch.device) -> bool:
    """Give a meta-built module (after `fully_shard`) real tensors on `device`: each recorded call
    replayed on full-size CPU temporaries from its recorded random state, and each process keeps
    its shard of every parameter (`distribute_tensor(..., src_data_rank=None)`: a local slice, no
    communication). False (nothing done) for a module `build_on_meta` did not build."""
    record = _RECORDS.pop(module, None)
    if record is None:
        return False
    module.to_empty(device=device)
    rng = torch.random.get_rng_state()
    try:
        for call in record.calls:
            _replay(call)
    finally:
        torch.random.set_rng_state(rng)
    return True


def _replay(call: _Call) -> None:
    """One recorded call on full-size temporaries, from its random state; each tensor it set
    gets its local part (its temporaries are freed on return: one layer at a time)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    torch.random.set_rng_state(call.rng)
    with _Swap(call.tensors) as swap, torch.device("cpu"), torch.no_grad():
        call.method(call.module, *call.args, **call.kwargs)
    with torch.no_grad():
        for target, full in zip(swap.shapes, swap.full):
            if isinstance(target, DTensor):
                shard = distribute_tensor(full.detach(), target.device_mesh, target.placements, src_data_rank=None)
                target.to_local().copy_(shard.to_local())
            else:
                target.copy_(full)
