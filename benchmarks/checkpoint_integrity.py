"""Checkpoint integrity cost: what a digest costs per GB (SHA-256, which fitkit records, and
BLAKE2b), and how long writing and verifying a checkpoint take with it.

The checkpoint is a real one (`Checkpointer.save` through Fabric) of a model with about
`--params` parameters trained with Adam (weights + two moments: about 12 bytes a parameter).

    python benchmarks/checkpoint_integrity.py                 # 1 GiB buffer, ~1 GB checkpoint
    python benchmarks/checkpoint_integrity.py --params 10e6   # smaller
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time

import torch

from fitkit import Model, TrainerCallback
from fitkit.engine.checkpoint import listing
from fitkit.engine.checkpoint.verify import verified
from fitkit.engine.checkpoint.writing import describe


def digest_seconds_per_gib(algorithm: str, repeats: int = 3) -> float:
    """Best of `repeats` over a 1 GiB in-memory buffer, fed in 4 MiB blocks."""
    block = os.urandom(4 << 20)
    best = float("inf")
    for _ in range(repeats):
        h = hashlib.new(algorithm)
        start = time.perf_counter()
        for _ in range(256):
            h.update(block)
        h.hexdigest()
        best = min(best, time.perf_counter() - start)
    return best


class _Timed(TrainerCallback):
    def __init__(self):
        self.saves: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.saves.append(time.perf_counter() - self.started)


def checkpoint_seconds(params: float, out: str) -> dict[str, float]:
    width = int((params / 2) ** 0.5)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    x, y = torch.randn(8, width), torch.randn(8, width)
    timed = _Timed()
    Model(net).compile("adam", "mse").fit(x, y, batch_size=8, epochs=2, verbose=0, output_dir=out,
                                          save_strategy="epoch", callbacks=[timed])
    path = listing.list_checkpoints(out)[-1]
    size = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    start = time.perf_counter()
    describe(path)  # what the manifest adds to a save: every file's size and digest
    hashing = time.perf_counter() - start
    start = time.perf_counter()
    verified(path)
    verify = time.perf_counter() - start
    return {"bytes": size, "save": min(timed.saves), "hashing": hashing, "verify": verify}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--params", type=float, default=85e6)
    opts = parser.parse_args()
    for algorithm in ("sha256", "blake2b"):
        print(f"{algorithm:8s} {digest_seconds_per_gib(algorithm):.2f} s per GiB (one core)")
    out = tempfile.mkdtemp(prefix="fitkit-integrity-")
    try:
        r = checkpoint_seconds(opts.params, out)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"checkpoint {r['bytes'] / 1e9:.2f} GB: save {r['save']:.2f} s (of which digests {r['hashing']:.2f} s), "
          f"verify before loading {r['verify']:.2f} s")


if __name__ == "__main__":
    main()
