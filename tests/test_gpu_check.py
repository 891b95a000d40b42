"""The prepared GPU check (benchmarks/gpu_check.py) runs here: its `--cpu-dry-run` takes every
item's code path, tiny, on the CPU (items that need CUDA say so), and one item's failure is
recorded without losing the others'."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import gpu_check  # noqa: E402
from benchmarks.gpu_items import Skip  # noqa: E402

CUDA_ONLY = ("amp_fp16", "jit_compile", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3",
             "deepspeed_zero3_model_init")


@pytest.mark.slow
def test_the_dry_run_takes_every_items_path_on_the_cpu(tmp_path):
    out = tmp_path / "g.json"
    gpu_check.main(["--cpu-dry-run", "--out", str(out)])
    report = json.loads(out.read_text())
    items = report["items"]
    assert list(items) == list(gpu_check.ITEMS)
    for name in CUDA_ONLY:
        assert items[name]["status"] == "skip" and "no CUDA" in items[name]["reason"], items[name]
    assert items["pytest_gpu"]["status"] == "skip" and "dry run" in items["pytest_gpu"]["reason"]
    assert all(os.path.isfile(os.path.join(ROOT, f)) for f in gpu_check.GPU_TEST_FILES + gpu_check.KERAS_TEST_FILES)
    env = items["environment"]
    assert env["status"] == "pass" and env["fitkit_runs"]["ok"] and env["torch"]
    # bf16-mixed on the CPU: fitkit and the hand-written autocast loop agree bit for bit
    amp = items["amp_bf16"]
    assert amp["status"] == "pass" and amp["weights"]["bitwise"] and amp["losses"]["bitwise"], amp
    assert amp["loss_calls"] == amp["steps"]
    saved = items["async_save"]
    assert saved["status"] == "pass" and saved["resume"]["bitwise"] and saved["saves"] == 2, saved
    speed = items["speed_gpt2"]
    assert speed["status"] == "pass" and not speed["errors"], speed
    assert set(speed["ms_per_step"]) == {"hand", "fitkit", "fabric", "hf_trainer"}
    assert all(t > 0 for t in speed["ms_per_step"].values())
    assert report["counts"] == {"pass": 4, "skip": 7}


def test_an_items_failure_is_recorded_and_the_next_item_runs(tmp_path, monkeypatch):
    def broken(ctx):
        raise RuntimeError("kernel exploded")

    def absent(ctx):
        raise Skip("nothing to do here")

    monkeypatch.setattr(gpu_check, "ITEMS", {"broken": broken, "absent": absent, "fine": lambda ctx: {"x": 1}})
    out = tmp_path / "g.json"
    gpu_check.main(["--cpu-dry-run", "--out", str(out), "--skip", "absent"])
    items = json.loads(out.read_text())["items"]
    assert list(items) == ["broken", "fine"]
    assert items["broken"]["status"] == "fail" and items["broken"]["error"] == "RuntimeError: kernel exploded"
    assert any("kernel exploded" in line for line in items["broken"]["traceback"])
    assert items["fine"] == {"x": 1, "status": "pass", "seconds": items["fine"]["seconds"]}
