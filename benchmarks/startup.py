"""Start-up costs, measured in fresh processes (nothing cached in the interpreter).

* import time: `python -c "import torch"` against `import torch, fitkit`, `from fitkit import
  Model` and (for reference) `import torch, lightning_fabric`, as whole-process wall and CPU
  times (interpreter start and exit included) and, inside the process, the `perf_counter`
  time of the import statements alone. Interleaved, median of `reps` processes each.
* time to the first optimizer step: from just before the parent starts the child process to
  the moment the child's first optimizer step returns (torch's global optimizer hook; Keras:
  the first `on_train_batch_end`), for the raw loop, a plain Fabric loop, fitkit and each
  installed peer, training the tiny workload's network. The child then exits at once. Also
  the child's CPU time up to that moment (`time.process_time()`, from the process's start).

Wall times include waiting for a core and for the disk; on a busy machine compare the CPU
times (`--clock cpu` makes them the figures the targets are checked on).

Run alone: `python -m benchmarks.startup [--reps N]`; a child: `python -m benchmarks.startup --child NAME`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Only the standard library at module level: the children import this module before timing.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

IMPORTS = {
    "torch": "import torch",
    "torch + fitkit": "import torch; import fitkit",
    "from fitkit import Model": "import torch; from fitkit import Model",
    "torch + lightning_fabric": "import torch; import lightning_fabric",
}

_IMPORT_CHILD = """
import time, json
t0 = time.perf_counter()
{first}
t1 = time.perf_counter()
{rest}
t2 = time.perf_counter()
print(json.dumps({{"torch": t1 - t0, "rest": t2 - t1}}))
"""


def _child_env() -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
    env.setdefault("KERAS_BACKEND", "torch")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONWARNINGS"] = "ignore"
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return env


def _children_cpu() -> float:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return float("nan")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _medians(wall: dict, cpu: dict, clock: str) -> tuple[dict, dict, dict]:
    """Medians per contender of wall and CPU seconds, and the ones `clock` picks."""
    med = {n: statistics.median(v) for n, v in wall.items()}
    med_cpu = {n: statistics.median(v) for n, v in cpu.items()}
    return med, med_cpu, med if clock == "wall" else med_cpu


def import_times(reps: int = 7, log=lambda s: None, clock: str = "wall") -> dict:
    """Whole-process and in-process import times; the `fitkit` figures are differences to `torch`."""
    env = _child_env()
    wall: dict[str, list[float]] = {k: [] for k in IMPORTS}
    cpu: dict[str, list[float]] = {k: [] for k in IMPORTS}
    inner: dict[str, list[float]] = {k: [] for k in IMPORTS}
    names = list(IMPORTS)
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            first, _, rest = IMPORTS[name].partition("; ")
            code = _IMPORT_CHILD.format(first=first, rest=rest or "pass")
            c0, t0 = _children_cpu(), time.perf_counter()
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(_children_cpu() - c0)
            if out.returncode:
                raise RuntimeError(f"import child {name!r} failed:\n{out.stderr[-2000:]}")
            inner[name].append(json.loads(out.stdout.strip().splitlines()[-1])["rest"])
        log(f"  imports rep {rep + 1}/{reps} (wall / cpu): " + "  ".join(
            f"{n} {wall[n][-1]:.2f}/{cpu[n][-1]:.2f}s" for n in names))
    med, med_cpu, chosen = _medians(wall, cpu, clock)
    return {
        "reps": reps,
        "clock": clock,
        "process_seconds": med,
        "process_cpu_seconds": med_cpu,
        "process_runs": wall,
        "process_cpu_runs": cpu,
        "added_to_torch_process": {n: chosen[n] - chosen["torch"] for n in names if n != "torch"},
        "import_statement_seconds": {n: statistics.median(v) for n, v in inner.items() if n != "torch"},
        "target_added_seconds": 0.1,
    }


# -- time to the first optimizer step ------------------------------------------------------------------

FIRST_STEP = ("raw", "fabric", "fitkit", "poutyne", "accelerated", "lightning", "hf", "keras")


def first_step_times(names=FIRST_STEP, reps: int = 5, log=lambda s: None, timeout: float = 300,
                     clock: str = "wall") -> dict:
    env = _child_env()
    from benchmarks.peers import unavailable

    names = list(names)
    skipped = {}
    for n in list(names):
        why = unavailable(n) if n not in ("raw", "fitkit") else None
        if why:
            skipped[n] = why
            names.remove(n)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    imported: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            if name in skipped:
                continue
            t0 = time.time()
            out = subprocess.run([sys.executable, "-m", "benchmarks.startup", "--child", name], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            if out.returncode or not lines:
                if name in ("raw", "fitkit", "fabric"):
                    raise RuntimeError(f"first-step child {name!r} failed:\n{out.stderr[-3000:]}")
                skipped[name] = f"failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
                del seconds[name], imported[name], cpu[name]
                continue
            marks = json.loads(lines[-1])
            seconds[name].append(marks["first_step"] - t0)
            cpu[name].append(marks["cpu"])
            imported[name].append(marks["imported"] - t0)
        log(f"  first step rep {rep + 1}/{reps} (wall / cpu): " + "  ".join(
            f"{n} {v[-1]:.2f}/{cpu[n][-1]:.2f}s" for n, v in seconds.items()))
    med, med_cpu, chosen = _medians(seconds, cpu, clock)
    return {
        "reps": reps,
        "clock": clock,
        "seconds": med,
        "cpu_seconds": med_cpu,
        "runs": seconds,
        "cpu_runs": cpu,
        "imported_seconds": {n: statistics.median(v) for n, v in imported.items()},
        "skipped": skipped,
        "fitkit_over_fabric": chosen["fitkit"] / chosen["fabric"] if "fabric" in chosen else None,
        # per repetition (the processes of one repetition ran back to back), as the in-process ratios
        "fitkit_over_fabric_per_rep": _per_rep_ratio(seconds if clock == "wall" else cpu, "fitkit", "fabric"),
    }


def _per_rep_ratio(runs: dict, a: str, b: str) -> dict | None:
    if a not in runs or b not in runs or not runs[a]:
        return None
    from benchmarks.common import summary

    return summary([x / y for x, y in zip(runs[a], runs[b])])


def _child(name: str) -> None:
    """Train the tiny network until its first optimizer step, print the marks, exit at once."""
    import time as _time

    def done(*_args, **_kwargs):
        print(json.dumps({"first_step": _time.time(), "cpu": _time.process_time(), "imported": marks["imported"]}),
              flush=True)
        os._exit(0)

    marks = {}
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    if name == "keras":
        import keras
    elif name == "fitkit":
        from fitkit import Model
    elif name == "fabric":
        from lightning_fabric import Fabric
    elif name == "lightning":
        try:
            import lightning.pytorch  # noqa: F401 - the import is what is timed
        except ImportError:
            pass
    elif name == "hf":
        pass
    elif name == "poutyne":
        pass
    elif name == "accelerated":
        pass
    marks["imported"] = _time.time()

    torch.manual_seed(0)
    dims, batch = (32, 64, 10), 64
    net = torch.nn.Sequential(torch.nn.Linear(dims[0], dims[1]), torch.nn.ReLU(), torch.nn.Linear(dims[1], dims[2]))
    x, y = torch.randn(20 * batch, dims[0]), torch.randint(0, dims[-1], (20 * batch,))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(done)
    if name == "raw":
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True):
            optimizer.zero_grad()
            F.cross_entropy(net(xb), yb).backward()
            optimizer.step()
    elif name == "fabric":
        fabric = Fabric(accelerator="cpu", devices=1)
        fabric.launch()
        module, optimizer = fabric.setup(net, torch.optim.Adam(net.parameters(), lr=1e-3))
        for xb, yb in fabric.setup_dataloaders(DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)):
            optimizer.zero_grad()
            fabric.backward(F.cross_entropy(module(xb), yb))
            optimizer.step()
    elif name == "fitkit":
        Model(net).compile("adam", "cross_entropy", accelerator="cpu").fit(x, y, batch_size=batch, verbose=0)
    else:
        from benchmarks.common import Env, Workload
        from benchmarks.peers import BUILDERS

        if name == "keras":
            class First(keras.callbacks.Callback):
                def on_train_batch_end(self, batch, logs=None):
                    done()

            w = Workload("startup", "startup", dims, batch=batch, steps=20, reps=1)
            contender = BUILDERS[name](net, x, y, w, Env())
            _first_keras_fit(contender, First())
        else:
            w = Workload("startup", "startup", dims, batch=batch, steps=20, reps=1)
            BUILDERS[name](net, x, y, w, Env()).run()
    raise SystemExit(f"{name}: no optimizer step was seen")


def _first_keras_fit(contender, callback) -> None:
    """Run a Keras contender with `callback` added to its fit (the adapter keeps the model private)."""
    import keras

    original = keras.Model.fit

    def fit(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), callback]
        return original(self, *args, **kwargs)

    keras.Model.fit = fit
    contender.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    opts = parser.parse_args(argv)
    if opts.child:
        _child(opts.child)
        return 1
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    print(json.dumps({"imports": import_times(opts.reps, log, opts.clock),
                      "first_step": first_step_times(reps=opts.reps, log=log, clock=opts.clock)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
