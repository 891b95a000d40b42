"""`evaluate` and `predict` against the hand-written `inference_mode` loop doing the same work.

The workload is issue 39's: a trained-size MLP 32-64-10 (the tiny workload's), 200,000 samples
in memory, batch 1,024, the loss (cross-entropy) and accuracy for `evaluate`, the logits of every
sample for `predict`. The hand loops are what a user writes: `module.eval()`, `inference_mode`,
for each batch a slice (or the DataLoader's batch), the forward, the loss and the correct count
summed on the device and read once at the end; `predict` concatenates the outputs. The same runs
over a `DataLoader(TensorDataset(x, y), batch_size=1024)` (`--loader-samples` of them: its
per-sample indexing and collation dominate, so fewer samples keep the run short). One more row
compares `evaluate` with the same hand loop under `torch.no_grad` (what fitkit ran in before it
evaluated under `inference_mode` on one device).

Each repetition runs every contender once, the order rotated from one repetition to the next,
and divides fitkit's time by its hand loop's in that repetition; the table gives the medians of
those ratios with their quartiles, and the ratio of the two minimum CPU times (each contender's
least disturbed run: a second view on a machine shared with other work). fitkit's values
are checked against the hand loop's first.

    python -m benchmarks.inference                 # 15 reps
    python -m benchmarks.inference --reps 31       # as in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import import_fitkit, quartiles, quiet, single_thread

DIMS, BATCH = (32, 64, 10), 1024


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIMS[0], DIMS[1]), torch.nn.ReLU(), torch.nn.Linear(DIMS[1], DIMS[2]))


def _batches(x: torch.Tensor, y: torch.Tensor, loader: Any) -> Any:
    if loader is not None:
        return loader
    return ((x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH))


def hand_evaluate(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loader: Any = None,
                  mode: Callable[[], Any] = torch.inference_mode) -> dict[str, float]:
    net.eval()
    with mode():
        total, correct, count = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.long), 0
        for xb, yb in _batches(x, y, loader):
            out = net(xb)
            total += F.cross_entropy(out, yb, reduction="sum")
            correct += (out.argmax(-1) == yb).sum()
            count += len(yb)
    return {"loss": float(total) / count, "accuracy": int(correct) / count}


def hand_predict(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, loader: Any = None) -> torch.Tensor:
    net.eval()
    with torch.inference_mode():
        return torch.cat([net(xb) for xb, _ in _batches(x, y, loader)])


def contenders(x: torch.Tensor, y: torch.Tensor, loader_samples: int) -> dict[str, tuple[Callable, Callable]]:
    """name -> (hand run, fitkit run)."""
    fitkit = import_fitkit()
    net = _net()
    model = fitkit.Model(net).compile("adam", "cross_entropy", ["accuracy"])
    xl, yl = x[:loader_samples], y[:loader_samples]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xl, yl), batch_size=BATCH)
    return {
        "evaluate, tensors": (lambda: hand_evaluate(net, x, y),
                              lambda: model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)),
        "evaluate, tensors, vs no_grad": (lambda: hand_evaluate(net, x, y, mode=torch.no_grad),
                                          lambda: model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)),
        "predict, tensors": (lambda: hand_predict(net, x, y), lambda: model.predict(x, batch_size=BATCH, verbose=0)),
        "evaluate, DataLoader": (lambda: hand_evaluate(net, xl, yl, loader),
                                 lambda: model.evaluate(loader, verbose=0, return_dict=True)),
        "predict, DataLoader": (lambda: hand_predict(net, xl, yl, loader), lambda: model.predict(loader, verbose=0)),
    }


def check(name: str, hand: Any, mine: Any) -> None:
    """fitkit gives the hand loop's values (up to rounding: torchmetrics computes accuracy in float32)."""
    if isinstance(hand, dict):
        if abs(hand["loss"] - mine["loss"]) > 1e-5 * abs(hand["loss"]) or abs(hand["accuracy"] - mine["accuracy"]) > 1e-6:
            raise AssertionError(f"{name}: fitkit {mine} != hand loop {hand}")
    elif not torch.allclose(hand, mine, rtol=1e-5, atol=1e-6):
        raise AssertionError(f"{name}: fitkit's outputs differ from the hand loop's")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--loader-samples", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=15)
    opts = parser.parse_args(argv)
    single_thread()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(opts.samples, DIMS[0], generator=g)
    y = torch.randint(0, DIMS[-1], (opts.samples,), generator=g)
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    with quiet():
        runs = contenders(x, y, opts.loader_samples)
        for name, (hand, mine) in runs.items():  # warm-up, and the same numbers
            check(name, hand(), mine())
        flat = [(name, who, run) for name, pair in runs.items() for who, run in zip(("hand", "fitkit"), pair)]
        for rep in range(opts.reps):
            shift = rep % len(flat)
            for name, who, run in flat[shift:] + flat[:shift]:
                start, start_cpu = time.perf_counter(), time.process_time()
                run()
                wall.setdefault((name, who), []).append(time.perf_counter() - start)
                cpu.setdefault((name, who), []).append(time.process_time() - start_cpu)
    share = sum(map(sum, cpu.values())) / sum(map(sum, wall.values()))
    print(f"{opts.samples:,} samples in memory ({opts.loader_samples:,} through the DataLoader), batch {BATCH}, "
          f"MLP {'-'.join(map(str, DIMS))}, {opts.reps} reps, one torch thread; CPU/wall {share:.0%} "
          "(under ~95% other processes took the core: read the CPU-time ratio)")
    print(f"  {'call':30} {'hand (ms)':>10} {'fitkit (ms)':>12} {'fitkit / hand, wall [IQR]':>28} "
          f"{'fitkit / hand, CPU time [IQR]':>30} {'CPU, minima':>12}")
    result: dict[str, Any] = {"cpu_share": share}
    for name in runs:
        row = {}
        for clock, times in (("wall", wall), ("cpu", cpu)):
            hand, mine = times[(name, "hand")], times[(name, "fitkit")]
            low, mid, high = quartiles([m / h for m, h in zip(mine, hand)])
            row[clock] = {"median": mid, "q1": low, "q3": high, "hand": quartiles(hand)[1], "fitkit": quartiles(mine)[1],
                          "of_minima": min(mine) / min(hand)}
        w, c = row["wall"], row["cpu"]
        print(f"  {name:30} {w['hand'] * 1e3:10.1f} {w['fitkit'] * 1e3:12.1f} "
              f"{w['median']:15.3f} [{w['q1']:.3f}-{w['q3']:.3f}] {c['median']:17.3f} [{c['q1']:.3f}-{c['q3']:.3f}]"
              f" {c['of_minima']:12.3f}")
        result[name] = row
    return result


if __name__ == "__main__":
    main()
