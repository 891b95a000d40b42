"""How much slower (or faster) is `Model.fit` than the PyTorch loop you would write by hand?

Three contenders train the same network from the same initial weights, on the same data,
for the same number of optimizer steps, single-threaded, in one process:

* raw     - the idiomatic hand-written loop: `DataLoader(TensorDataset(x, y), shuffle=True)`,
            `torch.optim.Adam(lr=1e-3)`, `F.cross_entropy`, `zero_grad / backward / step`;
            the loss is not read per step (once at the end of a run).
* fitkit  - `Model(net).compile("adam", "cross_entropy")` once, then
            `fit(x, y, batch_size=..., epochs=1, verbose=0, shuffle=True)` per run. Everything
            a `fit` call builds (arguments, data source, state, callback handler, loop) is timed.
* fabric  - a plain Lightning Fabric loop (reference): `Fabric(accelerator="cpu", devices=1)`,
            `fabric.setup(module, optimizer)`, `fabric.setup_dataloaders(DataLoader(...))`,
            `fabric.backward(loss)`.

Set-up is not timed (building the nets, the raw optimizer and loaders, the Fabric, `compile`)
and every contender runs once untimed first: fitkit creates and launches its Fabric and its
optimizer on the first `fit`, Adam allocates its state on its first step.

Large tensors make glibc's malloc hand memory back to the OS and fault it in again (heap
trimming); how often depends on the heap's layout, differs from loop to loop and run to run,
and costs up to ~10% of a compute-bound step here. The minor page faults per step are reported
for each contender; `--no-trim` turns trimming off (`mallopt`) to compare the loops alone.

The machine's speed drifts (frequency, other processes), so the contenders are interleaved:
each repetition runs every contender once for `steps` optimizer steps, in an order rotated
from one repetition to the next, and the ratio `contender / raw` is taken within the
repetition. The table reports median seconds per step and the median of those per-repetition
ratios (with their interquartile range). Runs are timed on the wall clock; the process's CPU
time is recorded too, and when it falls well short of the wall time the process was waiting
for a core (a busy machine): the script says so, and `--clock cpu` computes everything from
CPU time instead.

    python benchmarks/overhead.py                     # both workloads, about a minute
    python benchmarks/overhead.py --quick             # smoke check, a few seconds
    python benchmarks/overhead.py --workload tiny --json results.json
    python benchmarks/overhead.py --no-trim           # glibc heap trimming off
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
import warnings
from typing import Callable

# Single thread before torch starts its pools (the env vars cover OpenMP / MKL themselves).
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

try:
    from fitkit import Model  # noqa: E402
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fitkit import Model  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str  # the --workload name
    name: str  # the table's name
    dims: tuple[int, ...]  # layer widths: Linear-ReLU-...-Linear
    batch: int
    steps: int  # optimizer steps per run (= batches in one epoch)
    reps: int  # interleaved repetitions; steps * reps optimizer steps per contender
    target: float  # the fitkit/raw ratio to stay under


WORKLOADS = {
    # 10 x 200 = 2,000 steps per contender; ~0.1 s per run.
    "tiny": Workload("tiny", "tiny", (32, 64, 64, 10), batch=64, steps=200, reps=10, target=1.00),
    # 10 x 30 = 300 steps per contender; ~1 s per run.
    "compute": Workload("compute", "compute-bound", (784, 1024, 1024, 10), batch=256, steps=30, reps=10,
                        target=1.02),
}
QUICK = {"tiny": dict(steps=100, reps=3), "compute": dict(steps=5, reps=3)}

CONTENDERS = ("raw", "fitkit", "fabric")


def mlp(dims: tuple[int, ...]) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        if i:
            layers.append(torch.nn.ReLU())
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers)


def data(w: Workload) -> tuple[torch.Tensor, torch.Tensor]:
    """Exactly `steps` full batches, so one epoch is `steps` optimizer steps for everyone."""
    g = torch.Generator().manual_seed(0)
    n = w.steps * w.batch
    x = torch.randn(n, w.dims[0], generator=g)
    y = torch.randint(0, w.dims[-1], (n,), generator=g)
    return x, y


# -- the contenders: build untimed, return a `run()` that trains one epoch and gives the final loss --


def build_raw(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, w: Workload) -> Callable[[], float]:
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(x, y), batch_size=w.batch, shuffle=True)
    assert len(loader) == w.steps

    def run() -> float:
        net.train()
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            optimizer.step()
        return loss.item()  # the one host read of the run

    return run


def build_fitkit(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, w: Workload) -> Callable[[], float]:
    model = Model(net).compile("adam", "cross_entropy")

    def run() -> float:
        history = model.fit(x, y, batch_size=w.batch, epochs=1, verbose=0, shuffle=True)
        return history.history["loss"][-1]

    run.model = model  # type: ignore[attr-defined]  # to check the step count after a run
    return run


def build_fabric(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, w: Workload) -> Callable[[], float]:
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    fabric.launch()
    module, optimizer = fabric.setup(net, torch.optim.Adam(net.parameters(), lr=1e-3))
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=w.batch, shuffle=True))
    assert len(loader) == w.steps

    def run() -> float:
        module.train()
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(module(xb), yb)
            fabric.backward(loss)
            optimizer.step()
        return loss.item()

    return run


BUILDERS = {"raw": build_raw, "fitkit": build_fitkit, "fabric": build_fabric}


def faults() -> int:
    """Minor page faults of this process so far (0 where `resource` is missing)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def no_trim() -> bool:
    """Keep freed memory in glibc's heap (no trimming, no per-tensor mmap): True when applied."""
    if platform.libc_ver()[0] != "glibc":
        return False
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))


# -- measuring --------------------------------------------------------------------------------


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        v = values[0]
        return v, v, v
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def measure(w: Workload, log: Callable[[str], None], clock: str = "wall") -> dict:
    torch.manual_seed(0)
    initial = mlp(w.dims)
    x, y = data(w)
    runs = {name: BUILDERS[name](copy.deepcopy(initial), x, y, w) for name in CONTENDERS}

    # Warm-up (untimed): fitkit's first fit creates and launches its Fabric, Adam makes its state.
    for name in CONTENDERS:
        runs[name]()
    steps_done = runs["fitkit"].model.state.global_step  # type: ignore[attr-defined]
    if steps_done != w.steps:
        raise RuntimeError(f"fitkit ran {steps_done} optimizer steps per fit, expected {w.steps}")

    wall: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    cpu: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    minflt: dict[str, list[int]] = {name: [] for name in CONTENDERS}
    losses: dict[str, float] = {}
    for rep in range(w.reps):
        k = rep % len(CONTENDERS)
        order = CONTENDERS[k:] + CONTENDERS[:k]  # rotate so no contender always goes first
        for name in order:
            gc.collect()
            f0 = faults()
            c0, t0 = time.process_time(), time.perf_counter()
            losses[name] = runs[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            minflt[name].append(faults() - f0)
        times = wall if clock == "wall" else cpu
        log(f"  {w.name} rep {rep + 1:2d}/{w.reps}: " + "  ".join(
            f"{name} {times[name][-1] / w.steps * 1e6:8.1f} us/step ({minflt[name][-1] / w.steps:5.0f} flt, "
            f"cpu {cpu[name][-1] / wall[name][-1]:4.0%})" for name in CONTENDERS))

    per_step = {name: statistics.median(t) / w.steps for name, t in times.items()}
    ratios = {name: [a / b for a, b in zip(times[name], times["raw"])] for name in ("fitkit", "fabric")}
    result = {
        "workload": w.name,
        "dims": list(w.dims),
        "batch_size": w.batch,
        "steps_per_run": w.steps,
        "reps": w.reps,
        "steps_per_contender": w.steps * w.reps,
        "s_per_step": per_step,
        "clock": clock,
        "run_seconds": wall,
        "run_cpu_seconds": cpu,
        "cpu_share": statistics.median(c / t for name in CONTENDERS for c, t in zip(cpu[name], wall[name])),
        "minor_faults_per_step": {name: statistics.median(f) / w.steps for name, f in minflt.items()},
        "final_loss": losses,
        "target": w.target,
    }
    for name, r in ratios.items():
        q1, med, q3 = quartiles(r)
        result[f"{name}_over_raw"] = {"median": med, "q1": q1, "q3": q3, "min": min(r), "max": max(r), "all": r}
    result["pass"] = result["fitkit_over_raw"]["median"] <= w.target
    return result


# -- reporting ----------------------------------------------------------------------------------


def table(results: list[dict]) -> str:
    head = ["workload", "raw loop (s/step)", "fitkit (s/step)", "fabric (s/step)", "fitkit/raw ratio [IQR]",
            "fabric/raw ratio [IQR]", "target", "result"]
    rows = []
    for r in results:
        fk, fb = r["fitkit_over_raw"], r["fabric_over_raw"]
        rows.append([
            r["workload"],
            f"{r['s_per_step']['raw']:.3e}",
            f"{r['s_per_step']['fitkit']:.3e}",
            f"{r['s_per_step']['fabric']:.3e}",
            f"{fk['median']:.3f} [{fk['q1']:.3f}-{fk['q3']:.3f}]",
            f"{fb['median']:.3f} [{fb['q1']:.3f}-{fb['q3']:.3f}]",
            f"<= {r['target']:.2f}",
            "PASS" if r["pass"] else "over",
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(wd) for c, wd in zip(cells, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (wd + 2) for wd in widths) + "|"
    return "\n".join([line(head), sep, *(line(row) for row in rows)])


def meta(quick: bool) -> dict:
    import lightning_fabric

    import fitkit

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "lightning_fabric": lightning_fabric.__version__,
        "fitkit": getattr(fitkit, "__version__", None),
        "torch_threads": torch.get_num_threads(),
        "quick": quick,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("tiny", "compute", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="fewer and shorter repetitions (a smoke check)")
    parser.add_argument("--reps", type=int, default=None, help="override the number of interleaved repetitions")
    parser.add_argument("--steps", type=int, default=None, help="override the optimizer steps per run")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON to PATH")
    parser.add_argument("--no-trim", action="store_true",
                        help="turn glibc's heap trimming off (mallopt) so page faults do not blur the comparison")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time runs on the wall clock (default) or by the process's CPU time")
    parser.add_argument("--quiet", action="store_true", help="print only the table and its notes")
    opts = parser.parse_args(argv)

    trim_off = no_trim() if opts.no_trim else False
    if opts.no_trim and not trim_off:
        print("--no-trim: not a glibc system (or mallopt failed); running with the default allocator",
              file=sys.stderr)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or inter-op work already started
        pass
    logging.getLogger("lightning_fabric").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="lightning_fabric")

    keys = ("tiny", "compute") if opts.workload == "all" else (opts.workload,)
    workloads = []
    for key in keys:
        w = WORKLOADS[key]
        if opts.quick:
            w = dataclasses.replace(w, **QUICK[key])
        if opts.reps is not None:
            w = dataclasses.replace(w, reps=opts.reps)
        if opts.steps is not None:
            w = dataclasses.replace(w, steps=opts.steps)
        if w.reps < 1 or w.steps < 1:
            parser.error("--reps and --steps must be >= 1")
        workloads.append(w)

    log = (lambda s: None) if opts.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    info = meta(opts.quick)
    info["no_trim"] = trim_off
    info["clock"] = opts.clock
    log(f"torch {info['torch']}, lightning_fabric {info['lightning_fabric']}, "
        f"{info['torch_threads']} thread, {info['processor']}; flt = minor page faults per step")
    started = time.perf_counter()
    results = []
    for w in workloads:
        log(f"{w.name}: MLP {'-'.join(map(str, w.dims))}, batch {w.batch}, {w.reps} reps x {w.steps} steps")
        results.append(measure(w, log, opts.clock))
    info["seconds"] = time.perf_counter() - started

    print(table(results))
    for r in results:
        print(f"{r['workload']}: minor page faults per step: " + ", ".join(
            f"{name} {n:.0f}" for name, n in r["minor_faults_per_step"].items())
            + f"; CPU time / wall time: {r['cpu_share']:.0%}")
        if r["cpu_share"] < 0.95 and opts.clock == "wall":
            print(f"  warning: {r['workload']} got {r['cpu_share']:.1%} of a core (the machine is busy); "
                  "its wall-clock numbers are unreliable: run again when it is idle, or with --clock cpu")
    print(f"(median over interleaved repetitions; ratio < 1 means faster than the raw loop; "
          f"{opts.clock} clock; glibc heap trimming {'off' if info['no_trim'] else 'on'}; "
          f"{info['seconds']:.0f} s in all)")
    if opts.json:
        directory = os.path.dirname(os.path.abspath(opts.json))
        os.makedirs(directory, exist_ok=True)
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump({"meta": info, "results": results}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
