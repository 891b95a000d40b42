"""A small training run for the preemption tests: prints STEP/SAVE/TRAIN_END lines and a RESULT.

usage: preemptible.py OUTPUT_DIR [--resume] [--expect-resume] [--init-seed N] [--sleep SECONDS]
                      [--wait-for-sigterm-at STEP]

`--expect-resume` makes a run that finds no checkpoint to continue from fail (exit code 3): a
rerun meant to resume proves it did. `--init-seed` gives the module other initial weights than
the reference run's (seed 1): only a checkpoint can make such a run end like the reference.
`--wait-for-sigterm-at` holds the run at the end of that step until SIGTERM has arrived
(printing `WAITING`), so a test can signal at a known step without racing the training.
"""

import argparse
import json
import signal
import sys
import time

import torch

from fitkit import Model, TrainerCallback


class Report(TrainerCallback):
    def __init__(self, sleep, expect_resume, wait_at):
        self.sleep, self.expect_resume, self.wait_at = sleep, expect_resume, wait_at

    def on_train_begin(self, args, state, control, **kwargs):
        print(f"TRAIN_BEGIN {state.global_step}", flush=True)
        if self.expect_resume and state.global_step == 0:
            print("NOT RESUMED: no checkpoint was loaded", flush=True)
            sys.exit(3)

    def on_step_end(self, args, state, control, **kwargs):
        print(f"STEP {state.global_step}", flush=True)
        if state.global_step == self.wait_at:
            wait_for_sigterm()
        time.sleep(self.sleep)

    def on_save(self, args, state, control, **kwargs):
        print(f"SAVE {state.global_step}", flush=True)

    def on_train_end(self, args, state, control, **kwargs):
        print(f"TRAIN_END {state.global_step}", flush=True)


def wait_for_sigterm(timeout=120.0, marker="WAITING"):
    """Print `marker`, then block until SIGTERM arrives; the handler in force (fitkit's) still runs."""
    arrived = []  # a plain list: a lock taken in a handler can deadlock with the code it interrupted
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        arrived.append(signum)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    print(marker, flush=True)
    deadline = time.monotonic() + timeout
    try:
        while not arrived:  # a sleep is cut short by the signal, and the handler runs then
            time.sleep(0.05)
            if time.monotonic() > deadline:
                raise TimeoutError("no SIGTERM came")
    finally:
        signal.signal(signal.SIGTERM, previous)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--expect-resume", action="store_true")
    parser.add_argument("--init-seed", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--wait-for-sigterm-at", type=int, default=None)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, 8, generator=g)
    y = torch.randint(0, 3, (160,), generator=g)
    torch.manual_seed(opts.init_seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 3))
    model = Model(net).compile("adam", "cross_entropy", learning_rate=1e-2)
    report = Report(opts.sleep, opts.expect_resume, opts.wait_for_sigterm_at)
    model.fit(x, y, batch_size=8, epochs=2, seed=3, verbose=0, output_dir=opts.output_dir,
              save_strategy="steps", save_steps=3, logging_strategy="steps", logging_steps=1,
              resume_from_checkpoint=opts.resume or opts.expect_resume, callbacks=[report])
    weights = [p.detach().flatten().tolist() for p in net.parameters()]
    print("RESULT " + json.dumps({"global_step": model.state.global_step,
                                   "log_history": [r for r in model.state.log_history if "train_runtime" not in r],
                                   "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
