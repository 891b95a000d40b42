"""Two processes (ddp_spawn, gloo on CPU) trained by fitkit under the Trainer's data order (what
`args=transformers.TrainingArguments` sets: `data_order="trainer"`, given here directly so that the
processes need not import transformers): each process writes the sample ids of its training batches,
step by step, to `RESULT_DIR/rank-R.json`, for tests/test_hf_data_order.py to compare with the batches
transformers' sampler and accelerate give each rank.

usage: hf_order_ddp.py RESULT_DIR SAMPLES BATCH_SIZE SEED DATA_SEED|none
"""

import json
import os
import sys

import torch

from fitkit import Model, TrainingArguments
from fitkit.callbacks import TrainerCallback


class Rows(torch.utils.data.Dataset):
    """Sample `i` holds token `5 + i` first, so a batch tells which samples it holds."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([5 + i, 3, 4]), "labels": torch.tensor(i % 2)}


class Recording(torch.nn.Module):
    """A tiny classifier with dropout that keeps the sample ids of its training batches."""

    def __init__(self, vocab):
        super().__init__()
        self.embed, self.drop, self.head = torch.nn.Embedding(vocab, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 2)
        self.seen = []

    def forward(self, input_ids):
        if self.training and torch.is_grad_enabled():
            self.seen.append((input_ids[:, 0] - 5).tolist())
        return self.head(self.drop(self.embed(input_ids).mean(1)))


class WriteSeen(TrainerCallback):
    def __init__(self, directory):
        self.directory = directory

    def on_train_end(self, args, state, control, model=None, **kwargs):
        rank = torch.distributed.get_rank()
        with open(os.path.join(self.directory, f"rank-{rank}.json"), "w") as f:
            json.dump(model.seen, f)


def main() -> None:
    out, n, batch_size, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    data_seed = None if sys.argv[5] == "none" else int(sys.argv[5])
    args = TrainingArguments(output_dir=os.path.join(out, "run"), verbose=0, epochs=2, batch_size=batch_size,
                             learning_rate=1e-2, seed=seed, data_seed=data_seed, data_order="trainer")
    model = Model(Recording(n + 8)).compile("sgd", "cross_entropy", strategy="ddp_spawn", devices=2,
                                              accelerator="cpu")
    model.fit(Rows(n), callbacks=[WriteSeen(out)], args=args)


if __name__ == "__main__":
    main()
