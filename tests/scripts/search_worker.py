"""One search worker for the cluster tests: a tiny MLP searched over the learning rate.

usage: search_worker.py STORAGE OUTPUT_DIR [--journal] [--n-trials N] [--study NAME]
                        [--heartbeat S] [--grace S] [--retry S] [--hold STEP] [--sleep S]
                        [--enqueue JSON] [--epochs N] [--report-to NAMES] [--final DIR]

STORAGE is a database URL, or with `--journal` the path of a JournalStorage file. The run
prints `BEGIN number global_step` when a trial's training starts, `EVAL number epoch step`
after each evaluation, and saves the trial's final weights as `final.pt` in its output_dir (with
`--final DIR`: as DIR/<trial folder>.pt, for an output_dir in a bucket).
`--hold STEP` holds the first trial at the end of optimizer step STEP (printing `HOLD`) until
the process is killed or sent SIGTERM (fitkit's handler still runs). `--enqueue JSON` queues
those parameters first (a reference run of one configuration). `--report-to` names trackers
(comma-separated, fit's `report_to`).
"""

import argparse
import json
import os
import time

import torch
from preemptible import wait_for_sigterm  # this folder: the script's own directory is on sys.path

from fitkit import Model, TrainerCallback


class Events(TrainerCallback):
    def __init__(self, hold, sleep, final=None):
        self.hold, self.sleep, self.held, self.final = hold, sleep, False, final

    def on_train_begin(self, args, state, control, **kwargs):
        print(f"BEGIN {os.path.basename(args.output_dir)} {state.global_step}", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.sleep:
            time.sleep(self.sleep)
        if self.hold is not None and not self.held and state.global_step == self.hold:
            self.held = True
            hold()

    def on_evaluate(self, args, state, control, **kwargs):
        print(f"EVAL {os.path.basename(args.output_dir)} {state.epoch} {state.global_step}", flush=True)

    def on_train_end(self, args, state, control, model=None, preempted=False, **kwargs):
        if not preempted and model is not None:
            where = os.path.join(args.output_dir, "final.pt") if self.final is None else os.path.join(
                self.final, os.path.basename(args.output_dir) + ".pt")
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, where)


def hold():
    """Block until SIGTERM (then return, fitkit's handler having run) or until killed."""
    wait_for_sigterm(marker="HOLD")


def main(argv=None):
    """Run the worker with `argv` (default: the command line); returns the `BestRun`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("output_dir")
    parser.add_argument("--journal", action="store_true")
    parser.add_argument("--n-trials", type=int, default=4)
    parser.add_argument("--study", default="search")
    parser.add_argument("--heartbeat", type=int, default=1)
    parser.add_argument("--grace", type=int, default=3)
    parser.add_argument("--retry", type=float, default=30.0)
    parser.add_argument("--hold", type=int, default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--enqueue", default=None)
    parser.add_argument("--report-to", default="none")
    parser.add_argument("--final", default=None)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = opts.storage
    if opts.journal:
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(opts.storage))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()

    def model_init(trial):
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                   torch.nn.Linear(16, 2))

    study = None
    if opts.enqueue:
        study = optuna.create_study(storage=storage, study_name=opts.study, load_if_exists=True)
        study.enqueue_trial(json.loads(opts.enqueue))
    model = Model(model_init=model_init).compile("adam", "cross_entropy")
    where = {"study": study} if study is not None else {"storage": storage, "study_name": opts.study,
                                                         "load_if_exists": True}
    best = model.hyperparameter_search(
        x, y, validation_split=0.25, batch_size=16, epochs=opts.epochs, n_trials=opts.n_trials, verbose=0, seed=7,
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1, log=True)},
        output_dir=opts.output_dir, save_strategy="steps", save_steps=4, callbacks=[Events(opts.hold, opts.sleep, opts.final)],
        heartbeat_interval=opts.heartbeat, grace_period=opts.grace, storage_retry_timeout=opts.retry,
        storage_connect_timeout=5, report_to=opts.report_to.split(","), **where)
    print("BEST " + json.dumps({"run_id": best.run_id, "objective": best.objective}), flush=True)
    return best


if __name__ == "__main__":
    main()
