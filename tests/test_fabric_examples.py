"""Three of Lightning Fabric's official examples, re-expressed in tests/scripts/fabric_examples.py
(`image_classifier/train_fabric.py` and `language_model/train.py`: scripts' own loops;
`build_your_own_trainer`: a trainer class with hooks, a closure step, a plateau scheduler,
checkpoints and resuming), run in one
process on `model.fabric` of a one-device fitkit run and on Lightning's
`Fabric(accelerator="cpu", devices=1)`, same weights and same data order: both end with the same
weights, log and print the same values, call the same hooks with the same arguments (batches read
by seeded `DataLoader` workers included), write the same checkpoint files, and each resumes from
the other's checkpoints to the same end. fitkit's side imports Lightning only when the trainer
reads `fabric.strategy`, the one member that needs it."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lightning_fabric")
pytest.importorskip("sklearn")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "fabric_examples.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.scripts.fabric_examples import digits

    root = tmp_path_factory.mktemp("fabric_examples")
    torch.save(list(digits()), root / "data.pt")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PL_GLOBAL_SEED", None)
    proc = subprocess.run([sys.executable, SCRIPT, str(root)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(root / "results.pt", weights_only=True), proc.stderr


def differences(a, b, path=""):
    """Where `a` and `b` differ: tensors by dtype, shape and values (bit for bit), the rest by `==`."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [f"{path} keys {list(a)} != {list(b)}"]
        return [d for key in a for d in differences(a[key], b[key], f"{path}/{key}")]
    if isinstance(a, (list, tuple)) and type(a) is type(b) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_the_image_classifier_runs_on_model_fabric_as_on_fabric(run):
    results, _ = run
    assert results["fabric_type"] == "LocalFabric"
    ours, theirs = results["fitkit"]["image"], results["lightning"]["image"]
    assert differences(ours, theirs) == []
    # what was compared: 2 epochs of 10 batches, logged at batches 0, 3 and 7 and after each test pass
    assert [call[2] for call in ours["calls"]] == [0, 3, 7, 1, 10, 13, 17, 2]
    assert ours["calls"][0][1]["lr"] == 1.0 and ours["calls"][4][1]["lr"] == pytest.approx(0.7)  # StepLR
    assert ours["printed"].count("Train Epoch:") == 6 and ours["printed"].count("Test set:") == 2
    assert list(ours["files"]) == ["digits_cnn.pt"]
    assert differences(ours["files"]["digits_cnn.pt"]["model"], ours["weights"]) == []
    # the example's own save call (state first, path second) fails the same way on both
    assert ours["swapped_save"] == ("AttributeError", "'str' object has no attribute 'items'")


def test_the_language_model_runs_on_model_fabric_as_on_fabric(run):
    results, _ = run
    ours, theirs = results["fitkit"]["text"], results["lightning"]["text"]
    assert differences(ours, theirs) == []
    # 2 epochs of 10 shuffled batches, gradients clipped by value: the loss printed at 0, 4 and 8
    losses = [float(line.rsplit(" ", 1)[1]) for line in ours["printed"].splitlines() if "val loss" in line]
    assert ours["printed"].count("iteration:") == 6 and len(losses) == 2 and losses[1] < losses[0]


def test_the_trainer_runs_on_model_fabric_as_on_fabric(run):
    results, _ = run
    ours, theirs = results["fitkit"]["trainer"], results["lightning"]["trainer"]
    assert differences(ours, theirs) == []
    assert (ours["epoch"], ours["global_step"]) == (2, 16)  # 8 batches an epoch
    hooks = [call[0] for call in ours["calls"]]
    for hook, count in (("on_after_setup", 1), ("on_train_batch_start", 16), ("on_before_backward", 16),
                        ("on_after_optimizer_step", 16), ("on_validation_batch_end", 8), ("log_metrics", 16)):
        assert hooks.count(hook) == count, hook
    assert list(ours["files"]) == ["epoch-0001.ckpt", "epoch-0002.ckpt"]
    last = ours["files"]["epoch-0002.ckpt"]
    assert sorted(last) == ["current_epoch", "global_step", "model", "optim", "scheduler"]
    assert (last["current_epoch"], last["global_step"]) == (2, 16)
    assert differences(last["model"], ours["weights"]) == []


def test_each_side_resumes_from_the_others_checkpoints(run):
    results, _ = run
    ours, theirs = results["fitkit_resumed"], results["lightning_resumed"]
    assert differences(ours, theirs) == []
    assert (ours["epoch"], ours["global_step"]) == (3, 24)
    assert differences(ours["file"]["model"], ours["weights"]) == []
    assert differences(ours["weights"], results["fitkit"]["trainer"]["weights"]) != []  # it trained on


def test_fitkits_side_imports_lightning_only_for_the_member_that_needs_it(run):
    results, stderr = run
    probes = dict(results["probes"])
    assert probes["fitkit: after fit"] == probes["fitkit: after image_classifier"] == []
    assert probes["fitkit: after language_model"] == []
    assert probes["fitkit: trainer before strategy"] == []
    assert probes["fitkit: trainer after strategy"] == ["lightning_fabric"]
    # `seed_everything` reports each seed on stderr as Fabric does, before Lightning is imported too
    # (fitkit's three examples, then Lightning's, then the two resumed runs)
    seeds = [line for line in stderr.splitlines() if line.startswith("Seed set to")]
    assert seeds == ["Seed set to 1", "Seed set to 42", "Seed set to 7"] * 2 + ["Seed set to 7"] * 2
