"""Data-parallel training on 2 CPU processes (gloo), the same call as on one process.

    python examples/ddp.py                                   # Fabric starts the second process
    torchrun --nproc_per_node=2 examples/ddp.py              # torchrun starts both
    python examples/ddp.py --strategy fsdp                   # FSDP2: parameters sharded over processes

Only the world-zero process prints; every process ends with the same weights and History.
"""

from __future__ import annotations

import argparse

import torch
from sklearn.datasets import load_digits

from fitkit import Model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp", help="ddp, fsdp, ddp_spawn, ...")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    opts = parser.parse_args()
    torch.set_num_threads(1)

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = Model(net).compile("adam", "cross_entropy", ["accuracy"], learning_rate=3e-3,
                               accelerator="cpu", devices=opts.devices, strategy=opts.strategy)
    # batch_size is per process: 2 processes x 32 = 64 samples per optimizer step
    model.fit(x, y, epochs=opts.epochs, batch_size=32, validation_split=0.2, verbose=2)
    result = model.evaluate(x[int(0.8 * len(x)):], y[int(0.8 * len(y)):], return_dict=True)
    if model.state.is_world_process_zero:
        print(f"validation accuracy on {opts.devices} processes: {result['accuracy']:.4f}")


if __name__ == "__main__":
    main()
