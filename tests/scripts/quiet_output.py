"""A fit on DDP (gloo, CPU) whose whole output the tests read: what the user sees.

usage: quiet_output.py DEVICES [LOG_LEVEL]

Fits one epoch with `verbose=2`, then predicts (which gathers every rank's outputs with
Fabric's `all_gather`); each process then prints `DONE rank=N`.
"""

import os
import sys

import torch

from fitkit import Model


def main(devices: int, log_level: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = Model(net).compile("adam", "cross_entropy", ["accuracy"], strategy="ddp", devices=devices,
                               accelerator="cpu")
    model.fit(x, y, epochs=1, batch_size=16, validation_split=0.25, verbose=2, log_level=log_level)
    predicted = model.predict(x, batch_size=16, verbose=0)
    assert predicted.shape == (64, 2), predicted.shape
    os.write(1, f"DONE rank={model.fabric.global_rank}\n".encode())


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "passive")
