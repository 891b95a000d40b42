"""Peak host memory of the set-up of an FSDP fit whose `model_init` loads saved weights
(`torch.load` + `load_state_dict`), with `fsdp_load_once=True` (rank 0 loads, the others receive
their shards) and without it (every process loads the whole file and builds the whole module).

Per process: `ru_maxrss` when training begins (after the set-up), and how many times it ran
`model_init`. The launches of the two modes alternate (`--repeats` pairs); medians are printed::

    python -m benchmarks.fsdp_load_once                          # 8 x 2048 (32M parameters, 128 MiB), 2 processes
    python -m benchmarks.fsdp_load_once --width 4096 --repeats 3  # 512 MiB

Linux (ru_maxrss in KiB), CPU, gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2 ** 20


def mlp(width: int, layers: int) -> Any:
    import torch

    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def _worker(opts: argparse.Namespace) -> None:
    import torch

    from fitkit import Model, TrainerCallback

    torch.set_num_threads(1)
    calls = []

    def model_init() -> Any:
        calls.append(1)
        net = mlp(opts.width, opts.layers)
        net.load_state_dict(torch.load(opts.checkpoint, weights_only=True))
        return net

    class SetUp(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB

    model = Model(model_init=model_init).compile("sgd", "mse", strategy="fsdp", devices=opts.procs,
                                                 accelerator="cpu", fsdp_load_once=opts.mode == "once")
    setup = SetUp()
    x = torch.randn(16, opts.width)
    model.fit(x, x, batch_size=16 // opts.procs, max_steps=1, verbose=0, callbacks=[setup])
    with open(os.path.join(opts.results, f"rank-{model.fabric.global_rank}.json"), "w") as f:
        json.dump({"setup_mib": setup.mib, "calls": len(calls)}, f)


def _launch(opts: argparse.Namespace, mode: str, checkpoint: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
                               "--checkpoint", checkpoint, "--results", results, "--procs", str(opts.procs),
                               "--width", str(opts.width), "--layers", str(opts.layers)],
                              capture_output=True, text=True, env=env, timeout=opts.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"the launch failed:\n{proc.stdout}{proc.stderr}")
        ranks = []
        for r in range(opts.procs):
            with open(os.path.join(results, f"rank-{r}.json")) as f:
                ranks.append(json.load(f))
        return ranks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--mode", choices=("once", "each"))
    parser.add_argument("--checkpoint")
    parser.add_argument("--results")
    opts = parser.parse_args(argv)
    if opts.worker:
        _worker(opts)
        return 0
    import torch

    weights_mib = opts.layers * (opts.width * opts.width + opts.width) * 4 / MIB
    runs: dict[str, list[list[dict[str, Any]]]] = {"each": [], "once": []}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = os.path.join(tmp, "weights.pt")
        torch.save(mlp(opts.width, opts.layers).state_dict(), checkpoint)
        for _ in range(opts.repeats):
            for mode in ("each", "once"):
                runs[mode].append(_launch(opts, mode, checkpoint))
    print(f"{opts.layers} x {opts.width} ({weights_mib:.0f} MiB of weights), {opts.procs} processes, "
          f"{opts.repeats} launches per mode, medians")
    print("| fsdp_load_once | rank | model_init runs | set-up peak (MiB) |")
    print("| --- | --- | --- | --- |")
    for mode in ("each", "once"):
        for rank in range(opts.procs):
            peak = statistics.median(r[rank]["setup_mib"] for r in runs[mode])
            print(f"| {mode == 'once'} | {rank} | {runs[mode][0][rank]['calls']} | {peak:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
