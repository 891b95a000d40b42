"""The benchmark harness (benchmarks/) still runs: its smallest configuration, fitkit and the
raw loop only, a few optimizer steps. No peer framework is needed (they are the `bench`
extra, never test dependencies)."""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import common, peers, run  # noqa: E402


def test_fitkit_and_raw_loop_run_exactly_the_requested_steps():
    w = common.workload("tiny", quick=True, steps=5, reps=2)
    with common.StepCounter() as counted:  # torch's global hook: every optimizer step of both
        result = peers.measure(w, common.Env(), ("raw", "fitkit"), fixed_cost=False)
    # each contender: one counted warm-up run and `reps` timed runs of `steps` steps
    assert counted.count == 2 * (1 + w.reps) * w.steps
    assert result["steps_verified"] == {"raw": w.steps, "fitkit": w.steps}
    assert result["frameworks"] == ["raw", "fitkit"] and not result["skipped"]
    for name in ("raw", "fitkit"):
        assert len(result["run_seconds"][name]) == w.reps
        assert all(t > 0 for t in result["run_seconds"][name])
    assert result["ratio"]["raw"]["median"] == 1.0
    assert result["ratio"]["fitkit"]["median"] > 0


def test_a_contender_with_the_wrong_step_count_is_caught():
    w = common.workload("tiny", quick=True, steps=4, reps=1)
    x, y = common.data(w)

    def short() -> common.Contender:  # stops one batch early
        net = common.mlp(w.dims)
        opt = torch.optim.Adam(net.parameters())

        def go():
            for i in range(w.steps - 1):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[i * w.batch:(i + 1) * w.batch]), y[:w.batch]).backward()
                opt.step()

        return common.Contender(go)

    builders = peers.builders(("raw",), common.mlp(w.dims), x, y, w, common.Env())
    builders["short"] = short
    try:
        common.compare(builders, steps=w.steps, reps=w.reps)
    except RuntimeError as err:
        assert "short ran 3 optimizer steps" in str(err)
    else:
        raise AssertionError("a contender running 3 of 4 steps was not caught")


def test_the_command_line_prints_the_table(capsys):
    assert run.main(["--only", "peers", "--peers", "fitkit", "--workload", "tiny", "--device", "cpu",
                     "--steps", "3", "--reps", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "| tiny (32-64-10, batch 64, 3 steps/fit)" in out
    assert "fitkit" in out and "raw loop" in out
