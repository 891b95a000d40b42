"""`strategy="ddp_spawn"` with a fitkit `TrainingArguments` as `args=` (a frozen dataclass, which
Lightning's spawn launcher could not copy) trains as one process does on the two processes' batches
together: each process steps parameters of its own (they were left in memory the processes shared,
so each step was taken twice). Writes the spawned run's weights and one process's to RESULT_JSON.

usage: spawn_args.py RESULT_JSON
"""

import json
import os
import sys

import torch

from fitkit import Model, TrainingArguments


def main() -> None:
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    torch.manual_seed(0)
    start = torch.nn.Linear(4, 2).state_dict()
    weights = {}
    for strategy, devices, batch_size in (("auto", 1, 16), ("ddp_spawn", 2, 8)):  # 16 samples a step in both
        net = torch.nn.Linear(4, 2)
        net.load_state_dict(start)
        model = Model(net).compile("sgd", "cross_entropy", strategy=strategy, devices=devices, accelerator="cpu")
        args = TrainingArguments(epochs=2, batch_size=batch_size, learning_rate=0.5, shuffle=False, verbose=0,
                                 output_dir=os.path.join(os.path.dirname(sys.argv[1]), strategy), save_strategy="no")
        model.fit(x, y, args=args)
        weights[strategy] = {"weights": [p.tolist() for p in net.parameters()], "steps": model.state.global_step}
    with open(sys.argv[1], "w") as f:
        json.dump(weights, f)


if __name__ == "__main__":
    main()
