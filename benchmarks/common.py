"""Shared pieces of the harness: workloads, data, the interleaved timing loop, statistics, tables.

How a comparison is timed (`compare`): every contender is built once (untimed), runs once
untimed (warm-up: Fabric launches, Adam makes its state, frameworks import lazily) while a
global optimizer hook counts its optimizer steps, which must equal the workload's steps.
Then each repetition runs every contender once, in an order rotated from one repetition to
the next, and divides each run time by the baseline's in that repetition. The machine's
speed drifts (frequency scaling, other processes) by up to 2x over minutes, but it moves the
contenders of one repetition together, so the per-repetition ratio is stable where the
absolute times are not. Tables show the median ratio and its interquartile range.
"""

from __future__ import annotations

import os
import sys

# One CPU thread, set before torch starts its pools (the variables cover OpenMP / MKL); a
# process that imported torch already (a test session) is left alone.
if "torch" not in sys.modules:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import contextlib
import dataclasses
import datetime
import gc
import logging
import platform
import statistics
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def import_fitkit():
    """`fitkit`, from the installed package or from this checkout."""
    try:
        import fitkit
    except ImportError:  # a checkout without `pip install -e .`
        sys.path.insert(0, REPO)
        import fitkit
    return fitkit


# -- workloads -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str  # the command-line name
    name: str  # the table's name
    dims: tuple[int, ...]  # layer widths of a Linear-ReLU-...-Linear MLP
    batch: int
    steps: int  # optimizer steps per run (= batches in one epoch)
    reps: int  # interleaved repetitions: steps * reps optimizer steps per contender
    target: float | None = None  # the fitkit / raw loop (DataLoader) ratio to stay at or under
    slice_target: float | None = None  # the fitkit / slicing loop (the hand-written floor) ratio

    @property
    def label(self) -> str:
        return f"{self.name}: MLP {'-'.join(map(str, self.dims))}, batch {self.batch}"


WORKLOADS = {
    # tiny: 8 x 500 = 4,000 steps per contender, ~0.1-0.2 s a raw-loop run.
    "tiny": Workload("tiny", "tiny", (32, 64, 10), batch=64, steps=500, reps=8, target=0.80, slice_target=0.85),
    # compute-bound: 10 x 30 = 300 steps per contender, ~1 s a run.
    "compute": Workload("compute", "compute-bound", (784, 1024, 1024, 10), batch=256, steps=30, reps=10,
                        target=1.01, slice_target=1.00),
}
QUICK = {"tiny": dict(steps=50, reps=3), "compute": dict(steps=4, reps=3)}


def workload(key: str, quick: bool = False, steps: int | None = None, reps: int | None = None) -> Workload:
    w = WORKLOADS[key]
    if quick:
        w = dataclasses.replace(w, **QUICK[key])
    if steps is not None:
        w = dataclasses.replace(w, steps=steps)
    if reps is not None:
        w = dataclasses.replace(w, reps=reps)
    if w.steps < 1 or w.reps < 1:
        raise ValueError("steps and reps must be >= 1")
    return w


@dataclasses.dataclass(frozen=True)
class Env:
    """Where the contenders train: the device and the precision (Lightning's names)."""

    device: str = "cpu"  # "cpu" or "cuda"
    precision: str = "32-true"  # or "bf16-mixed"

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16-mixed"

    @property
    def label(self) -> str:
        name = "CPU" if self.device == "cpu" else f"CUDA ({torch.cuda.get_device_name(0)})"
        return f"{name}, {self.precision}"

    def autocast(self):
        """The autocast context a hand-written loop would use (a null context in full precision)."""
        if self.bf16:
            return torch.autocast(self.device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self) -> None:
        """Wait for queued device work, so a run's time includes it."""
        if self.device == "cuda":
            torch.cuda.synchronize()


def mlp(dims: Iterable[int]) -> torch.nn.Sequential:
    dims = tuple(dims)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers)


def data(w: Workload, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly `steps` full batches, so one epoch is `steps` optimizer steps for everyone."""
    g = torch.Generator().manual_seed(seed)
    n = w.steps * w.batch
    return torch.randn(n, w.dims[0], generator=g), torch.randint(0, w.dims[-1], (n,), generator=g)


# -- contenders ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Contender:
    """One framework ready to train: `run()` trains one run (an epoch) and returns the final loss.

    `last_steps()` gives the optimizer steps of the last run as the framework itself counts
    them; it is required where the framework does not step a `torch.optim.Optimizer` (Keras),
    since the harness counts steps with torch's global optimizer hook otherwise.
    """

    run: Callable[[], Any]
    last_steps: Callable[[], int] | None = None
    close: Callable[[], None] | None = None
    note: str = ""


class Skip(Exception):
    """A contender that cannot run here (not installed, or no such option); the message says why."""


class StepCounter:
    """Counts `torch.optim.Optimizer.step` calls of every optimizer while active."""

    def __init__(self) -> None:
        self.count = 0
        self._handle = None

    def _hook(self, optimizer, args, kwargs) -> None:
        self.count += 1

    def __enter__(self) -> StepCounter:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def steps_of_run(contender: Contender, env: Env) -> tuple[int, Any]:
    """Run once, counting optimizer steps: the framework's count when it has one, else torch's."""
    with StepCounter() as counter:
        loss = contender.run()
        env.sync()
    steps = contender.last_steps() if contender.last_steps is not None else counter.count
    return steps, loss


# -- timing ----------------------------------------------------------------------------------------


def minor_faults() -> int:
    """Minor page faults of this process so far (0 where `resource` is missing)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def no_trim() -> bool:
    """Keep freed memory in glibc's heap (no trimming, no per-tensor mmap): True when applied.

    With glibc's defaults, large tensors (gradients, Adam temporaries) go back to the OS when
    the top of the heap is free and are faulted in again on the next step; how often depends
    on the heap's layout, so it differs between loops doing the same arithmetic."""
    if platform.libc_ver()[0] != "glibc":
        return False
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summary(values: list[float]) -> dict:
    q1, med, q3 = quartiles(values)
    return {"median": med, "q1": q1, "q3": q3, "min": min(values), "max": max(values), "all": values}


Log = Callable[[str], None]


_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning",
            "lightning.pytorch.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
            "pytorch_lightning.utilities.rank_zero", "transformers", "accelerate", "fitkit", "poutyne")
_quiet = 0  # > 0 inside `quiet()`


@contextlib.contextmanager
def quiet():
    """Silence the info logs and warnings frameworks print at every run; restored on exit (the
    smoke test runs the command line inside a test session)."""
    global _quiet
    levels = {name: logging.getLogger(name).level for name in _LOGGERS}
    env = {k: os.environ.get(k) for k in ("TRANSFORMERS_VERBOSITY", "TQDM_DISABLE")}
    with warnings.catch_warnings():
        for message in (".*does not have many workers.*", ".*GPU available but not used.*"):
            warnings.filterwarnings("ignore", message=message)
        for module in ("lightning_fabric", "lightning", "pytorch_lightning", "transformers", "accelerate", "keras"):
            warnings.filterwarnings("ignore", module=module)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TQDM_DISABLE", "1")
        _quiet += 1
        quiet_loggers()
        try:
            yield
        finally:
            _quiet -= 1
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def quiet_loggers() -> None:
    """Inside `quiet()`: set the frameworks' loggers to errors only (again after an import that
    sets them, as Lightning's does)."""
    if _quiet:
        for name in _LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


def single_thread() -> None:
    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set, or inter-op work already started
        torch.set_num_interop_threads(1)


def compare(
    builders: dict[str, Callable[[], Contender]],
    *,
    steps: int,
    reps: int,
    env: Env = Env(),
    baseline: str = "raw",
    clock: str = "wall",
    log: Log = lambda s: None,
    label: str = "",
    required: Iterable[str] = ("raw", "fitkit"),
    expected: dict[str, int] | None = None,
) -> dict:
    """Build, verify and time `builders` in interleaved repetitions; return the figures.

    A contender whose build raises `Skip` is skipped with its reason; one that fails otherwise
    is skipped with the error unless it is `required` (then the error propagates). Each must
    run exactly `steps` optimizer steps per run (`expected[name]` where given), checked on
    the warm-up run. Seconds per step divide by `steps` for every contender.

    Objects alive after the warm-ups are frozen out of the garbage collector (`gc.freeze`):
    several frameworks imported into one process make a heap far larger than any one of them
    makes alone, and a framework that runs a full collection per fit (accelerate's
    `free_memory`) would pay for the others' objects.
    """
    expected = expected or {}
    required = set(required)
    contenders: dict[str, Contender] = {}
    skipped: dict[str, str] = {}
    steps_seen: dict[str, int] = {}
    losses: dict[str, float] = {}
    for name, build in builders.items():
        try:
            c = build()
            n, loss = steps_of_run(c, env)  # the warm-up, counted
        except Skip as why:
            skipped[name] = str(why)
            log(f"  {label}: skipping {name}: {why}")
            continue
        except Exception as err:
            if name in required:
                raise
            skipped[name] = f"failed: {type(err).__name__}: {err}"
            log(f"  {label}: skipping {name}: {skipped[name]}")
            continue
        if n != expected.get(name, steps):
            raise RuntimeError(f"{label}: {name} ran {n} optimizer steps per run, expected {expected.get(name, steps)}")
        steps_seen[name] = n
        losses[name] = _float(loss)
        contenders[name] = c
    if baseline not in contenders:
        raise RuntimeError(f"{label}: the baseline {baseline!r} did not run")

    names = list(contenders)
    gc.collect()
    gc.freeze()
    try:
        wall, cpu, faults = _timed_reps(contenders, steps, reps, env, clock, log, label, expected)
    finally:
        gc.unfreeze()
        for c in contenders.values():
            if c.close is not None:
                with contextlib.suppress(Exception):
                    c.close()

    times = wall if clock == "wall" else cpu
    result = {
        "label": label,
        "env": dataclasses.asdict(env),
        "steps_per_run": steps,
        "reps": reps,
        "clock": clock,
        "baseline": baseline,
        "contenders": names,
        "skipped": skipped,
        "steps_verified": steps_seen,
        "s_per_step": {n: statistics.median(times[n]) / expected.get(n, steps) for n in names},
        "run_seconds": wall,
        "run_cpu_seconds": cpu,
        "cpu_share": statistics.median(c / t for n in names for c, t in zip(cpu[n], wall[n]) if t > 0),
        "minor_faults_per_step": {n: statistics.median(f) / expected.get(n, steps) for n, f in faults.items()},
        "warmup_loss": losses,
        "notes": {n: contenders[n].note for n in names if contenders[n].note},
    }
    result["ratio"] = {n: summary([a / b for a, b in zip(times[n], times[baseline])]) for n in names}
    return result


def _timed_reps(contenders: dict[str, Contender], steps: int, reps: int, env: Env, clock: str, log: Log,
                label: str, expected: dict[str, int]):
    names = list(contenders)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    faults: dict[str, list[int]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:  # rotated, so no contender always goes first
            gc.collect()
            env.sync()
            f0 = minor_faults()
            c0, t0 = time.process_time(), time.perf_counter()
            contenders[name].run()
            env.sync()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            faults[name].append(minor_faults() - f0)
        times = wall if clock == "wall" else cpu
        log(f"  {label} rep {rep + 1}/{reps} (us/step): " + "  ".join(
            f"{n} {times[n][-1] / expected.get(n, steps) * 1e6:.0f}" for n in names))
    return wall, cpu, faults


def ratio(result: dict, a: str, b: str) -> dict:
    """Per-repetition ratio a / b of two contenders of one comparison."""
    times = result["run_seconds"] if result["clock"] == "wall" else result["run_cpu_seconds"]
    return summary([x / y for x, y in zip(times[a], times[b])])


def marginal_ratios(result: dict, names: Iterable[str], steps: int, baseline: str = "raw") -> dict:
    """Per-step figures from runs of `steps` steps (`name`) and of one step (`name@1`).

    Per repetition, `t(steps) - t(1)` is what `steps - 1` steps cost with the fixed cost of a
    call taken out; divided by the baseline's, it is the per-step ratio. The fixed cost of a
    call is `t(1) - (t(steps) - t(1)) / (steps - 1)`. Returns `{"step_ratio", "fixed_seconds",
    "marginal_s_per_step"}`, each by name (names without one-step runs are left out).
    """
    times = result["run_seconds"] if result["clock"] == "wall" else result["run_cpu_seconds"]
    out: dict[str, dict] = {"step_ratio": {}, "fixed_seconds": {}, "marginal_s_per_step": {}}
    if f"{baseline}@1" not in times:
        return out
    base = [t - t1 for t, t1 in zip(times[baseline], times[f"{baseline}@1"])]
    for n in names:
        if n not in times or f"{n}@1" not in times:
            continue
        extra = [t - t1 for t, t1 in zip(times[n], times[f"{n}@1"])]
        out["step_ratio"][n] = summary([e / b for e, b in zip(extra, base)])
        out["marginal_s_per_step"][n] = statistics.median(extra) / (steps - 1)
        out["fixed_seconds"][n] = statistics.median(t1 - e / (steps - 1) for t1, e in zip(times[f"{n}@1"], extra))
    return out


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


# -- tables ------------------------------------------------------------------------------------------


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


def fmt_ratio(r: dict, iqr: bool = False, digits: int = 2) -> str:
    text = f"{r['median']:.{digits}f}"
    return f"{text} [{r['q1']:.{digits}f}-{r['q3']:.{digits}f}]" if iqr else text


def verdict(r: dict, target: float) -> str:
    """PASS: the median is at or under the target; over: even the lower quartile is above it;
    borderline: the median is above but the interquartile range reaches the target (rerun
    with more repetitions before concluding)."""
    if r["median"] <= target:
        return "PASS"
    return "over" if r["q1"] > target else "borderline"


def verdict_below(r: dict, target: float) -> str:
    """For "measurably under the target": PASS when even the upper quartile is under it;
    within noise when the median is under but the interquartile range reaches it; over when
    the median is at or above it."""
    if r["q3"] < target:
        return "PASS"
    return "within noise" if r["median"] < target else "over"


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def meta() -> dict:
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    from importlib import metadata

    for dist in ("fitkit", "lightning-fabric", "lightning", "transformers", "accelerate", "keras", "poutyne",
                 "pytorch-accelerated", "matplotlib"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
