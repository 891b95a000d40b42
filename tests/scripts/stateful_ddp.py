"""A stateful IterableDataset under 2-process DDP, for tests/test_stateful_sources.py.

Each process streams its own half of every epoch's order and saves its position
(`state_dict()`). In one launch, on the same processes: a whole run (2 epochs), then for
synchronous and asynchronous saves a run cut at step CUT (a checkpoint there) and its resume.
Each process writes RESULTS/run-R-rank-N.json: the items it read while training, the batches
it trained on, its final weights, and for a cut run the data states in its checkpoint.

usage: stateful_ddp.py --results DIR --output DIR
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from fitkit import Model, TrainerCallback
from fitkit.engine.checkpoint import layout

N, BATCH, CUT = 48, 4, 4  # per process 24 items (6 batches) an epoch, 2 epochs: 12 steps; cut mid-epoch 0


def order(epoch):
    return torch.randperm(N, generator=torch.Generator().manual_seed(100 + epoch)).tolist()


class Stream(IterableDataset):
    """Every process's share of an epoch-dependent order; saves its epoch and position."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(N, 4, generator=g), torch.randint(0, 2, (N,), generator=g)
        self.epoch, self.pos, self.pending, self.shard = 0, 0, None, None
        self.reads, self.recording = [], False

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos, "shard": self.shard}

    def load_state_dict(self, state):
        self.pending = dict(state)

    def __iter__(self):
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        pending, self.pending = self.pending, None
        self.epoch, self.pos = (pending["epoch"], pending["pos"]) if pending else (self.epoch, 0)
        # A loaded state names its shard (none before the first pass): had a process been given
        # another's state, it would read that process's items.
        self.shard = pending["shard"] if pending and pending["shard"] is not None else rank
        mine = order(self.epoch)[self.shard::world]
        while self.pos < len(mine):
            i = mine[self.pos]
            self.pos += 1
            if self.recording:
                self.reads.append(i)
            yield self.x[i], self.y[i]
        self.epoch, self.pos = self.epoch + 1, 0


class Record(TrainerCallback):
    """Reads count from the start of training (the data check's first batch is left out)."""

    def __init__(self, stream):
        self.stream, self.batches = stream, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.stream.recording = True

    def on_step_end(self, args, state, control, batch=None, **kwargs):
        self.batches.append([t.tolist() for t in batch])


def main(opts):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    initial = [p.detach().clone() for p in net.parameters()]
    model = Model(net)
    runs = [("full", None, {})]
    for mode in ("sync", "async"):
        cut = os.path.join(opts.output, mode)
        runs += [(f"cut-{mode}", cut, {"max_steps": CUT}),
                 (f"resume-{mode}", cut, {"resume_from_checkpoint": os.path.join(cut, f"checkpoint-{CUT}")})]
    for run, (name, output, options) in enumerate(runs):
        other = torch.Generator().manual_seed(7)  # a resume starts from other weights: only loading gives the same end
        with torch.no_grad():
            for p, w in zip(net.parameters(), initial):
                p.copy_(torch.randn(w.shape, generator=other) if name.startswith("resume") else w)
        model.compile("adam", "cross_entropy", learning_rate=1e-2, strategy="ddp", devices=2, accelerator="cpu")
        stream = Stream()
        record = Record(stream)
        model.fit(stream, batch_size=BATCH, epochs=2, seed=7, verbose=0, callbacks=[record],
                  output_dir=output or os.path.join(opts.output, name), save_strategy="steps", save_steps=CUT,
                  save_async=name.endswith("async"), **options)
        rank = model.fabric.global_rank
        result = {"name": name, "rank": rank, "step": model.state.global_step, "reads": stream.reads,
                  "batches": record.batches,
                  "weights": [p.detach().flatten().tolist() for p in model.module.parameters()]}
        if name.startswith("cut"):
            payload = torch.load(os.path.join(output, f"checkpoint-{CUT}", layout.WEIGHTS), weights_only=True)
            result["data_state"] = payload["loop"]["data_state"]
        with open(os.path.join(opts.results, f"run-{run}-rank-{rank}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--output", required=True)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    main(opts)
