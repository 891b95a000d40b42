"""The whole process of a one-step fit: `python script.py` that imports, builds a tiny network
and trains one optimizer step, for a hand-written torch loop, fitkit and the HF Trainer.

Each repetition runs the three scripts once each in fresh processes, in an order rotated from
one repetition to the next (interleaved: the machine's drift hits all three alike). Per
process: the wall time from just before the start to the exit, its CPU time (user + system,
from `os.wait4`: on a busy machine the steadier figure) and its peak resident memory
(`ru_maxrss`). Each script counts its optimizer steps through
torch's global optimizer hook and prints them: a script that does not run exactly one step
is an error. The targets (issue 29): fitkit at most 0.5 s and 40 MiB above the hand loop.

    python -m benchmarks.whole_process --reps 7          # add --json out.json to keep the runs

Unix only (`os.wait4`). The HF Trainer is skipped when transformers (or accelerate) is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_SECONDS = 0.5
TARGET_MIB = 40.0

_COMMON = """
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
steps = []
register_optimizer_step_post_hook(lambda *a, **k: steps.append(1))
torch.manual_seed(0)
x, y = torch.randn(64, 32), torch.randint(0, 4, (64,))
"""

SCRIPTS = {
    "hand loop": _COMMON + """
import torch.nn.functional as F
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
opt.zero_grad()
F.cross_entropy(net(x), y).backward()
opt.step()
print("STEPS", len(steps))
""",
    "fitkit": _COMMON + """
from fitkit import Model
net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
Model(net).compile("adam", "cross_entropy").fit(x, y, batch_size=64, epochs=1, verbose=0)
print("STEPS", len(steps))
""",
    "HF Trainer": _COMMON + """
import sys
from transformers import Trainer, TrainingArguments

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def forward(self, x, labels=None):
        logits = self.body(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

args = TrainingArguments(output_dir=sys.argv[1], max_steps=1, per_device_train_batch_size=64, learning_rate=1e-3,
                         logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                         max_grad_norm=0)
Trainer(model=Net(), args=args, train_dataset=[{"x": x[i], "labels": y[i]} for i in range(64)]).train()
print("STEPS", len(steps))
""",
}


def _env() -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.setdefault(var, "1")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONWARNINGS"] = "ignore"
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # As an installed package: the bytecode is cached (the untimed first runs write it), so no
    # process compiles fitkit's sources again (0.15 s and more), as none compiles torch's.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_once(name: str, env: dict) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MiB) of one process running `SCRIPTS[name]`."""
    with tempfile.TemporaryDirectory() as out:
        # files, not pipes: the child is reaped by `os.wait4` (for its rusage), not by subprocess
        with open(os.path.join(out, "stdout"), "w+") as stdout, open(os.path.join(out, "stderr"), "w+") as stderr:
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-c", SCRIPTS[name], out], env=env, cwd=out,
                                    stdout=stdout, stderr=stderr)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            proc.returncode = code = os.waitstatus_to_exitcode(status)
            stdout.seek(0)
            stderr.seek(0)
            printed, errors = stdout.read(), stderr.read()
    if code or "STEPS 1" not in printed.splitlines():
        raise RuntimeError(f"{name}: exit {code}, output {printed[-500:]!r}\n{errors[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # Linux: KiB


def available() -> list[str]:
    names = ["hand loop", "fitkit"]
    try:
        import importlib.util

        if importlib.util.find_spec("transformers") and importlib.util.find_spec("accelerate"):
            names.append("HF Trainer")
    except ImportError:  # pragma: no cover
        pass
    return names


def measure(reps: int = 5, names: list[str] | None = None, log=print) -> dict:
    names = names or available()
    env = _env()
    for name in names:  # untimed: the files come into the page cache
        run_once(name, env)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    rss: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            seconds, cpu_seconds, mib = run_once(name, env)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
            rss[name].append(mib)
        log(f"rep {rep + 1}/{reps} (wall / cpu / peak RSS): " + "  ".join(
            f"{n} {wall[n][-1]:.2f}s/{cpu[n][-1]:.2f}s/{rss[n][-1]:.0f} MiB" for n in names))
    # per repetition, fitkit minus the hand loop (the processes of one repetition ran back to back)
    def extra(runs: dict) -> float:
        return statistics.median(f - h for f, h in zip(runs["fitkit"], runs["hand loop"]))

    return {"reps": reps, "wall": wall, "cpu": cpu, "peak_rss_mib": rss,
            "median_wall": {n: statistics.median(v) for n, v in wall.items()},
            "median_cpu": {n: statistics.median(v) for n, v in cpu.items()},
            "median_peak_rss_mib": {n: statistics.median(v) for n, v in rss.items()},
            "fitkit_minus_hand_seconds": extra(wall),
            "fitkit_minus_hand_cpu_seconds": extra(cpu),
            "fitkit_minus_hand_mib": extra(rss),
            "targets": {"seconds": TARGET_SECONDS, "mib": TARGET_MIB}}


def table(result: dict) -> str:
    hand = {k: result[k]["hand loop"] for k in ("median_wall", "median_cpu", "median_peak_rss_mib")}
    rows = ["| process | wall | vs hand loop | CPU time | vs hand loop | peak RSS | vs hand loop |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, seconds in result["median_wall"].items():
        cpu, mib = result["median_cpu"][name], result["median_peak_rss_mib"][name]
        rows.append(f"| {name} | {seconds:.2f} s | {seconds - hand['median_wall']:+.2f} s | {cpu:.2f} s | "
                    f"{cpu - hand['median_cpu']:+.2f} s | {mib:.0f} MiB | {mib - hand['median_peak_rss_mib']:+.0f} MiB |")
    ok_s = result["fitkit_minus_hand_seconds"] <= TARGET_SECONDS
    ok_m = result["fitkit_minus_hand_mib"] <= TARGET_MIB
    rows.append("")
    rows.append(f"fitkit - hand loop, median per repetition: {result['fitkit_minus_hand_seconds']:+.2f} s wall "
                f"(target <= {TARGET_SECONDS} s: {'met' if ok_s else 'NOT met'}), "
                f"{result['fitkit_minus_hand_cpu_seconds']:+.2f} s CPU, "
                f"{result['fitkit_minus_hand_mib']:+.0f} MiB (target <= {TARGET_MIB:.0f} MiB: "
                f"{'met' if ok_m else 'NOT met'})")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None, help="write the runs here")
    opts = parser.parse_args(argv)
    result = measure(opts.reps)
    print(table(result))
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
