"""A small checkpointing run for the integrity tests (one writer, disk full): prints PAUSED,
SAVE and RESULT lines.

usage: integrity_run.py OUTPUT_DIR [--resume] [--seed N] [--pause-at STEP] [--fsize-after-first-save BYTES]
                         [--devices N] [--async] [--slow-write SECONDS]

--pause-at STEP: after that step, print "PAUSED <pid>" and wait for a line on stdin (the run
    holds its output_dir meanwhile).
--fsize-after-first-save BYTES: once the first checkpoint is written, no file of this process
    may grow past BYTES (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG, as on a full disk).
--devices N: DDP on N CPU processes (gloo); the limit above is set in every process.
--async: save_async=True. --slow-write SECONDS: each background write prints "WRITING <step>"
    when it starts and sleeps that long half-way (after the weights, before the commit).
"""

import argparse
import json
import os
import resource
import signal
import sys

import torch

from fitkit import Model, TrainerCallback


class Control(TrainerCallback):
    def __init__(self, pause_at, fsize):
        self.pause_at, self.fsize = pause_at, fsize
        self.first_step = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.first_step = state.global_step  # where a resumed run starts

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.pause_at:
            print(f"PAUSED {os.getpid()}", flush=True)
            sys.stdin.readline()

    def on_save(self, args, state, control, **kwargs):
        print(f"SAVE {state.global_step}", flush=True)
        if self.fsize:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.fsize, resource.RLIM_INFINITY))
            self.fsize = None


def slow_writes(seconds):
    import time

    from fitkit.engine.checkpoint import background, writing

    commit, write = writing.commit, background.write_in_background

    def announced(output_dir, step, *args, **kwargs):
        print(f"WRITING {step}", flush=True)
        return write(output_dir, step, *args, **kwargs)

    def slow_commit(*args, **kwargs):
        time.sleep(seconds)
        return commit(*args, **kwargs)

    background.write_in_background, writing.commit = announced, slow_commit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pause-at", type=int, default=-1)
    parser.add_argument("--fsize-after-first-save", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--async", dest="save_async", action="store_true")
    parser.add_argument("--slow-write", type=float, default=0.0)
    opts = parser.parse_args()
    if opts.slow_write:
        slow_writes(opts.slow_write)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = torch.randint(0, 3, (96,), generator=g)
    torch.manual_seed(opts.seed)  # the starting weights: a resumed run must replace them
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 3))
    control = Control(opts.pause_at, opts.fsize_after_first_save)
    placement = {"strategy": "ddp", "devices": opts.devices, "accelerator": "cpu"} if opts.devices > 1 else {}
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2, **placement)
    model.fit(x, y, batch_size=8, epochs=2, seed=3, verbose=0, output_dir=opts.output_dir, save_strategy="steps",
              save_steps=4, logging_strategy="steps", logging_steps=1, resume_from_checkpoint=opts.resume,
              callbacks=[control], save_async=opts.save_async)
    weights = [p.detach().flatten().tolist() for p in net.parameters()]
    print("RESULT " + json.dumps({"first_step": control.first_step, "global_step": model.state.global_step,
                                   "log_history": [r for r in model.state.log_history if "train_runtime" not in r],
                                   "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
