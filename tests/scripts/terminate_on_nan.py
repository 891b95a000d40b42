"""TerminateOnNaN under 2-process DDP on CPU: the loss turns NaN on rank 1 only, at its third
training step; every process must stop at that same step (no process left waiting in a
collective). Each process writes {"rank", "stopped_step", "global_step"} to RESULTS/rank-N.json.

usage: terminate_on_nan.py RESULTS
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from fitkit import Model
from fitkit.callbacks import TerminateOnNaN


class NanOnRankOne(torch.nn.Module):
    """A linear model whose output is NaN on rank 1 at its third training forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        out = self.linear(x)
        if self.training:
            self.calls += 1
            if self.calls == 3 and dist.is_initialized() and dist.get_rank() == 1:
                out = out * float("nan")
        return out


def main(results: str) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g)
    stop = TerminateOnNaN()
    model = Model(NanOnRankOne()).compile("sgd", "cross_entropy", strategy="ddp", devices=2, accelerator="cpu")
    model.fit(x, y, batch_size=4, epochs=2, callbacks=[stop], verbose=0)
    rank = dist.get_rank() if dist.is_initialized() else 0
    with open(os.path.join(results, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "stopped_step": stop.stopped_step, "global_step": model.state.global_step}, f)


if __name__ == "__main__":
    main(sys.argv[1])
