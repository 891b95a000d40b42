"""Two nodes simulated on loopback (two torchrun invocations of one process each, `num_nodes=2`),
each node with its own `output_dir` as nodes without a shared disk have: a small DDP fit that
saves every 2 steps and keeps 2 checkpoints, with `save_on_each_node` as the first argument says.

usage: python -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --node_rank N ... \
           save_each_node.py {on,off} BASE_DIR
"""

import os
import sys

import torch

from fitkit import Model, TrainingArguments


def main() -> None:
    on, base = sys.argv[1] == "on", sys.argv[2]
    node = int(os.environ["GROUP_RANK"])  # torchrun's node rank
    torch.manual_seed(0)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    model = Model(torch.nn.Linear(4, 1)).compile("sgd", "mse", devices=1, num_nodes=2, strategy="ddp",
                                                 accelerator="cpu")
    args = TrainingArguments(output_dir=os.path.join(base, f"node-{node}"), save_strategy="steps", save_steps=2,
                             save_total_limit=2, num_train_epochs=1, per_device_train_batch_size=4, verbose=0,
                             save_on_each_node=on, seed=0)
    model.fit(x, y, args=args)


if __name__ == "__main__":
    main()
