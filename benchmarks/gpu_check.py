"""The prepared GPU check: one run on one CUDA GPU (sized for an H200, under 8 minutes with the
installs) that writes every figure to one JSON file.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json      # on the GPU machine (`make gpu-check`)
    python benchmarks/gpu_check.py --cpu-dry-run --out /tmp/g.json # every item's code path, tiny, on the CPU

Items, each run on its own (an exception is recorded as that item's failure, with the end of its
traceback, and the next item runs; the file is rewritten after each item, so a run cut short
keeps what it measured):

- `environment`: torch / CUDA / GPU / package versions, and a first fitkit fit on the GPU (whether
  fitkit imports and runs on the image's torch, below pyproject's tested lower bound);
- `amp_bf16`, `amp_fp16`: `precision="bf16-mixed"` and `"16-mixed"` (loss scaling) against a
  hand-written AMP loop with the same fused AdamW: the losses and weights, bit for bit or the
  largest difference;
- `async_save`: `save_async=True` from CUDA memory: the loop's blocked time per checkpoint against a
  synchronous save (goal <= 10%), and a resume from an asynchronous checkpoint bit-identical;
- `jit_compile`: `compile(jit_compile=True)` on CUDA against eager (losses, compile time);
- `speed_gpt2`: a GPT-2-small-shaped model from its config (124M parameters), bf16, batch 8 x 512:
  fitkit's step against a hand loop with the same fused optimizer (goal <= 1.02x), a Lightning
  Fabric loop and the HF Trainer; the achieved TFLOP/s beside the chip's bf16 peak;
- `pytest_gpu`: the device-aware suite's GPU part (the test files that touch devices, the tests
  marked `cuda` among them) in a subprocess;
- `deepspeed_stage_1/2/3`: fit, checkpoint, resume bit-identical (skipped when deepspeed is not
  importable), and `deepspeed_zero3_model_init`: `model_init` under `zero.Init`.

The GPU machine has no network: fitkit's missing pure-Python dependencies travel as wheels
(benchmarks/gpu_wheels.sh downloads them into .whl/; docs/scaling.md "GPU" has the command).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402

from benchmarks import gpu_deepspeed, gpu_items, gpu_speed  # noqa: E402
from benchmarks.gpu_items import Ctx, Skip  # noqa: E402

#: The test files the GPU part of the suite runs: those that touch devices (their CPU tests run
#: pinned to the CPU by tests/conftest.py, their `cuda`-marked tests on the GPU).
GPU_TEST_FILES = (
    "tests/test_device_pins.py", "tests/test_sampler_epochs.py", "tests/test_fabric_api.py",
    "tests/test_fused_optimizers.py", "tests/test_async_checkpoints.py", "tests/test_local_fabric.py",
    "tests/test_core_fit.py", "tests/test_inference_cost.py", "tests/test_precision_and_strategies.py",
    "tests/test_jit_compile.py",
)
#: Files run only where Keras 3 imports (carried as a wheel: the image has none).
KERAS_TEST_FILES = ("tests/test_keras_optimizers.py", "tests/test_keras_logging.py")


def environment(ctx: Ctx) -> dict[str, Any]:
    """Versions, the device, and whether fitkit imports and fits on it (torch below the tested bound)."""
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "lightning-fabric", "lightning", "transformers", "accelerate", "deepspeed", "keras",
                 "torchmetrics", "numpy", "rich", "optuna"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    record: dict[str, Any] = {"python": platform.python_version(), "versions": versions,
                              "torch": torch.__version__, "cuda": torch.version.cuda,
                              "device": str(ctx.device), "dry_run": ctx.dry}
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        record.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                      multiprocessors=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
    record["fitkit_runs"] = gpu_items.first_fit(ctx)
    return record


def pytest_gpu(ctx: Ctx) -> dict[str, Any]:
    """The device-aware suite's GPU part, in a subprocess (its summary line and exit status)."""
    if ctx.suite == "all":  # the whole suite; a file whose imports are missing here is reported, not fatal
        files = ["tests", "--continue-on-collection-errors"]
        workers = max(1, (os.cpu_count() or 2) - 2)
    else:
        files = list(GPU_TEST_FILES)
        try:
            import keras  # noqa: F401
            files += KERAS_TEST_FILES
        except ImportError:
            pass
        workers = max(1, min(8, (os.cpu_count() or 2) // 2))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "-n", str(workers),
               "--dist", "loadscope", *files]
    if ctx.dry:
        raise Skip(f"dry run: would run {' '.join(command[1:])}")
    if ctx.device.type != "cuda":
        raise Skip("no CUDA: the suite runs on the CPU as `make test`")
    torch.cuda.empty_cache()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=ctx.pytest_timeout)
        output, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as err:  # what it printed so far still says where it was
        output = "".join(_text(part) for part in (err.stdout, err.stderr))
        returncode = f"timed out after {ctx.pytest_timeout} s"
    lines = output.strip().splitlines()
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line)),
                   lines[-1] if lines else "")
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {"status": "pass" if returncode == 0 else "fail", "returncode": returncode, "tail": lines[-40:],
            "summary": summary, "failures": failures[:60], "files": files, "seconds": time.perf_counter() - start,
            "skipped_lines": [line for line in lines if line.startswith("SKIPPED")][:40]}


def _text(part: str | bytes | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else (part or "")


ITEMS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "environment": environment,
    "amp_bf16": lambda ctx: gpu_items.amp(ctx, "bf16-mixed"),
    "amp_fp16": lambda ctx: gpu_items.amp(ctx, "16-mixed"),
    "async_save": gpu_items.async_save,
    "jit_compile": gpu_items.jit_compile,
    "speed_gpt2": gpu_speed.speed_gpt2,
    "pytest_gpu": pytest_gpu,
    # last: DeepSpeed starts a process group in this process
    "deepspeed_stage_1": lambda ctx: gpu_deepspeed.deepspeed_stage(ctx, 1),
    "deepspeed_stage_2": lambda ctx: gpu_deepspeed.deepspeed_stage(ctx, 2),
    "deepspeed_stage_3": lambda ctx: gpu_deepspeed.deepspeed_stage(ctx, 3),
    "deepspeed_zero3_model_init": gpu_deepspeed.zero3_model_init,
}


def run_item(name: str, ctx: Ctx) -> dict[str, Any]:
    """One item: its record with `status` ("pass", "fail", "skip", or what the item set) and
    `seconds`; an exception is the item's failure, never the run's."""
    start = time.perf_counter()
    try:
        record = ITEMS[name](ctx)
        record.setdefault("status", "pass")
    except Skip as skip:
        record = {"status": "skip", "reason": str(skip)}
    except Exception as err:  # noqa: BLE001 - one item's failure must not lose the others' figures
        record = {"status": "fail", "error": f"{type(err).__name__}: {err}",
                  "traceback": traceback.format_exc().splitlines()[-25:]}
    record["seconds"] = round(time.perf_counter() - start, 2)
    gc.collect()
    if ctx.device.type == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception as err:  # noqa: BLE001 - a broken CUDA context is recorded; the next items say more
            record["after"] = f"{type(err).__name__}: {err}"
    return record


def default_out() -> str:
    """$OUT/gpu_check.json on the device machine, else gpu_check.json here."""
    return os.path.join(os.environ.get("OUT") or ".", "gpu_check.json")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="the JSON file to write (default: $OUT/gpu_check.json)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run every item's code path tiny on the CPU (items that need CUDA are skipped)")
    parser.add_argument("--only", nargs="*", default=None, choices=list(ITEMS), help="run these items only")
    parser.add_argument("--skip", nargs="*", default=(), choices=list(ITEMS), help="leave these items out")
    parser.add_argument("--pytest-timeout", type=float, default=240.0, help="seconds for the pytest item")
    parser.add_argument("--suite", choices=("devices", "all"), default="devices",
                        help="the pytest item's tests: the files that touch devices (default), or all of tests/")
    opts = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not opts.cpu_dry_run
    ctx = Ctx(device=torch.device("cuda", 0) if cuda else torch.device("cpu"), dry=opts.cpu_dry_run,
              pytest_timeout=opts.pytest_timeout, suite=opts.suite)
    out = opts.out or default_out()
    names = [n for n in (opts.only or ITEMS) if n not in opts.skip]
    report: dict[str, Any] = {"check": "fitkit GPU check (benchmarks/gpu_check.py)", "argv": sys.argv[1:],
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "items": {}}
    began = time.perf_counter()
    for name in names:
        print(f"[gpu_check] {name} ...", flush=True)
        record = run_item(name, ctx)
        report["items"][name] = record
        report["total_seconds"] = round(time.perf_counter() - began, 2)
        _write(out, report)
        print(f"[gpu_check] {name}: {record['status']} ({record['seconds']} s) "
              f"{record.get('reason') or record.get('error') or ''}", flush=True)
    counts: dict[str, int] = {}
    for record in report["items"].values():
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    report["counts"] = counts
    _write(out, report)
    for line in headline(report):
        print(f"[gpu_check] {line}", flush=True)
    print(f"[gpu_check] {counts} in {report['total_seconds']} s -> {out}", flush=True)
    return report


#: The figures each item's headline shows (keys of its record), after its status.
HEADLINE = {
    "environment": ("torch", "gpu", "fitkit_runs"),
    "amp_bf16": ("weights", "losses"), "amp_fp16": ("weights", "losses"),
    "async_save": ("blocked_fraction", "blocked_ms_sync", "blocked_ms_async", "resume"),
    "jit_compile": ("eager_fit_s", "compiled_fit_s_with_compile", "losses"),
    "speed_gpt2": ("ratio_vs_hand", "ms_per_step", "tflops_per_s", "mfu_fitkit", "errors"),
    "pytest_gpu": ("summary",),
    "deepspeed_stage_1": ("resume_vs_uninterrupted",), "deepspeed_stage_2": ("resume_vs_uninterrupted",),
    "deepspeed_stage_3": ("resume_vs_uninterrupted",),
    "deepspeed_zero3_model_init": ("fabric_init_module", "fitkit_model_init"),
}


def headline(report: dict[str, Any]) -> list[str]:
    """One line per item: its status, reason or error, and its main figures (for a log's tail)."""
    lines = []
    for name, record in report["items"].items():
        figures = {k: record[k] for k in HEADLINE.get(name, ()) if k in record}
        why = record.get("reason") or record.get("error") or ""
        lines.append(f"{name}: {record['status']} {why} {json.dumps(figures, default=str)}".replace("  ", " "))
    return lines


def _write(path: str, report: dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
