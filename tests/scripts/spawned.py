"""ddp_spawn from a plain script: the trained weights come back to the calling process.

usage: spawned.py RESULT_JSON
"""

import json
import sys

import torch

from fitkit import Model


def main() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 8, generator=g)
    y = (x[:, 0] > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    before = [p.detach().clone() for p in net.parameters()]
    model = Model(net).compile("adam", "cross_entropy", ["accuracy"], strategy="ddp_spawn", devices=2,
                               accelerator="cpu", learning_rate=1e-2)
    history = model.fit(x, y, epochs=3, verbose=0)
    with torch.no_grad():
        local = net(x)  # this process's module, which the children never touched
    result = {
        "changed": any(not torch.equal(a, b) for a, b in zip(before, net.parameters())),
        "history": history.history, "global_step": model.state.global_step,
        "local_accuracy": (local.argmax(1) == y).float().mean().item(),
        "evaluate": model.evaluate(x, y, return_dict=True), "predict": model.predict(x).tolist(), "local": local.tolist(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
