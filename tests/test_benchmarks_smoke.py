"""The benchmark harness (benchmarks/) still runs: its smallest configuration, fitkit and the
two hand-written loops (the raw DataLoader loop and the slicing floor) only, a few optimizer
steps; the per-call table and the prefetch scenario at their smallest. No peer framework is
needed (they are the `bench` extra, never test dependencies)."""

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest  # noqa: E402

from benchmarks import common, fixed, peers, run, scenarios  # noqa: E402


def test_fitkit_and_both_hand_loops_run_exactly_the_requested_steps():
    w = common.workload("tiny", quick=True, steps=5, reps=2)
    with common.StepCounter() as counted:  # torch's global hook: every optimizer step of the three
        result = peers.measure(w, common.Env(), ("raw", "slice", "fitkit"), fixed_cost=False)
    # each contender: one counted warm-up run and `reps` timed runs of `steps` steps
    assert counted.count == 3 * (1 + w.reps) * w.steps
    assert result["steps_verified"] == {"raw": w.steps, "slice": w.steps, "fitkit": w.steps}
    assert result["frameworks"] == ["raw", "slice", "fitkit"] and not result["skipped"]
    for name in ("raw", "slice", "fitkit"):
        assert len(result["run_seconds"][name]) == w.reps
        assert all(t > 0 for t in result["run_seconds"][name])
    assert result["ratio"]["raw"]["median"] == 1.0
    assert result["ratio"]["fitkit"]["median"] > 0
    # the second floor: the same runs, relative to the slicing loop
    assert result["vs_slice"]["whole_fit_ratio"]["slice"]["median"] == 1.0
    assert result["vs_slice"]["whole_fit_ratio"]["fitkit"]["median"] > 0
    from benchmarks.plot import floor_rows  # the figure's targets panel reads them (matplotlib not needed here)

    (row,) = floor_rows({"peers": {"CPU": [result]}})
    assert row["target"] == w.slice_target == 0.85 and row["verdict"] in ("PASS", "borderline", "over")


def test_the_slicing_loop_takes_every_sample_once_per_epoch():
    """The floor does the loop's work: `steps` optimizer steps an epoch, each on a batch of
    distinct samples, every sample once (the network sees which rows it gets)."""
    w = common.workload("tiny", quick=True, steps=6, reps=1)
    x, y = common.data(w)
    x = torch.arange(len(x), dtype=torch.float32)[:, None].expand(-1, w.dims[0]).contiguous()  # row i holds i
    seen = []
    net = common.mlp(w.dims)
    net[0].register_forward_pre_hook(lambda module, args: seen.append(args[0][:, 0].long().tolist()))
    c = peers.build_slice(net, x, y, w, common.Env())
    with common.StepCounter() as counted:
        c.run()
    assert counted.count == w.steps and len(seen) == w.steps
    assert all(len(batch) == w.batch for batch in seen)
    assert sorted(i for batch in seen for i in batch) == list(range(len(x)))


def test_the_per_call_table_runs_smallest():
    w = common.workload("tiny", quick=True)
    result = fixed.measure(w, common.Env(), calls=2, reps=1, names=("raw", "slice", "fitkit"))
    tob = result["train_on_batch"]
    assert tob["steps_verified"]["train_on_batch"] == 2 and tob["steps_verified"]["hand step"] == 2
    one = result["one_step_fit"]
    assert one["steps_verified"] == {"raw": 2, "slice": 2, "fitkit": 2}
    whats = [row["what"] for row in result["rows"]]
    assert "train_on_batch / hand step" in whats
    assert any(w.startswith("one-step fit: fitkit / Poutyne") for w in whats)  # measured or "not measured"
    assert "fused" in result["fitkit_optimizer"]


def test_the_prefetch_scenario_runs_smallest():
    import dataclasses

    w = dataclasses.replace(scenarios.PREFETCH_WORKLOAD, steps=2, reps=1)
    result = scenarios.prefetch(w)
    for name in ("raw", "fitkit(Dataset)", "fitkit(DataLoader)", "raw (again)"):
        assert result["steps_verified"][name] == 2 and result["steps_verified"][f"{name}@1"] == 1
    rows = {row["what"]: row for row in result["rows"]}
    first = next(row for what, row in rows.items() if what.startswith("fitkit given the Dataset, default"))
    assert first["strict"] and first["verdict"] in ("PASS", "within noise", "over")
    if scenarios.prefetch_default() is not None:  # once fitkit has the option, prefetch=False runs too
        assert "fitkit(Dataset) prefetch=False" in result["steps_verified"]


def test_an_option_fitkit_lacks_skips_its_contender():
    net = common.mlp((4, 3))
    with pytest.raises(peers.OptionMissing, match="no_such_option"):
        peers.fitkit_model(net, common.Env(), no_such_option=True)
    model = peers.fitkit_model(net, common.Env())
    with pytest.raises(peers.OptionMissing, match="no_such_fit_option"):
        peers.check_fit_options(model, {"no_such_fit_option": 1})
    assert isinstance(peers.OptionMissing("x"), common.Skip)  # compare skips it with the reason
    assert "jit" in run.parse(["--jit", "--only", "peers"]).parts
    assert "jit" not in run.parse([]).parts  # only when asked


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
    assert "fitkit" in out and "raw loop" in out and "slicing loop" in out
    assert "fitkit against the two hand-written loops" in out and "<= 0.85" in out


def test_the_search_and_inference_comparisons_run_smallest(capsys):
    pytest.importorskip("optuna")
    pytest.importorskip("sklearn")
    from benchmarks import inference, search_trial

    searched = search_trial.main(["--trials", "1", "--epochs", "1", "--reps", "1"])
    assert len(searched["wall"]["hand"]) == len(searched["wall"]["fitkit"]) == 1
    # fitkit's values are checked against the hand loop's before anything is timed
    inferred = inference.main(["--samples", "3000", "--loader-samples", "2000", "--reps", "1"])
    assert set(inferred) >= {"evaluate, tensors", "predict, tensors", "evaluate, DataLoader", "predict, DataLoader"}
    assert "fitkit / hand" in capsys.readouterr().out


@pytest.mark.slow
def test_the_hf_task_shapes_run_smallest(capsys):
    """The seq2seq shape's three trainers run the same number of steps (checked in the warm-up),
    and fitkit's evaluation with generation gives the hand `generate` loop's values (checked
    before timing); the other shapes build their data, collator and model."""
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    from benchmarks import hf_tasks

    assert hf_tasks.main(["--size", "smoke", "--reps", "1", "--tasks", "seq2seq"]) == 0
    out = capsys.readouterr().out
    assert "| seq2seq |" in out and "| whole `evaluate` call |" in out
    size = hf_tasks.SIZES["smoke"]
    for name in ("token_classification", "causal_lm"):
        task = hf_tasks.build(name, size)
        batch = task.collator([task.train[i] for i in range(size.batch)])
        assert task.make_net()(**batch).loss.item() > 0


@pytest.mark.slow
@pytest.mark.timeout(900)  # a launch of two processes and a reference process, on a busy machine
def test_the_fsdp_memory_benchmark_runs_smallest():
    """Two processes with the tiny model (its own baseline): the peaks are read in each process,
    and the shards after the step are compared with an unsharded step."""
    from helpers import reserved_port

    from benchmarks import fsdp_memory

    opts = argparse.Namespace(
        procs=[2], optimizers=["sgd"], width=fsdp_memory.TINY[0], layers=fsdp_memory.TINY[1], timeout=600,
        verbose=False, tune_cpu_allocator=1)
    with reserved_port() as port:
        (row,) = fsdp_memory.measure(opts, env=dict(os.environ, MASTER_PORT=str(port)))
    assert row["procs"] == 2 and row["optimizer"] == "sgd"
    assert 100 < row["tiny_peak_mib"] == row["peak_mib"] and row["setup_mib"] <= row["peak_mib"]
    assert row["max_abs_difference"] < 1e-6
    assert "| 2 | sgd |" in fsdp_memory.table([row])
