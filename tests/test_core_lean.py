"""Lean by construction: lazy imports and no host synchronisation per training step."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import mlp

from fitkit import Model, TrainerCallback

HEAVY = ("optuna", "rich", "tensorboard", "mlflow", "sklearn", "lightning_fabric", "torchmetrics", "wandb",
         "comet_ml", "codecarbon", "matplotlib")


def test_import_fitkit_loads_no_heavy_dependency():
    code = (
        "import sys, fitkit\n"
        "from fitkit import Model, TrainingArguments, TrainerCallback, TrainerState, TrainerControl, History\n"
        "from fitkit.callbacks import DefaultFlowCallback, ProgressBar, PrinterCallback\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_run_with_the_multiclass_accuracy_imports_no_torchmetrics():
    """"accuracy" of a multiclass output is counted by fitkit (`CountedAccuracy`): neither `fit`
    nor `evaluate` imports torchmetrics (about a second of a process's start) for it."""
    code = (
        "import sys, torch, fitkit\n"
        "m = fitkit.Model(torch.nn.Linear(4, 3)).compile('adam', 'cross_entropy', ['accuracy', 'acc'])\n"
        "x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))\n"
        "m.fit(x, y, epochs=2, verbose=0, validation_split=0.25, save_strategy='no')\n"
        "m.evaluate(x, y, verbose=0)\n"
        "print(sorted(n for n in ('torchmetrics', 'lightning_fabric') if n in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


class _SyncCounter:
    """Counts calls that copy a tensor's value to the host (each one is a stall on a GPU).

    Calls made inside torch itself are not counted: Adam reads its CPU step counter with
    `.item()` in a hand-written loop too, and that counter never lives on the GPU.
    """

    NAMES = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def wrapper(t, *a, _original=original, **k):
                caller = sys._getframe(1).f_code.co_filename
                if f"{os.sep}torch{os.sep}" not in caller:
                    self.count += 1
                return _original(t, *a, **k)

            monkeypatch.setattr(torch.Tensor, name, wrapper)


def _fit_counting(monkeypatch, epochs, **options):
    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(512) % 3
    model = Model(mlp()).compile("adam", "cross_entropy", **options.pop("compile", {}))
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # warm-up: Fabric set-up and lazy metric build
    counter = _SyncCounter(monkeypatch)
    model.fit(x, y, epochs=epochs, batch_size=8, verbose=0, **options)
    monkeypatch.undo()
    return counter.count


def test_host_reads_do_not_grow_with_steps(monkeypatch):
    one = _fit_counting(monkeypatch, epochs=1)  # 64 steps
    four = _fit_counting(monkeypatch, epochs=4)  # 256 steps
    assert 1 <= one <= 4, one  # the epoch loss is read once; a small constant per epoch, not per step
    assert four <= 4 * max(one, 1)


def test_host_reads_with_step_logging_are_per_logging_step(monkeypatch):
    reads = _fit_counting(monkeypatch, epochs=1, logging_strategy="steps", logging_steps=16)  # 4 logs
    assert reads <= 4 * 2 + 4, reads


def test_running_loss_folds_steps_into_an_exact_weighted_sum():
    from fitkit.engine.running_loss import FOLD_EVERY, RunningLoss

    g = torch.Generator().manual_seed(0)
    losses = torch.rand(3 * FOLD_EVERY + 5, generator=g, dtype=torch.float64)
    sizes = [32] * (len(losses) - 1) + [7]  # a short last batch
    running = RunningLoss(torch.device("cpu"))
    for i, (loss, size) in enumerate(zip(losses, sizes)):
        running.add(loss.float().requires_grad_(), size)
        if i == FOLD_EVERY + 3:  # a read mid-way adds what is pending to a copy and changes nothing
            assert running.total.item() == pytest.approx(float((losses[: i + 1] * 32).sum()), rel=1e-6)
    expected = float((losses * torch.tensor(sizes, dtype=torch.float64)).sum())
    assert not running.total.requires_grad
    assert running.total.item() == pytest.approx(expected, rel=1e-6) and running.count == sum(sizes)
    assert len(running._pending) == 5  # reads fold nothing: folds fall every FOLD_EVERY steps
    running.set(10.0, 4)  # a resumed epoch starts from its saved sums
    running.add(torch.tensor(0.5), 2)
    assert running.total.item() == pytest.approx(11.0) and running.count == 6


def test_gradients_are_cleared_each_step_and_a_custom_zero_grad_is_honoured(blobs):
    x, y = blobs
    calls = []

    class CountingSGD(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True):
            calls.append(set_to_none)
            super().zero_grad(set_to_none)

    class GradsAtStepBegin(TrainerCallback):  # every step starts with no gradient left over
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            assert all(p.grad is None for p in model.parameters())

    model = Model(mlp()).compile("sgd", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=48, verbose=0, callbacks=[GradsAtStepBegin()])
    custom = Model(mlp()).compile(lambda params: CountingSGD(params, lr=0.1), "cross_entropy")
    custom.fit(x, y, epochs=1, batch_size=48, verbose=0, callbacks=[GradsAtStepBegin()])
    assert calls == [True] * 5  # the optimizer's own zero_grad, once per step


def test_clipping_lists_the_parameters_once_per_fit(monkeypatch):
    # `module.parameters()` walks every submodule (0.3 - 0.6 ms a step for a small transformer):
    # fit lists them at its first clip, not at every step
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(256) % 3
    walks = []
    original = torch.nn.Module.parameters

    def counting(module, recurse=True):
        walks.append(sys._getframe(1).f_code.co_name)
        return original(module, recurse)

    def fit(epochs):
        model = Model(mlp()).compile("sgd", "cross_entropy", max_grad_norm=1.0)
        model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # set-up outside the count
        walks.clear()
        monkeypatch.setattr(torch.nn.Module, "parameters", counting)
        model.fit(x, y, epochs=epochs, batch_size=8, verbose=0)  # 32 steps an epoch
        monkeypatch.undo()
        return list(walks)

    one, four = fit(1), fit(4)
    assert len(four) == len(one) < 32, (one, four)


def test_clipping_sees_a_parameter_unfrozen_mid_run():
    # the kept list holds frozen parameters too: one unfrozen by a callback counts in the norm
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(5)) * 100
    y = torch.arange(32) % 3
    net = mlp()
    net[0].requires_grad_(False)
    trained = list(net[2].parameters())
    seen = []

    class Unfreeze(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append([p.detach().clone() for p in trained])
            net[0].requires_grad_(True)  # from step 2 on, its gradient counts in the clipped norm

    start = [p.detach().clone() for p in trained]
    Model(net).compile("sgd", "cross_entropy", learning_rate=1.0, max_grad_norm=0.5).fit(
        x, y, batch_size=32, epochs=2, verbose=0, callbacks=[Unfreeze()])

    def moved(a, b):
        return torch.sqrt(sum(((p - q) ** 2).sum() for p, q in zip(a, b))).item()

    assert moved(seen[0], start) == pytest.approx(0.5, rel=1e-4)  # step 1: the trained layer is all the norm
    assert moved(seen[1], seen[0]) < 0.45  # step 2: the unfrozen layer's share of 0.5 is not applied (no optimizer)
