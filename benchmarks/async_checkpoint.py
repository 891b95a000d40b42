"""Asynchronous checkpoints: how long the training loop is blocked per checkpoint, synchronous
(`save_async=False`) against asynchronous (`save_async=True`), and the whole run's time with a
save every 10 steps against the same run without saves.

The workload is issue 29's: a 4 x Linear(2048, 2048) MLP with Adam, batch 64, one torch thread
(a checkpoint is about 200 MB: weights, Adam's two moments). The blocked time is measured
around `Checkpointer.save` (for an asynchronous save: waiting for the previous write, if any,
plus the host copy); the runs are interleaved, `--reps` times each, and the medians reported.

    python benchmarks/async_checkpoint.py                 # 60 steps, save every 10, 3 reps
    python benchmarks/async_checkpoint.py --steps 30 --reps 1
    python benchmarks/async_checkpoint.py --steps 150 --reps 9 --sync-reps 1   # as in docs/benchmarks.md

The no-save and asynchronous runs alternate in each repetition, and the run-time cost is also
given as the median of per-repetition ratios (each asynchronous run against the no-save run
next to it): this machine's speed drifts by several percent from one minute to the next.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from fitkit import Model
from fitkit.engine.checkpoint import checkpointer as checkpointer_module

WIDTH, LAYERS, BATCH = 2048, 4, 64


def _model() -> Model:
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return Model(torch.nn.Sequential(*layers[:-1])).compile("adam", "mse", learning_rate=1e-4)


class _BlockedTimer:
    """Wraps `Checkpointer.save` to time how long the loop waits in it."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._save = checkpointer_module.Checkpointer.save

    def __enter__(self) -> _BlockedTimer:
        save, times = self._save, self.times

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return save(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - start)

        checkpointer_module.Checkpointer.save = timed
        return self

    def __exit__(self, *exc) -> None:
        checkpointer_module.Checkpointer.save = self._save


def run(mode: str, steps: int, every: int) -> dict[str, float]:
    """One fit of `steps` steps: mode "none" (no saves), "sync" or "async"; its wall time and
    the loop's blocked time per checkpoint."""
    x = torch.randn(steps * BATCH, WIDTH)
    y = torch.randn(steps * BATCH, WIDTH)
    model = _model()
    with tempfile.TemporaryDirectory() as out, _BlockedTimer() as timer:
        options = {} if mode == "none" else {"save_strategy": "steps", "save_steps": every,
                                             "save_async": mode == "async", "save_total_limit": 2}
        start = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, output_dir=out, **options)
        wall = time.perf_counter() - start
    blocked = statistics.median(timer.times) if timer.times else 0.0
    return {"wall": wall, "blocked": blocked, "saves": len(timer.times)}


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="save every N steps")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sync-reps", type=int, default=None, help="repetitions of the synchronous runs "
                        "(default: --reps); the run-time ratio pairs each asynchronous run with its own no-save run")
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    modes = ("none", "sync", "async")
    sync_reps = opts.reps if opts.sync_reps is None else opts.sync_reps
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    run("none", 5, opts.every)  # warm-up: imports, allocator
    # No-save and asynchronous runs in pairs (their order alternating), so drifts of the machine
    # touch both alike; the synchronous runs after them, whose page-cache writeback would
    # otherwise spill into the next runs. Each run starts with no dirty pages left (`os.sync`).
    order = [("none", "async") if rep % 2 == 0 else ("async", "none") for rep in range(opts.reps)]
    for mode in [m for pair in order for m in pair] + ["sync"] * sync_reps:
        os.sync()
        results[mode].append(run(mode, opts.steps, opts.every))
    table = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall", "blocked", "saves")}
             for m, rs in results.items()}
    base, sync = table["none"]["wall"], table["sync"]["blocked"]
    paired = [a["wall"] / n["wall"] - 1 for a, n in zip(results["async"], results["none"])]
    print(f"{opts.steps} steps, a save every {opts.every} ({int(table['sync']['saves'])} saves), "
          f"{opts.reps} reps ({sync_reps} synchronous), {opts.threads} torch thread(s); medians")
    print(f"{'mode':8} {'run (s)':>9} {'vs no saves':>12} {'blocked/save (ms)':>18} {'vs sync':>8}")
    for mode in modes:
        row = table[mode]
        ratio = f"{row['blocked'] / sync:.1%}" if sync and mode != "none" else "-"
        print(f"{mode:8} {row['wall']:9.2f} {row['wall'] / base - 1:+12.1%} {row['blocked'] * 1000:18.1f} {ratio:>8}")
    low, mid, high = _quartiles(paired)
    print(f"async run / its paired no-save run - 1: median {mid:+.1%} [quartiles {low:+.1%} .. {high:+.1%}]; "
          f"per repetition: {', '.join(f'{p:+.1%}' for p in paired)}")
    table["paired"] = {"median": mid, "low": low, "high": high}
    return table


if __name__ == "__main__":
    main()
