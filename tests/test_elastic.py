"""Elastic resume: a checkpoint written by N processes resumes on M (DDP, FSDP sharded or full,
hybrid FSDP), continuing at the same sample; and hybrid FSDP on 2 simulated nodes x 2 processes.

The processes are real (gloo on CPU), started as subprocesses (`tests/scripts/elastic.py`). Every
sample carries its id, which the module records, so a test sees exactly which samples each
process trained on. A resumed run starts from other initial weights and names its checkpoint by
path (a missing one is an error), and its state right after loading must equal the checkpoint's:
a run that ignored the checkpoint fails every assertion. The quick tests at the end check the
pieces (positions in samples, option checks, safe reading) in this process.
"""

import json
import os
import pickle
import socket
import subprocess
import sys

import pytest
import torch

from fitkit.engine.checkpoint.checkpointer import LoopSnapshot
from fitkit.engine.data.adapt import adapt
from fitkit.engine.data.sampling import epoch_permutation
from fitkit.engine.data.sources import TensorSource

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "elastic.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import elastic as script  # noqa: E402

CUT = 3  # the writers' checkpoint: after 3 optimizer steps


def _results(directory, run, world):
    out = []
    for rank in range(world):
        with open(os.path.join(directory, f"run-{run}-rank-{rank}.json")) as f:
            out.append(json.load(f))
    assert [r["rank"] for r in out] == list(range(world)) and all(r["world"] == world for r in out)
    return out


def _launch(tmp, name, *args, runs=1, world=1):
    """Run the script (Fabric's launcher starts the other processes); each run's per-rank results."""
    results, output = tmp / f"{name}-results", tmp / name
    results.mkdir()
    proc = subprocess.run([sys.executable, SCRIPT, "--results", str(results), "--output", str(output), *args],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return output, [_results(results, run, world) for run in range(runs)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(tmp, name, *args):
    """2 nodes x 2 processes simulated on loopback: one torchrun per node."""
    results, output = tmp / f"{name}-results", tmp / name
    results.mkdir()
    port, procs = str(_free_port()), []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
               f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", SCRIPT,
               "--results", str(results), "--output", str(output), "--devices", "2", "--num-nodes", "2", *args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        out, _ = proc.communicate(timeout=400)
        assert proc.returncode == 0, out
    return output, _results(results, 0, 4)


def _order(results, epoch):
    """The samples all processes trained on in `epoch`, in the epoch's global order: each process's
    ids interleaved sample by sample, as the order is dealt to them."""
    local = [[i for e, ids in r["seen"] if e == epoch for i in ids] for r in results]
    assert len({len(ids) for ids in local}) == 1, "every process makes as many steps"
    return [ids[j] for j in range(len(local[0])) for ids in local]


def _check_resumed(writer, resumed, samples, stateful=True):
    """`resumed` loaded the writer's checkpoint at step CUT exactly and went on at sample `samples`."""
    saved = writer[0]["saves"][str(CUT)]
    assert bool(saved["optimizer"]) == stateful, "the checkpoint holds optimizer state (SGD without momentum: none)"
    for r in resumed:
        assert r["begin"]["step"] == CUT
        assert r["begin"]["weights"] == saved["weights"]  # every weight, gathered whole, bit for bit
        assert r["begin"]["optimizer"] == saved["optimizer"]  # Adam's moments and steps, resharded
    first = epoch_permutation(script.SAMPLES, script.SEED, 0).tolist()
    assert _order(writer, 0)[:samples] == first[:samples]
    assert _order(resumed, 0) == first[samples:]  # exactly the rest of the epoch, in its order
    assert _order(resumed, 1) == epoch_permutation(script.SAMPLES, script.SEED, 1).tolist()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("elastic")


@pytest.fixture(scope="module")
def hybrid(tmp):
    """Hybrid FSDP on 2 nodes x 2 processes (batch 8: 32 samples a step), checkpoints every 3 steps."""
    return _two_nodes(tmp, "hybrid", "--strategy", "fsdp", "--sharding", "hybrid")


def _runs(*specs):
    """`--runs`: the fits one launch makes in turn (see tests/scripts/elastic.py's `plan`)."""
    return ("--runs", json.dumps(list(specs)))


def _checkpoints(output, runs):
    return [os.path.join(output, str(run), f"checkpoint-{CUT}") for run in runs]


#: SGD without momentum has no state yet when a checkpoint is written.
OPTIMIZERS = ("sgd", "momentum", "adam")


@pytest.fixture(scope="module")
def writers(tmp, hybrid):
    """Checkpoints at step CUT, each with the samples consumed by then (over all processes), from
    as few launches as the strategies allow:

    - DDP x2: 2 x 16 samples a step (as hybrid FSDP's 4 x 8, to compare with it); then Adam
      written asynchronously;
    - FSDP x2: a whole run (the reference of a resume on 2); then each optimizer; then Adam
      written asynchronously;
    - FSDP on one process; and one process without a strategy, each optimizer.
    """
    cut = {"max_steps": CUT}
    ddp = _launch(tmp, "ddp2", "--strategy", "ddp", "--devices", "2",
                  *_runs({"batch_size": 16}, {"save_async": True, **cut}), runs=2, world=2)
    fsdp = _launch(tmp, "fsdp2", "--strategy", "fsdp", "--devices", "2",
                   *_runs({}, *({"optimizer": name, **cut} for name in OPTIMIZERS), {"save_async": True, **cut}),
                   runs=5, world=2)
    fsdp1 = _launch(tmp, "fsdp1", "--strategy", "fsdp", "--devices", "1", "--max-steps", str(CUT))
    one = _launch(tmp, "m-one", "--optimizer", ",".join(OPTIMIZERS), "--max-steps", str(CUT), runs=3)
    found = {}
    for name, (output, runs), run, samples in (("ddp2", ddp, 0, 96), ("fsdp2", fsdp, 0, 48), ("fsdp1", fsdp1, 0, 24),
                                               ("hybrid", hybrid, 0, 96)):
        path = os.path.join(output, str(run), f"checkpoint-{CUT}")
        assert os.path.isdir(os.path.join(path, "state.pt")) == (name != "ddp2")  # DCP shards but for DDP
        found[name] = (path, runs[run] if name != "hybrid" else runs, samples)
    found["matrix"] = {"one": one, "fsdp2": (fsdp[0], fsdp[1][1:4]), "ddp2-async": (ddp[0], ddp[1][1]),
                       "fsdp2-async": (fsdp[0], fsdp[1][4])}
    return found


@pytest.fixture(scope="module")
def resumed(tmp, writers):
    """Every resume, one launch for 2 processes (FSDP) and one for a single process (no strategy):
    the writers' checkpoints, then each optimizer's."""
    matrix = writers["matrix"]
    one_out, _ = matrix["one"]
    fsdp_out, ddp_out = matrix["fsdp2"][0], matrix["ddp2-async"][0]
    on2 = [{"resume": writers[name][0]} for name in ("fsdp1", "fsdp2", "hybrid")]
    on2 += [{"resume": path, "optimizer": name} for name, path in zip(OPTIMIZERS, _checkpoints(one_out, range(3)))]
    _, two = _launch(tmp, "on2", "--strategy", "fsdp", "--devices", "2", "--init-seed", "7", *_runs(*on2),
                     runs=len(on2), world=2)
    on1 = [{"resume": writers[name][0]} for name in ("ddp2", "fsdp2", "hybrid")]
    on1 += [{"resume": path, "optimizer": name} for name, path in zip(OPTIMIZERS, _checkpoints(fsdp_out, (1, 2, 3)))]
    on1 += [{"resume": path} for path in (*_checkpoints(ddp_out, (1,)), *_checkpoints(fsdp_out, (4,)))]
    _, one = _launch(tmp, "on1", "--init-seed", "7", *_runs(*on1), runs=len(on1))
    return {"on2": two, "on1": one}


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its module fixtures launch several runs of 2-4 processes: minutes on a busy machine
def test_one_process_resumes_ddp_fsdp_and_hybrid_checkpoints_at_the_same_sample(writers, resumed):
    for name, runs in zip(("ddp2", "fsdp2", "hybrid"), resumed["on1"]):  # written by 2, 2 and 4 processes
        _, writer, samples = writers[name]
        _check_resumed(writer, runs, samples)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its module fixtures launch several runs of 2-4 processes: minutes on a busy machine
def test_two_processes_resume_fsdp_checkpoints_of_one_two_and_four_processes(writers, resumed):
    runs = resumed["on2"][:3]
    for name, runs_of in zip(("fsdp1", "fsdp2", "hybrid"), runs):
        _, writer, samples = writers[name]
        _check_resumed(writer, runs_of, samples)
    same = runs[1]  # 2 -> 2: the same processes and batches as the writer, so the same run to the end
    assert [r["end"] for r in same] == [writers["fsdp2"][1][0]["end"]] * 2


@pytest.mark.slow
@pytest.mark.timeout(1200)  # its module fixtures launch several runs of 2-4 processes: minutes on a busy machine
def test_hybrid_sharding_on_two_nodes_matches_ddp(hybrid, writers):
    _, hsdp = hybrid
    runs = writers["ddp2"][1]  # the same 32 samples a step, the gradient averaged over them
    assert all(r["end"] == hsdp[0]["end"] for r in hsdp)
    for name, weights in hsdp[0]["end"]["weights"].items():
        torch.testing.assert_close(torch.tensor(weights), torch.tensor(runs[0]["end"]["weights"][name]),
                                   rtol=1e-4, atol=1e-5)
    whole = {name: len(w) for name, w in hsdp[0]["end"]["weights"].items()}
    for r in hsdp:  # each process holds half of every parameter: sharded within its node ...
        assert {name: torch.Size(shape).numel() for name, shape in r["shards"].items()} == {
            name: n // 2 for name, n in whole.items()}
    assert hsdp[0]["local"] == hsdp[2]["local"] and hsdp[1]["local"] == hsdp[3]["local"]  # ... replicated across
    assert hsdp[0]["local"] != hsdp[1]["local"]


# -- every optimizer, with and without state: one process <-> FSDP x2; asynchronous writers ---------------
@pytest.mark.slow
@pytest.mark.timeout(1200)  # its module fixtures launch several runs of 2-4 processes: minutes on a busy machine
def test_every_optimizer_resumes_from_one_process_on_fsdp_and_back(writers, resumed):
    matrix = writers["matrix"]
    _, one = matrix["one"]
    for name, writer, runs in zip(OPTIMIZERS, one, resumed["on2"][3:]):
        _check_resumed(writer, runs, 24, stateful=name != "sgd")
    _, fsdp = matrix["fsdp2"]
    for name, writer, runs in zip(OPTIMIZERS, fsdp, resumed["on1"][3:6]):
        _check_resumed(writer, runs, 48, stateful=name != "sgd")
    (_, ddp_async), (fsdp_out, fsdp_async) = matrix["ddp2-async"], matrix["fsdp2-async"]
    _check_resumed(ddp_async, resumed["on1"][6], 48)  # asynchronous checkpoints, written from a host copy
    _check_resumed(fsdp_async, resumed["on1"][7], 48)
    assert not os.path.isdir(os.path.join(fsdp_out, "4", f"checkpoint-{CUT}", "state.pt"))  # one file, gathered


# -- the pieces, in this process ----------------------------------------------------------------------
def _ids(batches):
    return [int(i) for b in batches for i in b.inputs[0][:, 0]]


def _tensor_source(rank, world, batch_size, total=163):
    source = TensorSource(torch.arange(total, dtype=torch.float32)[:, None], batch_size=batch_size, shuffle=True,
                          seed=1)
    source.shard(rank, world, pad=True)
    return source


@pytest.mark.parametrize("world, batch_size", [(1, 8), (1, 5), (2, 8), (3, 4), (2, 16)])
def test_a_position_in_samples_continues_at_the_same_sample_on_any_processes(world, batch_size):
    writers = [_tensor_source(rank, 2, 8) for rank in range(2)]  # 2 processes x batch 8: 16 samples a step
    done = [_ids(list(w.batches(0))[:3]) for w in writers]
    samples = writers[0].consumed(0, 3)
    first = epoch_permutation(163, 1, 0).tolist()
    assert samples == 48 and sorted(done[0] + done[1]) == sorted(first[:48])
    position = LoopSnapshot(epoch=0, batch=3, samples=samples, world_size=2)
    sources = [_tensor_source(rank, world, batch_size) for rank in range(world)]
    starts = [s.resume_at(position) for s in sources]
    rest = [_ids(s.batches(0, start)) for s, start in zip(sources, starts)]
    assert len({len(r) for r in rest}) == 1  # as many steps on every process
    dealt = [r[j] for j in range(len(rest[0])) for r in rest]
    padding = (-(163 - 48)) % world
    assert dealt[: 163 - 48] == first[48:] and len(dealt) == 163 - 48 + padding
    assert all(len(s) - start == -(-len(r) // batch_size) for s, start, r in zip(sources, starts, rest))
    assert sources[0].consumed(0, starts[0] + 1) == 48 + batch_size * world


def test_same_processes_and_batch_size_continue_as_the_uninterrupted_epoch():
    for rank in range(2):
        uninterrupted = _ids(list(_tensor_source(rank, 2, 8).batches(0))[3:])
        source = _tensor_source(rank, 2, 8)
        start = source.resume_at(LoopSnapshot(epoch=0, batch=3, samples=48, world_size=2))
        assert start == 3 and _ids(source.batches(0, start)) == uninterrupted


@pytest.mark.parametrize("world", [2, 3])
def test_fitkit_deals_an_epoch_as_distributed_sampler_does(world):
    """fitkit's own sampler (a DistributedSampler, so Fabric keeps it) deals the epoch's order to
    the processes exactly as Fabric's wrapper around it did: runs from the start are unchanged."""
    from torch.utils.data import DistributedSampler

    from fitkit.engine.data.sampling import deal

    order = epoch_permutation(163, 1, 0)
    for rank in range(world):
        theirs = [int(order[i]) for i in DistributedSampler(range(163), num_replicas=world, rank=rank, shuffle=False)]
        assert deal(order, 0, rank, world).tolist() == theirs


def test_a_dataset_resumes_at_the_same_sample_with_another_batch_size():
    from helpers import Pairs

    x = torch.arange(163, dtype=torch.float32)[:, None]
    source, _ = adapt(Pairs(x, torch.zeros(163)), batch_size=5, shuffle=True, seed=1)
    start = source.resume_at(LoopSnapshot(epoch=0, batch=3, samples=48, world_size=2))
    assert _ids(source.batches(0, start)) == epoch_permutation(163, 1, 0)[48:].tolist()
    assert source.consumed(0, start + 1) == 53


def test_a_fit_resumed_with_another_batch_size_trains_on_the_rest_of_the_epoch(tmp_path):
    from fitkit import Model

    x, y = script.data()
    first = Model(script.Net(0)).compile("adam", "cross_entropy", accelerator="cpu")
    first.fit(x, y, epochs=2, batch_size=5, seed=script.SEED, verbose=0, max_steps=CUT, output_dir=str(tmp_path),
              save_strategy="steps", save_steps=CUT)  # 15 samples: 32 steps an epoch
    net = script.Net(7)
    again = Model(net).compile("adam", "cross_entropy", accelerator="cpu")
    again.fit(x, y, epochs=2, batch_size=16, seed=script.SEED, verbose=0, output_dir=str(tmp_path / "again"),
              resume_from_checkpoint=str(tmp_path / f"checkpoint-{CUT}"), callbacks=[script.Track()])
    by_epoch = [[i for e, ids in net.seen if e == epoch for i in ids] for epoch in (0, 1)]
    assert by_epoch[0] == epoch_permutation(160, script.SEED, 0)[15:].tolist()
    assert by_epoch[1] == epoch_permutation(160, script.SEED, 1).tolist()  # the whole epoch: no early stop
    assert again.state.global_step == again.state.max_steps == CUT + 10 + 10  # 145 samples left, then 160 by 16


@pytest.mark.parametrize("options, message", [
    ({"strategy": "fsdp", "fsdp_sharding": "hybird"}, "did you mean 'hybrid'?"),
    ({"strategy": "ddp", "fsdp_sharding": "hybrid"}, "applies to strategy='fsdp'"),
])
def test_fsdp_sharding_is_checked(options, message):
    from fitkit import Model

    with pytest.raises(ValueError, match="fsdp_sharding") as info:
        Model(torch.nn.Linear(2, 2)).compile("sgd", "mse", accelerator="cpu", **options)
    assert message in str(info.value)


def test_sharded_metadata_holding_code_is_refused_before_it_runs(tmp_path):
    import torch.distributed.checkpoint as dcp

    from fitkit.engine.checkpoint.elastic import saved_layout

    net = torch.nn.Linear(3, 2)
    path = tmp_path / "state.pt"
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": net.state_dict()}, checkpoint_id=str(path))
    assert set(saved_layout(str(path))["model"]) == {"weight", "bias"}
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').close()",))

    (path / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(pickle.UnpicklingError, match="pickled code is never run"):
        saved_layout(str(path))
    assert not marker.exists()
