"""The time of one optimizer step for each Keras name fitkit builds, against torch's class of that
name in the same implementation (fused / foreach / for-loop), on the tiny MLP of the other tables
(32-64-10) and a wider one (512-2048-512), gradients already in place. What it shows: Keras'
algorithms cost what torch's cost, and "adam" stays torch's fused kernel.

    .venv/bin/python benchmarks/optimizer_steps.py                  # CPU, one thread
    .venv/bin/python benchmarks/optimizer_steps.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from fitkit.adapters.optimizers import build_optimizer, implementation


def _net(width: tuple[int, int, int], device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    a, b, c = width
    return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, c)).to(device)


def _time(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], width: tuple[int, int, int],
          device: str, steps: int, reps: int) -> tuple[float, str]:
    """Median microseconds per step over `reps` runs of `steps` steps, and the implementation."""
    params = list(_net(width, device).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = make(params)
    for _ in range(10):
        opt.step()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(times), implementation(opt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch_classes = {
        "adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "rmsprop": torch.optim.RMSprop,
        "adagrad": torch.optim.Adagrad, "adadelta": torch.optim.Adadelta, "adamax": torch.optim.Adamax,
        "nadam": torch.optim.NAdam,
    }
    print(f"device {args.device}, torch {torch.__version__}; microseconds per step (median of {args.reps})")
    print("| name | width | fitkit (Keras' algorithm) | torch's class, same implementation | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for width in ((32, 64, 10), (512, 2048, 512)):
        for name in ("adam", "adamw", "sgd", "rmsprop", "adagrad", "adadelta", "adamax", "nadam", "lion"):
            ours, kind = _time(lambda p, n=name: build_optimizer(n, p, None, None), width, args.device,
                               args.steps, args.reps)
            if name not in torch_classes:
                print(f"| {name} | {width} | {ours:.1f} ({kind}) | (torch has none) | |")
                continue
            flag = {"fused": {"fused": True}, "foreach": {"foreach": True}}.get(kind, {"foreach": False})
            theirs, tkind = _time(lambda p, n=name, f=flag: torch_classes[n](p, lr=1e-3, **f), width, args.device,
                                  args.steps, args.reps)
            print(f"| {name} | {width} | {ours:.1f} ({kind}) | {theirs:.1f} ({tkind}) | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
