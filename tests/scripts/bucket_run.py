"""A small training run writing its checkpoints to a bucket, for the kill -9 tests of
tests/test_object_storage.py: prints `SAVE N` when a checkpoint is committed and saves the final
weights to WEIGHTS.

usage: bucket_run.py OUTPUT_DIR WEIGHTS [--resume] [--save-async] [--sleep SECONDS]

The S3 endpoint and credentials come from the environment (AWS_ENDPOINT_URL, ...), as a user's
run would have them. With `--resume` a run that finds no checkpoint fails (exit code 3).
"""

import argparse
import sys
import time

import torch

from fitkit import Model, TrainerCallback


class Report(TrainerCallback):
    def __init__(self, sleep, resume):
        self.sleep, self.resume = sleep, resume

    def on_train_begin(self, args, state, control, **kwargs):
        print(f"TRAIN_BEGIN {state.global_step}", flush=True)
        if self.resume and state.global_step == 0:
            sys.exit(3)

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.sleep)

    def on_save(self, args, state, control, **kwargs):
        print(f"SAVE {state.global_step}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("weights")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--save-async", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g)
    torch.manual_seed(7 if opts.resume else 1)  # a resumed run's weights come from the checkpoint only
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 3))
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)
    saving = opts.output_dir.startswith("s3://")
    model.fit(x, y, epochs=3, batch_size=16, verbose=0, output_dir=opts.output_dir,
              save_strategy="steps" if saving else "no", save_steps=2, save_total_limit=2,
              save_async=opts.save_async, resume_from_checkpoint=opts.resume,
              callbacks=[Report(opts.sleep, opts.resume)])
    torch.save(model.module.state_dict(), opts.weights)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
