"""Elastic resume runs for tests/test_elastic.py: each process writes RESULTS/run-R-rank-N.json.

Every training sample carries its id in a 9th column that the module records (in training mode)
and drops before its layers, so a test can tell exactly which samples each process trained on.

usage: elastic.py --results DIR --output DIR [--strategy auto|ddp|fsdp] [--devices N] [--num-nodes N]
                  [--sharding full|hybrid] [--full-checkpoint] [--batch-size B] [--save-steps K]
                  [--max-steps K] [--resume CHECKPOINT ...] [--init-seed S] [--optimizer adam|sgd|momentum]
                  [--async] [--runs JSON] [--staging-per-rank DIR] [--log-reads DIR]
"""

import argparse
import json
import os

import torch

from fitkit import Model, TrainerCallback

SAMPLES, FEATURES, SEED = 160, 8, 1  # SEED: the run's `seed`, which orders each epoch's samples


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).long()
    ids = torch.arange(SAMPLES, dtype=torch.float32)[:, None]
    return torch.cat([x, ids], dim=1), y


class Net(torch.nn.Module):
    """A small classifier that records the ids of the samples it trains on, per epoch."""

    def __init__(self, init_seed):
        super().__init__()
        torch.manual_seed(init_seed)
        self.body = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        self.epoch, self.seen = 0, []

    def forward(self, x):
        if self.training:
            self.seen.append([self.epoch, x[:, FEATURES].long().tolist()])
        return self.body(x[:, :FEATURES])


def full_state(net, optimizer):
    """Every weight and optimizer value, whole (gathered from the shards), by parameter name."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    def whole(t):
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        return t.detach().cpu().flatten().tolist()

    weights = {name: whole(p) for name, p in net.named_parameters()}
    if not optimizer.optimizer.state:  # a fresh run: reading it would initialise it (a zero step)
        return {"weights": weights, "optimizer": {}}
    optim = get_optimizer_state_dict(net, optimizer.optimizer, options=StateDictOptions(full_state_dict=True))
    return {"weights": weights,
            "optimizer": {name: {k: whole(torch.as_tensor(v)) for k, v in values.items()}
                          for name, values in optim["state"].items()}}


class Track(TrainerCallback):
    """The state right after a resume loaded it (at `on_train_begin`), and at every save."""

    def __init__(self):
        self.begin, self.saves = None, {}

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        model.seen.clear()  # what the data checks ran before training is not training
        self.begin = {"step": state.global_step, **full_state(model, optimizer)}

    def on_epoch_begin(self, args, state, control, model=None, **kwargs):
        model.epoch = int(state.epoch)

    def on_save(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.saves[state.global_step] = full_state(model, optimizer)


#: `--optimizer`: Adam, SGD without state (no momentum) and SGD with a momentum buffer.
OPTIMIZERS = {"adam": "adam", "sgd": lambda params: torch.optim.SGD(params, lr=1e-2),
              "momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9)}


def plan(opts):
    """The fits to make in turn, on the same processes, each a dict of `optimizer`, `resume`,
    `max_steps`, `save_async` and `batch_size`: `--runs` (a JSON list of such dicts, the rest
    taken from the options; each run compiles afresh), else one fit per `--resume` checkpoint,
    or per `--optimizer` name (each resuming the `--resume` of its place, if given)."""
    base = {"optimizer": "adam", "resume": None, "max_steps": opts.max_steps, "save_async": opts.save_async,
            "batch_size": opts.batch_size, "fresh": True}
    if opts.runs:
        return [{**base, **run} for run in json.loads(opts.runs)]
    names = opts.optimizer.split(",")
    resumes = opts.resume or [None] * len(names)
    names = names * len(resumes) if len(names) == 1 else names
    return [{**base, "optimizer": name, "resume": resume, "fresh": False} for name, resume in zip(names, resumes)]


def main(opts):
    x, y = data()
    net = Net(opts.init_seed)
    model, compiled = Model(net), None
    for run, spec in enumerate(plan(opts)):
        if spec["fresh"] or spec["optimizer"] != compiled:  # a fresh optimizer (the module keeps its weights)
            compiled = spec["optimizer"]
            model.compile(OPTIMIZERS[compiled], "cross_entropy", learning_rate=1e-2, strategy=opts.strategy,
                          devices=opts.devices, num_nodes=opts.num_nodes, accelerator="cpu",
                          fsdp_full_checkpoint=opts.full_checkpoint, fsdp_sharding=opts.sharding)
        track = Track()
        options = {"resume_from_checkpoint": spec["resume"]} if spec["resume"] else {}
        if spec["max_steps"]:
            options["max_steps"] = spec["max_steps"]
        model.fit(x, y, epochs=2, batch_size=spec["batch_size"], seed=SEED, verbose=0,
                  output_dir=os.path.join(opts.output, str(run)), save_strategy="steps", save_steps=opts.save_steps,
                  callbacks=[track], save_async=spec["save_async"], **options)
        report(opts, run, model, track)


def report(opts, run, model, track):
    """This process's record of one fit, in its own file: RESULTS/run-R-rank-N.json."""
    net, rank = model.module, model.fabric.global_rank
    result = {
        "rank": rank, "world": model.fabric.world_size, "step": model.state.global_step, "seen": net.seen,
        "begin": track.begin, "saves": track.saves, "end": full_state(net, model.optimizer),
        "shards": {name: list(p.to_local().shape) if hasattr(p, "to_local") else list(p.shape)
                   for name, p in net.named_parameters()},
        "local": {name: (p.to_local() if hasattr(p, "to_local") else p).detach().flatten().tolist()
                  for name, p in net.named_parameters()},
    }
    with open(os.path.join(opts.results, f"run-{run}-rank-{rank}.json"), "w") as f:
        json.dump(result, f)


def log_reads(where):
    """Record every object read (S3's GetObject, whatever fitkit's call reached it) in `where`:
    its key and the byte range read (`bytes=A-B`, or `whole`), one line each."""
    import s3fs

    call = s3fs.S3FileSystem._call_s3

    async def logged(self, method, *args, **kwargs):
        if method == "get_object":
            with open(where, "a") as f:
                f.write(f"{kwargs.get('Bucket')}/{kwargs.get('Key')} {kwargs.get('Range', 'whole')}\n")
        return await call(self, method, *args, **kwargs)

    s3fs.S3FileSystem._call_s3 = logged


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True, help="directory for each process's run-R-rank-N.json")
    parser.add_argument("--output", required=True, help="the runs' output_dir is OUTPUT/R")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--sharding", default="full")
    parser.add_argument("--full-checkpoint", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--save-steps", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--resume", action="append", help="a checkpoint's path (a missing one is an error); "
                        "repeat it to resume several checkpoints in turn")
    parser.add_argument("--init-seed", type=int, default=0, help="the module's initial weights")
    parser.add_argument("--optimizer", default="adam", help="adam, sgd or momentum; several, comma-separated: "
                        "one run each")
    parser.add_argument("--async", dest="save_async", action="store_true", help="save_async=True")
    parser.add_argument("--runs", default=None, help="a JSON list of per-run options (see `plan`)")
    parser.add_argument("--staging-per-rank", default=None, help="a staging folder of each process's own "
                        "(DIR/rank-N), as on separate machines, for checkpoints in a bucket")
    parser.add_argument("--log-reads", default=None, help="append the key (and byte range) of every object "
                        "this process reads from an S3 server to DIR/reads-rank-N.txt")
    opts = parser.parse_args()
    if opts.log_reads:
        log_reads(os.path.join(opts.log_reads, f"reads-rank-{os.environ.get('LOCAL_RANK', '0')}.txt"))
    if opts.staging_per_rank:  # Fabric's launcher starts the other processes with their LOCAL_RANK
        os.environ["FITKIT_STAGING_DIR"] = os.path.join(opts.staging_per_rank,
                                                        f"rank-{os.environ.get('LOCAL_RANK', '0')}")
    torch.set_num_threads(1)
    main(opts)
