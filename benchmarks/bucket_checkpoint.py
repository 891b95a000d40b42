"""Checkpoints to an S3 server: how long the training loop is blocked per checkpoint written to a
bucket, synchronous (`save_async=False`) against asynchronous (`save_async=True`), and the whole
run's time with a save every N steps against the same run without saves.

The workload is `async_checkpoint.py`'s (4 x Linear(2048, 2048) with Adam, batch 64, one torch
thread: about 200 MB a checkpoint); `output_dir` is a bucket of moto's S3 server, started as a
separate process on loopback and reached through s3fs, as a user's run would reach an S3
endpoint. The no-save and asynchronous runs alternate; the synchronous ones follow.

    python -m benchmarks.bucket_checkpoint            # 120 steps, a save every 40, 2 pairs, 1 synchronous run
    python -m benchmarks.bucket_checkpoint --steps 60 --every 10 --reps 3

The defaults took 78 s on the 2-core development machine at load 1.4 (about 5 min at load 8).
`loop` is the time to the end of the last step: the whole run adds the wait for the last
upload, which no overlap hides. With the server on the same machine, each 200 MB upload costs CPU
(moto's and s3fs's) that the training competes for: choose `--every` so that an upload fits
between two saves (about 40 steps on an idle 2-core machine), or each save waits for the
previous upload to commit (at most one write is in flight: the loop's wait is counted in
"blocked per save").
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import torch

from benchmarks.async_checkpoint import BATCH, WIDTH, _BlockedTimer, _model, _quartiles
from fitkit import TrainerCallback
from fitkit.engine.checkpoint import checkpointer, store


def start_server() -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process on a free loopback port; its endpoint URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("moto's server did not start")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process `pid` has used so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _LastStep(TrainerCallback):
    """The time the last optimizer step ended (the rest of `fit` waits for the last upload)."""

    at = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.at = time.perf_counter()


class _Timed:
    """Times each call of `owner.name` (on whichever thread makes it) while in the block."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name, self.times = owner, name, []
        self._real = getattr(owner, name)

    def __enter__(self) -> _Timed:
        real, times = self._real, self.times

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                times.append(time.perf_counter() - start)

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.owner, self.name, self._real)


def run(mode: str, steps: int, every: int, server: int | None = None) -> dict[str, float]:
    """One fit into a fresh bucket: mode "none", "sync" or "async"; wall time, the time to the
    end of the last step (`loop`; the rest is the wait for the last upload), the loop blocked per
    save (median and longest: the save itself, and before it the wait for the previous upload to
    commit, `Checkpointer.wait_committed`), upload per save, and the CPU time the server process
    (`server`, a pid) and this one used meanwhile."""
    import fsspec

    x, y = torch.randn(steps * BATCH, WIDTH), torch.randn(steps * BATCH, WIDTH)
    model = _model()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("s3")
    fs.mkdir(bucket)
    last = _LastStep()
    with _BlockedTimer() as timer, _Timed(store.Store, "publish") as uploads, \
            _Timed(checkpointer.Checkpointer, "wait_committed") as waits:
        options = {} if mode == "none" else {"save_strategy": "steps", "save_steps": every,
                                             "save_async": mode == "async", "save_total_limit": 2}
        start, served, own = time.perf_counter(), cpu_seconds(server) if server else 0.0, time.process_time()
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, output_dir=f"s3://{bucket}/run",
                  callbacks=[last], **options)
        wall = time.perf_counter() - start
        served, own = (cpu_seconds(server) - served if server else 0.0), time.process_time() - own
    fs.rm(bucket, recursive=True)  # the server keeps objects in memory
    # the loop's waits before each save (the last `wait_committed` is the end of training's)
    before = waits.times[:-1] if mode != "none" else []
    blocked = [t + w for t, w in zip(timer.times, before + [0.0] * (len(timer.times) - len(before)))]
    return {"wall": wall, "loop": last.at - start, "blocked": statistics.median(blocked) if blocked else 0.0,
            "most": max(blocked, default=0.0),
            "upload": statistics.median(uploads.times) if uploads.times else 0.0, "saves": len(timer.times),
            "server_cpu": served, "own_cpu": own}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=40, help="save every N steps")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--sync-reps", type=int, default=1)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    server, endpoint = start_server()
    try:
        modes = ("none", "sync", "async")
        sync_reps = opts.sync_reps
        results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        run("async", 12, 10)  # warm-up: imports, the s3fs session, the host copy's code paths
        order = [("none", "async") if rep % 2 == 0 else ("async", "none") for rep in range(opts.reps)]
        for mode in [m for pair in order for m in pair] + ["sync"] * sync_reps:
            results[mode].append(run(mode, opts.steps, opts.every, server.pid))
    finally:
        server.kill()
    keys = ("wall", "loop", "blocked", "most", "upload", "saves", "server_cpu", "own_cpu")
    table = {m: {k: statistics.median(r[k] for r in rs) for k in keys} for m, rs in results.items()}
    base, loop, sync = table["none"]["wall"], table["none"]["loop"], table["sync"]["blocked"]
    paired = [a["wall"] / n["wall"] for a, n in zip(results["async"], results["none"])]
    print(f"{opts.steps} steps, a save every {opts.every} ({int(table['sync']['saves'])} saves) to moto's S3 "
          f"server at {endpoint}, {opts.reps} reps ({sync_reps} synchronous); medians")
    print(f"{'mode':8} {'run (s)':>8} {'vs none':>8} {'loop (s)':>9} {'vs none':>8} {'blocked/save (ms)':>18} "
          f"{'longest':>8} {'vs sync':>8} {'upload (s)':>10} {'server CPU':>11} {'run CPU':>8}")
    for mode in modes:
        row = table[mode]
        ratio = f"{row['blocked'] / sync:.1%}" if sync and mode != "none" else "-"
        print(f"{mode:8} {row['wall']:8.2f} {row['wall'] / base:7.3f}x {row['loop']:9.2f} {row['loop'] / loop:7.3f}x "
              f"{row['blocked'] * 1000:18.1f} {row['most'] * 1000:8.0f} {ratio:>8} {row['upload']:10.2f} "
              f"{row['server_cpu']:11.1f} {row['own_cpu']:8.1f}")
    low, mid, high = _quartiles(paired)
    print(f"async run / its paired no-save run: median {mid:.3f}x [quartiles {low:.3f} .. {high:.3f}]")
    loops = [a["loop"] / n["loop"] for a, n in zip(results["async"], results["none"])]
    print(f"async loop (to the last step) / its paired no-save one: median {_quartiles(loops)[1]:.3f}x")
    table["paired"] = {"median": mid, "low": low, "high": high}
    return table


if __name__ == "__main__":
    main()
