"""A small training run for the preemption tests: prints STEP/SAVE/TRAIN_END lines and a RESULT.

usage: preemptible.py OUTPUT_DIR [--resume] [--sleep SECONDS]
"""

import argparse
import json
import time

import torch

from fitkit import Model, TrainerCallback


class Report(TrainerCallback):
    def __init__(self, sleep):
        self.sleep = sleep

    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        time.sleep(self.sleep)

    def on_save(self, args, state, control, **kwargs):
        print(f"SAVE {state.global_step}", flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        print(f"TRAIN_END {state.global_step}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 8, generator=g)
    y = torch.randint(0, 3, (160,), generator=g)
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 3))
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, batch_size=8, epochs=2, seed=3, verbose=0, output_dir=opts.output_dir,
              save_strategy="steps", save_steps=3, logging_strategy="steps", logging_steps=1,
              resume_from_checkpoint=opts.resume, callbacks=[Report(opts.sleep)])
    weights = [p.detach().flatten().tolist() for p in net.parameters()]
    print("RESULT " + json.dumps({"global_step": model.state.global_step,
                                   "log_history": [r for r in model.state.log_history if "train_runtime" not in r], "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
