"""An overridden `train_step` under one or several processes: prints one JSON line per rank.

usage: custom_step.py [--strategy auto|ddp|fsdp] [--devices N]

Each epoch is one global batch of all 64 samples (64 / N per process), so N processes compute
the same update as one process, up to the order of float sums.
"""

import argparse
import json
import os

import torch

from fitkit import Model, unpack_data


class Penalised(Model):
    def train_step(self, data):
        x, y, _ = unpack_data(data)
        y_pred = self.module(x)
        mse = torch.nn.functional.mse_loss(y_pred, y)
        # An activity penalty (from the outputs): under FSDP the parameters are sharded DTensors
        # outside forward, so a weight penalty there would need `p.full_tensor()`.
        penalty = 1e-2 * y_pred.square().mean()
        self.backward(mse + penalty)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": mse, "penalty": penalty}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    opts = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=g)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = Penalised(net).compile("sgd", "mse", learning_rate=0.05, strategy=opts.strategy,
                                   devices=opts.devices, accelerator="cpu")
    history = model.fit(x, y, epochs=4, batch_size=64 // opts.devices, shuffle=False, verbose=0)
    weights = []
    for p in model.module.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        weights.append(t.detach().cpu().flatten().tolist())
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    line = "RESULT " + json.dumps({"rank": rank, "weights": weights, "history": history.history,
                                   "global_step": model.state.global_step}) + "\n"
    os.write(1, line.encode())  # one write: the ranks' lines never interleave


if __name__ == "__main__":
    main()
