"""Peak host memory per process of an FSDP fit on CPU (`strategy="fsdp"`, gloo), against the
sharded ideal, and the weights after the first step against an unsharded step from the same seed.

For each number of processes and optimizer, two launches of the same script (one optimizer
step, module from `model_init`): the big MLP and a tiny one. Per process: `ru_maxrss` after the
module is set up (before the first step: what building and initializing it cost) and at the
end. The ideal of a process is what a process of the tiny launch peaked at, plus the weights,
gradients and optimizer state divided by the processes (SGD: none; Adam: two moments)::

    ideal = tiny + (weights + gradients + optimizer state) / processes
    setup ideal = tiny setup + weights / processes          # no process holds the whole module

The goal (issue 37): the peak within 10% of the ideal, and the set-up peak well under what the
whole module would add. Each process also saves its shard of the weights after the step; a
separate process makes one unsharded step from the same seed on the same global batch and
compares them shard by shard (the largest difference is printed: only the order of the
gradient sums differs).

    python -m benchmarks.fsdp_memory                       # 134M parameters (512 MiB), 2 and 4 processes, SGD and Adam
    python -m benchmarks.fsdp_memory --width 256 --layers 2 --procs 2 --optimizers sgd   # a quick look

Linux (ru_maxrss in KiB). One launch at a time: at 4 processes with Adam the big model needs about
4 x 1.2 GiB, and the reference step 2.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2 ** 20
GLOBAL_BATCH = 16
TINY = (8, 2)  # width and layers of the baseline launch
#: Optimizer state per parameter, in parameter sizes (fitkit's "sgd" is Keras' SGD: no momentum).
STATE = {"sgd": 0, "adam": 2}


def mlp(width: int, layers: int) -> Any:
    import torch

    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks[:-1])


def batch(width: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, width, generator=g), torch.randn(GLOBAL_BATCH, width, generator=g)


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(opts: argparse.Namespace) -> None:
    """One rank of a launch (Fabric's launcher runs this script again in each process)."""
    import torch

    from fitkit import Model, TrainerCallback

    torch.set_num_threads(1)
    setup: list[float] = []

    class AtSetup(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            setup.append(_maxrss_mib())

    built = {"module": mlp(opts.width, opts.layers)} if opts.eager else {"model_init": lambda: mlp(opts.width, opts.layers)}
    model = Model(**built).compile(
        opts.optimizer, "mse", learning_rate=0.01, strategy="fsdp", devices=opts.procs, accelerator="cpu")
    x, y = batch(opts.width)
    model.fit(x, y, batch_size=GLOBAL_BATCH // opts.procs, shuffle=False, max_steps=1, verbose=0,
              callbacks=[AtSetup()], tune_cpu_allocator=bool(opts.tune_cpu_allocator))
    peak = _maxrss_mib()
    rank = model.fabric.global_rank
    if opts.shards:
        torch.save({n: p.to_local().detach().clone() for n, p in model.module.named_parameters()},
                   os.path.join(opts.results, f"shard-{rank}.pt"))
    with open(os.path.join(opts.results, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "setup_mib": setup[0], "peak_mib": peak}, f)


def reference(opts: argparse.Namespace) -> None:
    """One unsharded step from the same seed on the same global batch; the largest difference to
    the shards the launch saved, per parameter (printed as JSON)."""
    import torch

    from fitkit.adapters.optimizers import build_optimizer

    torch.set_num_threads(2)
    net = mlp(opts.width, opts.layers)
    x, y = batch(opts.width)
    optimizer = build_optimizer(opts.optimizer, net.parameters(), 0.01, None)
    torch.nn.functional.mse_loss(net(x), y).backward()
    optimizer.step()
    worst = 0.0
    shards = [torch.load(os.path.join(opts.results, f"shard-{r}.pt"), weights_only=True) for r in range(opts.procs)]
    for name, p in net.named_parameters():
        for part, shard in zip(torch.chunk(p.detach(), opts.procs), (s[name] for s in shards)):
            worst = max(worst, float((part - shard).abs().max()) if part.numel() else 0.0)
    print(json.dumps({"max_abs_difference": worst}))


def _run(opts: argparse.Namespace, procs: int, optimizer: str, width: int, layers: int, shards: bool,
         env: dict[str, str] | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as results:
        common = ["--procs", str(procs), "--optimizer", optimizer, "--width", str(width), "--layers", str(layers),
                  "--results", results, "--tune-cpu-allocator", str(opts.tune_cpu_allocator),
                  *(["--eager"] if getattr(opts, "eager", False) else [])]
        env = dict(env or os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", *common,
                               *(["--shards"] if shards else [])], capture_output=True, text=True, env=env,
                              timeout=opts.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the launch failed:\n{proc.stdout}{proc.stderr}")
        ranks = []
        for r in range(procs):
            with open(os.path.join(results, f"rank-{r}.json")) as f:
                ranks.append(json.load(f))
        out: dict[str, Any] = {"setup_mib": [r["setup_mib"] for r in ranks], "peak_mib": [r["peak_mib"] for r in ranks]}
        if shards:
            ref = subprocess.run([sys.executable, os.path.abspath(__file__), "--reference", *common],
                                 capture_output=True, text=True, env=env, timeout=opts.timeout)
            if ref.returncode != 0:
                raise RuntimeError(f"the reference step failed:\n{ref.stdout}{ref.stderr}")
            out.update(json.loads(ref.stdout.strip().splitlines()[-1]))
        return out


def measure(opts: argparse.Namespace, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every (processes, optimizer) row: measured peaks against the ideal."""
    weights = opts.layers * (opts.width * opts.width + opts.width) * 4 / MIB
    rows = []
    for procs in opts.procs:
        for optimizer in opts.optimizers:
            big = _run(opts, procs, optimizer, opts.width, opts.layers, True, env)
            small = (opts.width, opts.layers) == TINY  # its own baseline (the smoke test's)
            tiny = big if small else _run(opts, procs, optimizer, *TINY, False, env)
            sharded = weights * (2 + STATE[optimizer]) / procs
            ideal = max(tiny["peak_mib"]) + sharded
            setup_ideal = max(tiny["setup_mib"]) + weights / procs
            rows.append({"procs": procs, "optimizer": optimizer, "weights_mib": weights, "peak_mib": max(big["peak_mib"]),
                         "ideal_mib": ideal, "over_ideal": max(big["peak_mib"]) / ideal - 1,
                         "setup_mib": max(big["setup_mib"]), "setup_ideal_mib": setup_ideal,
                         "setup_extra_mib": max(big["setup_mib"]) - max(tiny["setup_mib"]),
                         "tiny_peak_mib": max(tiny["peak_mib"]), "max_abs_difference": big["max_abs_difference"]})
            if opts.verbose:
                print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| processes | optimizer | peak / process | ideal | over ideal | set-up extra (whole module: "
             f"{rows[0]['weights_mib']:.0f}) | first step vs unsharded |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['procs']} | {r['optimizer']} | {r['peak_mib']:.0f} MiB | {r['ideal_mib']:.0f} MiB | "
                     f"{100 * r['over_ideal']:+.1f}% | {r['setup_extra_mib']:.0f} MiB | "
                     f"max |diff| {r['max_abs_difference']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", default="2,4")
    parser.add_argument("--optimizers", default="sgd,adam")
    parser.add_argument("--optimizer", default="sgd")  # a worker's
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--tune-cpu-allocator", type=int, default=1,
                        help="fit's tune_cpu_allocator (1: the default; 0: glibc returns freed blocks)")
    parser.add_argument("--eager", action="store_true",
                        help="Model(module): the module built whole in every process (fitkit before deferred init)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--verbose", action="store_true", help="print each row as JSON when it is measured")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--shards", action="store_true")
    parser.add_argument("--results", default=None)
    opts = parser.parse_args(argv)
    if opts.worker or opts.reference:
        opts.procs = int(opts.procs)
        worker(opts) if opts.worker else reference(opts)
        return 0
    opts.procs = [int(p) for p in opts.procs.split(",")]
    opts.optimizers = opts.optimizers.split(",")
    rows = measure(opts)
    print(table(rows))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
