"""Checkpoints to an S3 server: how long the training loop is blocked per checkpoint written to a
bucket, synchronous (`save_async=False`) against asynchronous (`save_async=True`), and the whole
run's time with a save every N steps against the same run without saves.

The workload is `async_checkpoint.py`'s (4 x Linear(2048, 2048) with Adam, batch 64, one torch
thread: about 200 MB a checkpoint); `output_dir` is a bucket of moto's S3 server, started as a
separate process on loopback and reached through s3fs, as a user's run would reach an S3
endpoint. The no-save and asynchronous runs alternate; the synchronous ones follow.

    python benchmarks/bucket_checkpoint.py                       # 60 steps, save every 10, 3 reps
    python benchmarks/bucket_checkpoint.py --steps 150 --reps 5 --sync-reps 1
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

import torch

from benchmarks.async_checkpoint import BATCH, WIDTH, _BlockedTimer, _model, _quartiles


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


def run(mode: str, steps: int, every: int, server: int | None = None) -> dict[str, float]:
    """One fit into a fresh bucket: mode "none", "sync" or "async"; wall time, blocked per save,
    and the CPU time the server process (`server`, a pid) and this one used meanwhile."""
    import fsspec

    x, y = torch.randn(steps * BATCH, WIDTH), torch.randn(steps * BATCH, WIDTH)
    model = _model()
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("s3")
    fs.mkdir(bucket)
    with _BlockedTimer() as timer:
        options = {} if mode == "none" else {"save_strategy": "steps", "save_steps": every,
                                             "save_async": mode == "async", "save_total_limit": 2}
        start, served, own = time.perf_counter(), cpu_seconds(server) if server else 0.0, time.process_time()
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, output_dir=f"s3://{bucket}/run",
                  **options)
        wall = time.perf_counter() - start
        served, own = (cpu_seconds(server) - served if server else 0.0), time.process_time() - own
    fs.rm(bucket, recursive=True)  # the server keeps objects in memory
    blocked = statistics.median(timer.times) if timer.times else 0.0
    return {"wall": wall, "blocked": blocked, "saves": len(timer.times), "server_cpu": served, "own_cpu": own}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="save every N steps")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--sync-reps", type=int, default=None)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    server, endpoint = start_server()
    try:
        modes = ("none", "sync", "async")
        sync_reps = opts.reps if opts.sync_reps is None else opts.sync_reps
        results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        run("async", 12, 10)  # warm-up: imports, the s3fs session, the host copy's code paths
        order = [("none", "async") if rep % 2 == 0 else ("async", "none") for rep in range(opts.reps)]
        for mode in [m for pair in order for m in pair] + ["sync"] * sync_reps:
            results[mode].append(run(mode, opts.steps, opts.every, server.pid))
    finally:
        server.kill()
    table = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall", "blocked", "saves", "server_cpu", "own_cpu")}
             for m, rs in results.items()}
    base, sync = table["none"]["wall"], table["sync"]["blocked"]
    paired = [a["wall"] / n["wall"] for a, n in zip(results["async"], results["none"])]
    print(f"{opts.steps} steps, a save every {opts.every} ({int(table['sync']['saves'])} saves) to moto's S3 "
          f"server at {endpoint}, {opts.reps} reps ({sync_reps} synchronous); medians")
    print(f"{'mode':8} {'run (s)':>9} {'vs no saves':>12} {'blocked/save (ms)':>18} {'vs sync':>8} "
          f"{'server CPU (s)':>15} {'run CPU (s)':>12}")
    for mode in modes:
        row = table[mode]
        ratio = f"{row['blocked'] / sync:.1%}" if sync and mode != "none" else "-"
        print(f"{mode:8} {row['wall']:9.2f} {row['wall'] / base:11.3f}x {row['blocked'] * 1000:18.1f} {ratio:>8} "
              f"{row['server_cpu']:15.1f} {row['own_cpu']:12.1f}")
    low, mid, high = _quartiles(paired)
    print(f"async run / its paired no-save run: median {mid:.3f}x [quartiles {low:.3f} .. {high:.3f}]")
    table["paired"] = {"median": mid, "low": low, "high": high}
    return table


if __name__ == "__main__":
    main()
