"""Resume cost: time from `fit(resume_from_checkpoint=...)` to the first resumed step, for a
checkpoint taken near the start and near the end of one long epoch.

Skipping consumed batches happens at the index level (tensors: the permutation is sliced; a
map-style Dataset: fitkit's sampler starts at the right index), so the cost must be flat.

    python benchmarks/resume_cost.py            # prints a table
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset

from fitkit import Model, TrainerCallback


class SlowItems(Dataset):
    """A map-style dataset whose items cost real work, as decoding or augmenting would."""

    def __init__(self, x, y, work: int = 2000):
        self.x, self.y, self.work = x, y, work

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        acc = 0
        for k in range(self.work):  # deliberate per-item cost
            acc += k
        return self.x[i], self.y[i]


class FirstStep(TrainerCallback):
    def __init__(self):
        self.at = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.at is None:
            self.at = time.perf_counter()
            control.should_training_stop = True
        return control


def _model():
    torch.manual_seed(0)
    return Model(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))).compile(
        "adam", "cross_entropy")


def measure(form: str, batches: int, batch_size: int = 16) -> dict[str, float]:
    n = batches * batch_size
    x, y = torch.randn(n, 16), torch.randint(0, 4, (n,))
    data = {"x": x, "y": y} if form == "tensors" else {"x": SlowItems(x, y)}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, step in (("start", 2), ("end", batches - 2)):
            model = _model()
            model.fit(**data, batch_size=batch_size, max_steps=step, verbose=0, output_dir=tmp,
                      save_strategy="steps", save_steps=step)
            path = os.path.join(tmp, f"checkpoint-{step}")
            model = _model()
            cb = FirstStep()
            t0 = time.perf_counter()
            model.fit(**data, batch_size=batch_size, verbose=0, output_dir=tmp, resume_from_checkpoint=path,
                      callbacks=[cb])
            out[label] = cb.at - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches in the epoch")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    print(f"| data | resume at batch 2 (s) | resume at batch {opts.batches - 2} (s) | ratio |")
    print("|---|---|---|---|")
    for form in ("tensors", "dataset"):
        r = measure(form, opts.batches)
        print(f"| {form} | {r['start']:.3f} | {r['end']:.3f} | {r['end'] / r['start']:.2f} |")


if __name__ == "__main__":
    main()
