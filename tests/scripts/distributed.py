"""Distributed runs for the tests: each process writes what it computed to RESULTS/rank-N.json.

usage: distributed.py [--strategy ddp|fsdp|...] [--devices N] [--num-nodes N] [--mode train|search]
                      [--output DIR] [--save-steps K] [--max-steps K] [--resume] [--full-checkpoint]
                      [--expect-resume] [--init-seed N] [--wait-for-sigterm-at STEP]

`--expect-resume` resumes and fails (exit code 3) when no checkpoint was loaded; `--init-seed`
gives other initial weights than the reference's (0), so only a real resume ends equal to it.
`--wait-for-sigterm-at` holds every process at the end of that step until its SIGTERM arrived.
"""

import argparse
import json
import os
import signal
import sys
import time


class _ImportClock:
    """A meta path finder that notes when this process began importing `lightning_fabric`
    (seconds since boot) and finds nothing itself."""

    began = None

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "lightning_fabric" and cls.began is None:
            cls.began = time.clock_gettime(time.CLOCK_BOOTTIME)
        return None


sys.meta_path.insert(0, _ImportClock)

import padded_ddp  # noqa: E402
import torch  # noqa: E402

from fitkit import Model, TrainerCallback  # noqa: E402


def process_started():
    """When this process was created, in seconds since boot (Linux: /proc/self/stat, field 22)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(203, 8, generator=g)
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).long()
    return x, y


def net(hidden=16, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(hidden, 2))


def full_weights(model):
    out = []
    for p in model.module.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(t.detach().cpu().flatten().tolist())
    return out


class Prints(TrainerCallback):
    def __init__(self, sleep=0.0, expect_resume=False, wait_at=None):
        self.sleep, self.expect_resume, self.wait_at = sleep, expect_resume, wait_at

    def on_train_begin(self, args, state, control, **kwargs):
        if self.expect_resume and state.global_step == 0:
            os.write(1, b"NOT RESUMED: no checkpoint was loaded\n")
            sys.exit(3)

    def on_log(self, args, state, control, logs=None, **kwargs):
        rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
        os.write(1, f"LOG rank={rank} step={state.global_step}\n".encode())

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.wait_at:
            wait_for_sigterm()
        time.sleep(self.sleep)  # slow steps, so a signal can arrive mid-training

    def on_save(self, args, state, control, **kwargs):
        os.write(1, f"SAVE step={state.global_step}\n".encode())


def wait_for_sigterm(timeout=120.0):
    """Block until SIGTERM arrives at this process; the handler in force (fitkit's) still runs."""
    arrived = []  # a plain list: a lock taken in a handler can deadlock with the code it interrupted
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        arrived.append(signum)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    os.write(1, f"WAITING rank={rank}\n".encode())
    deadline = time.monotonic() + timeout
    try:
        while not arrived:  # a sleep is cut short by the signal, and the handler runs then
            time.sleep(0.05)
            if time.monotonic() > deadline:
                raise TimeoutError("no SIGTERM came")
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(opts):
    x, y = data()
    model = Model(net(seed=opts.init_seed)).compile(
        "adam", "cross_entropy", ["accuracy"], learning_rate=1e-2, strategy=opts.strategy, devices=opts.devices,
        num_nodes=opts.num_nodes, accelerator="cpu", fsdp_full_checkpoint=opts.full_checkpoint)
    options = {}
    if opts.output:
        options.update(output_dir=opts.output, save_strategy="steps", save_steps=opts.save_steps,
                       resume_from_checkpoint=opts.resume or opts.expect_resume)
    if opts.max_steps:
        options["max_steps"] = opts.max_steps
    if opts.report_to:
        options["report_to"] = opts.report_to
    history = model.fit(x, y, epochs=3, batch_size=16, validation_split=0.2, verbose=2, seed=1,
                        logging_strategy="steps", logging_steps=2,
                        callbacks=[Prints(opts.sleep, opts.expect_resume, opts.wait_for_sigterm_at)], **options)
    fabric = model.fabric
    shards = [tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)
              for p in model.module.parameters()]
    result = {
        "rank": fabric.global_rank, "world": fabric.world_size, "zero": model.state.is_world_process_zero,
        "local_zero": model.state.is_local_process_zero, "history": history.history,
        "log_history": [r for r in model.state.log_history if "train_runtime" not in r], "step": model.state.global_step,
        "evaluate": model.evaluate(x, y, batch_size=16, return_dict=True), "predict": model.predict(x, batch_size=16).tolist(),
        "weights": full_weights(model), "shards": shards,
        "started": process_started(), "lightning_import_began": _ImportClock.began,
    }
    if opts.strategy == "ddp":  # outputs of varying length, on the processes this run started
        padded = Model(padded_ddp.PerPosition())
        padded.runtime.fabric, padded.runtime.key = model.fabric, model.runtime.key  # the same processes
        result["padded"] = padded_ddp.calls(padded.compile(strategy="ddp", devices=opts.devices,
                                                           num_nodes=opts.num_nodes, accelerator="cpu"))
    report(opts, result)


def report(opts, result):
    """Each process writes its own file: lines printed by several processes can interleave."""
    with open(os.path.join(opts.results, f"rank-{result['rank']}.json"), "w") as f:
        json.dump(result, f)
    print(f"RESULT {result['rank']}", flush=True)


def search(opts):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x, y = data()
    seen = []

    def model_init(trial):
        hidden = trial.suggest_int("hidden", 4, 32)
        return net(hidden)

    class Record(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            seen.append({"params": state.trial_params, "weights_sum": float(sum(p.sum() for p in model.parameters()))})

    model = Model(model_init=model_init).compile("adam", "cross_entropy", ["accuracy"], strategy=opts.strategy,
                                                 devices=opts.devices, accelerator="cpu")
    storage = f"sqlite:///{opts.output}/study.db" if opts.output else None
    best = model.hyperparameter_search(
        x, y, validation_split=0.2, n_trials=3, direction="maximize", verbose=0, storage=storage,
        study_name="ddp", callbacks=[Record()],
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1, log=True), "epochs": 2})
    report(opts, {"rank": model.fabric.global_rank, "trials": seen, "best": list(best)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--mode", default="train")
    parser.add_argument("--output", default=None)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--expect-resume", action="store_true", help="resume, and fail if nothing was resumed")
    parser.add_argument("--init-seed", type=int, default=0, help="seed of the initial weights")
    parser.add_argument("--wait-for-sigterm-at", type=int, default=None, help="step to wait at for SIGTERM")
    parser.add_argument("--full-checkpoint", action="store_true")
    parser.add_argument("--report-to", default=None)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--results", required=True, help="directory for each process's rank-N.json")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    train(opts) if opts.mode == "train" else search(opts)
