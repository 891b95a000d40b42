"""One adapter per framework: the same network, data, optimizer and loss, N optimizer steps a run.

Each `build_<name>(net, x, y, w, env)` returns a `Contender` whose `run()` trains one epoch
of `w.steps` full batches of `w.batch` (shuffled) with Adam(lr=1e-3) and cross-entropy,
with logging, progress display, checkpointing, gradient clipping and metrics off, and gives
back the final loss. Building (the framework's objects, Keras' compile) is not timed; what
the framework does per `fit` / `train` call is. `net` is the contender's own copy of the
same initial network.

| name        | what runs per timed run                                                              |
|-------------|--------------------------------------------------------------------------------------|
| raw         | the idiomatic loop: DataLoader(TensorDataset, shuffle=True), zero_grad/backward/step   |
| slice       | the slicing floor: per epoch `torch.randperm`, then `x[idx[i:i+b]]`, zero_grad/backward/step |
| fitkit      | `model.fit(x, y, batch_size, epochs=1, verbose=0)` after one `compile`                |
| fabric      | the raw loop on Lightning Fabric: `fabric.setup`, `setup_dataloaders`, `fabric.backward` |
| lightning   | a new `Trainer(barebones=True, max_epochs=1)` and `trainer.fit` (a Trainer fits once)  |
| hf          | `trainer.train()` on one Hugging Face `Trainer` (Adam passed in, constant LR, no clip) |
| keras       | Keras 3 on the torch backend: `model.fit(x, y, batch_size, epochs=1, verbose=0)`      |
| poutyne     | `poutyne.Model(...).fit(x, y, batch_size, epochs=1, verbose=False)`                   |
| accelerated | pytorch-accelerated's `trainer.train(dataset, num_epochs=1)`, display callbacks off    |

Peers that are not installed are skipped with the reason (`pip install -c constraints.txt -e ".[bench]"`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.common import (
    Contender,
    Env,
    Skip,
    Workload,
    compare,
    data,
    import_fitkit,
    marginal_ratios,
    mlp,
    quiet_loggers,
    ratio,
)

#: name -> what the tables call it, in the issue's column order.
TITLES = {
    "raw": "raw loop",
    "slice": "slicing loop",
    "fitkit": "fitkit",
    "fabric": "Fabric loop",
    "poutyne": "Poutyne",
    "accelerated": "pytorch-accelerated",
    "lightning": "Lightning Trainer",
    "hf": "HF Trainer",
    "keras": "Keras 3 (torch)",
}
ALL = tuple(TITLES)
CORE = ("raw", "fitkit", "fabric")
#: the two hand-written loops: the DataLoader one (the baseline of every table) and the slicing floor.
HAND = ("raw", "slice")

_PACKAGES = {
    "fabric": ("lightning_fabric",),
    "lightning": ("lightning", "pytorch_lightning"),  # either
    "hf": ("transformers",),
    "keras": ("keras",),
    "poutyne": ("poutyne",),
    "accelerated": ("pytorch_accelerated",),
}


def unavailable(name: str) -> str | None:
    """Why `name` cannot run in this environment, or None when it can."""
    needs = _PACKAGES.get(name, ())
    if needs and not any(importlib.util.find_spec(p) for p in needs):
        return f"{' or '.join(needs)} is not installed (pip install -c constraints.txt -e '.[bench]')"
    if name == "hf" and importlib.util.find_spec("accelerate") is None:
        return "the Hugging Face Trainer needs accelerate, which is not installed"
    if name == "keras":
        os.environ.setdefault("KERAS_BACKEND", "torch")  # read once, at keras' first import
        backend = os.environ["KERAS_BACKEND"]
        if backend != "torch":
            return f"KERAS_BACKEND={backend!r}: this comparison needs the torch backend"
        import keras

        if int(keras.__version__.split(".")[0]) < 3:
            return f"keras {keras.__version__} is installed; the torch backend needs keras>=3"
    return None


def _loader(x, y, w: Workload, env: Env, **kw) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=w.batch, shuffle=True,
                      pin_memory=env.device == "cuda", **kw)


# -- the reference loops -------------------------------------------------------------------------------


def build_raw(net, x, y, w: Workload, env: Env) -> Contender:
    return raw_loop(net, _loader(x, y, w, env), env)


def raw_loop(net, loader, env: Env) -> Contender:
    """The hand-written loop over `loader`: zero_grad, forward, backward, step."""
    net.to(env.device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    if env.device == "cpu" and not env.bf16:
        def run() -> float:
            net.train()
            for xb, yb in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                optimizer.step()
            return loss.item()  # the one host read of the run
    else:
        device = torch.device(env.device)

        def run() -> float:
            net.train()
            for xb, yb in loader:
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
                optimizer.zero_grad()
                with env.autocast():
                    loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                optimizer.step()
            return loss.item()

    return Contender(run)


def build_slice(net, x, y, w: Workload, env: Env) -> Contender:
    return slice_loop(net, x, y, w.batch, env)


def slice_loop(net, x, y, batch: int, env: Env) -> Contender:
    """The hand-written floor for in-memory tensors: no DataLoader; per epoch one `torch.randperm`,
    then each batch is `x[idx[i:i + batch]]` (one gather per tensor), zero_grad, forward,
    backward, step with torch's default Adam. What fitkit does internally for tensors, written
    by hand; on a GPU the tensors are moved to the device once, as fitkit does."""
    net.to(env.device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    if env.device != "cpu":
        x, y = x.to(env.device), y.to(env.device)
    n = len(x)

    if env.device == "cpu" and not env.bf16:
        def run() -> float:
            net.train()
            idx = torch.randperm(n)
            for i in range(0, n, batch):
                j = idx[i:i + batch]
                xb, yb = x[j], y[j]
                optimizer.zero_grad()
                loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                optimizer.step()
            return loss.item()
    else:
        def run() -> float:
            net.train()
            idx = torch.randperm(n, device=x.device)
            for i in range(0, n, batch):
                j = idx[i:i + batch]
                xb, yb = x[j], y[j]
                optimizer.zero_grad()
                with env.autocast():
                    loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                optimizer.step()
            return loss.item()

    return Contender(run)


class OptionMissing(Skip):
    """fitkit in this tree has no such option yet (another change adds it)."""


def fitkit_model(net, env: Env, **compile_options):
    """`Model(net).compile("adam", "cross_entropy", ...)` on `env`; an option this fitkit does not
    know (`jit_compile` before it lands) raises `OptionMissing` instead of a TypeError."""
    Model = import_fitkit().Model
    try:
        return Model(net).compile("adam", "cross_entropy", accelerator=env.device, devices=1,
                                  precision=env.precision, **compile_options)
    except (TypeError, ValueError) as err:
        missing = [k for k in compile_options if k in str(err)]
        if missing:
            raise OptionMissing(f"fitkit has no `{missing[0]}` option in this tree ({err.__class__.__name__}: "
                                f"{str(err)[:80]}...)") from err
        raise


def check_fit_options(model, options: dict) -> None:
    """Raise `OptionMissing` when this fitkit does not accept one of the `fit` options (`prefetch`
    before it lands); checked at build time, so the contender is skipped with the reason."""
    try:
        model.training_arguments(**options)
    except (TypeError, ValueError) as err:
        missing = [k for k in options if k in str(err)]
        if missing:
            raise OptionMissing(f"fitkit has no `{missing[0]}` option in this tree") from err
        raise


def build_fitkit(net, x, y, w: Workload, env: Env, compile_options: dict | None = None,
                 **fit_options) -> Contender:
    """`fit_options` go to every `fit` (the scenarios use it for verbose, validation, callbacks);
    `compile_options` to `compile` (the jit table: `jit_compile=True`)."""
    model = fitkit_model(net, env, **(compile_options or {}))
    check_fit_options(model, {k: v for k, v in fit_options.items() if k not in ("validation_data", "callbacks")})
    options = {"verbose": 0, **fit_options}

    def run() -> float:
        history = model.fit(x, y, batch_size=w.batch, epochs=1, shuffle=True, **options)
        return history.history["loss"][-1]

    return Contender(run, last_steps=lambda: model.state.global_step)


def build_fabric(net, x, y, w: Workload, env: Env) -> Contender:
    return fabric_loop(net, _loader(x, y, w, env), env)


def fabric_loop(net, loader, env: Env) -> Contender:
    """The same loop written against Lightning Fabric (its module, optimizer and loader wrappers)."""
    from lightning_fabric import Fabric

    fabric = Fabric(accelerator=env.device, devices=1, precision=env.precision)
    fabric.launch()
    module, optimizer = fabric.setup(net, torch.optim.Adam(net.parameters(), lr=1e-3))
    loader = fabric.setup_dataloaders(loader)

    def run() -> float:
        module.train()
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(module(xb), yb)
            fabric.backward(loss)
            optimizer.step()
        return loss.item()

    return Contender(run)


# -- peers ------------------------------------------------------------------------------------------------


def build_lightning(net, x, y, w: Workload, env: Env) -> Contender:
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    quiet_loggers()  # Lightning sets its loggers' levels when imported

    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)  # kept across fits, as the raw loop's

    class Task(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            return F.cross_entropy(self.net(xb), yb)

        def configure_optimizers(self):
            return optimizer

    task = Task()
    loader = _loader(x, y, w, env)
    root = tempfile.mkdtemp(prefix="fitkit-bench-pl-")
    last = {}

    def run() -> float:
        # barebones: no logger, checkpointing, progress bar, model summary or sanity check
        trainer = pl.Trainer(accelerator=env.device, devices=1, precision=env.precision, max_epochs=1,
                             barebones=True, default_root_dir=root)
        trainer.fit(task, loader)
        last["steps"] = trainer.global_step
        return float("nan")  # reading it would add a host sync the others do not pay

    return Contender(run, last_steps=lambda: last["steps"], close=lambda: shutil.rmtree(root, ignore_errors=True),
                     note="a new Trainer per run (a Trainer fits once); barebones=True")


class _LabelledNet(torch.nn.Module):
    """The network as the Hugging Face Trainer expects it: forward(x, labels) -> {"loss", "logits"}."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class _DictItems(Dataset):
    """`{"x": x[i], "labels": y[i]}` items, as the HF Trainer's default collator expects."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def build_hf(net, x, y, w: Workload, env: Env) -> Contender:
    import transformers

    _fresh_accelerate_state(env)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    root = tempfile.mkdtemp(prefix="fitkit-bench-hf-")
    args = transformers.TrainingArguments(
        output_dir=root, per_device_train_batch_size=w.batch,
        num_train_epochs=1, use_cpu=env.device == "cpu", bf16=env.bf16, max_grad_norm=0.0,
        logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_pin_memory=env.device == "cuda", remove_unused_columns=False, seed=0,
    )
    trainer = transformers.Trainer(model=_LabelledNet(net), args=args, train_dataset=_DictItems(x, y),
                                   optimizers=(optimizer, scheduler))
    trainer.remove_callback(transformers.PrinterCallback)  # prints the logs when tqdm is off

    def run() -> float:
        return trainer.train().training_loss

    return Contender(run, last_steps=lambda: trainer.state.global_step, close=lambda: shutil.rmtree(root, ignore_errors=True),
                     note="trainer.train() again on one Trainer")


def build_keras(net, x, y, w: Workload, env: Env) -> Contender:
    import keras

    if keras.backend.backend() != "torch":
        raise Skip(f"keras was imported with the {keras.backend.backend()!r} backend; set KERAS_BACKEND=torch")
    linears = [m for m in net if isinstance(m, torch.nn.Linear)]

    def device():
        # A new context each time (they are one-shot). "cpu", not "cpu:0": under a device name that
        # differs from the default one, keras 3.15 builds variables that get no gradients.
        return keras.device(env.device)

    if env.bf16:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with device():
            layers = [keras.Input((linears[0].in_features,))]
            for i, lin in enumerate(linears):
                layers.append(keras.layers.Dense(lin.out_features, activation="relu" if i < len(linears) - 1 else None))
            model = keras.Sequential(layers)
            for dense, lin in zip(model.layers, linears):  # the same initial weights
                dense.set_weights([lin.weight.detach().T.numpy(), lin.bias.detach().numpy()])
            model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    finally:
        if env.bf16:
            keras.mixed_precision.set_global_policy("float32")
    xn, yn = x.numpy(), y.numpy()
    last = {}

    def iterations() -> int:
        return int(model.optimizer.iterations.numpy())

    def run() -> float:
        before = iterations()
        with device():
            history = model.fit(xn, yn, batch_size=w.batch, epochs=1, shuffle=True, verbose=0)
        last["steps"] = iterations() - before
        return history.history["loss"][-1]

    return Contender(run, last_steps=lambda: last["steps"], note="Keras' own Adam (its optimizers are not torch's)")


def build_poutyne(net, x, y, w: Workload, env: Env) -> Contender:
    if env.bf16:
        raise Skip("Poutyne has no mixed-precision option")
    import poutyne

    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    model = poutyne.Model(net, optimizer, "cross_entropy", device=torch.device(env.device))

    def run() -> float:
        logs = model.fit(x, y, batch_size=w.batch, epochs=1, verbose=False)
        return logs[-1]["loss"]

    return Contender(run)


def build_accelerated(net, x, y, w: Workload, env: Env) -> Contender:
    from accelerate import Accelerator
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import MoveModulesToDeviceCallback

    _fresh_accelerate_state(env)

    class BenchTrainer(Trainer):
        def _create_accelerator(self):
            return Accelerator(cpu=env.device == "cpu", mixed_precision="bf16" if env.bf16 else "no")

    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    # Only the device callback: the defaults add a progress bar, printing and metric logging.
    trainer = BenchTrainer(net, loss_func=torch.nn.CrossEntropyLoss(), optimizer=optimizer,
                           callbacks=(MoveModulesToDeviceCallback,))
    dataset = TensorDataset(x, y)

    def run() -> float:
        trainer.train(train_dataset=dataset, num_epochs=1, per_device_batch_size=w.batch,
                      # its default is one loader worker per core: the same in-process loading as the others
                      train_dataloader_kwargs={"pin_memory": env.device == "cuda", "num_workers": 0})
        return trainer.run_history.get_latest_metric("train_loss_epoch")

    return Contender(run, note="callbacks: MoveModulesToDeviceCallback only; num_workers=0 (its default: one per core)")


_accelerate_mode: tuple | None = None


def _fresh_accelerate_state(env: Env) -> None:
    """accelerate keeps one process-wide state; start a new one when the device or precision changes
    (between tables: contenders of one table share a mode)."""
    global _accelerate_mode
    mode = (env.device, env.precision)
    if _accelerate_mode is not None and _accelerate_mode != mode:
        from accelerate.state import AcceleratorState

        with contextlib.suppress(Exception):
            AcceleratorState._reset_state(reset_partial_state=True)
    _accelerate_mode = mode


def reset_between_tables() -> None:
    """Forget process-wide state a table's frameworks left behind (accelerate's), before the next table."""
    global _accelerate_mode
    import gc
    import sys

    gc.collect()
    if "accelerate.state" in sys.modules:
        with contextlib.suppress(Exception):
            sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)
    _accelerate_mode = None


BUILDERS: dict[str, Callable[..., Contender]] = {
    "raw": build_raw,
    "slice": build_slice,
    "fitkit": build_fitkit,
    "fabric": build_fabric,
    "lightning": build_lightning,
    "hf": build_hf,
    "keras": build_keras,
    "poutyne": build_poutyne,
    "accelerated": build_accelerated,
}


def builders(names, initial: torch.nn.Module, x, y, w: Workload, env: Env) -> dict[str, Callable[[], Contender]]:
    """Zero-argument builders for `compare`: each gets its own copy of `initial`."""

    def make(name: str) -> Callable[[], Contender]:
        def build() -> Contender:
            why = unavailable(name)
            if why:
                raise Skip(why)
            return BUILDERS[name](copy.deepcopy(initial), x, y, w, env)

        return build

    return {name: make(name) for name in names}


def measure(w: Workload, env: Env, names=ALL, *, clock: str = "wall", log=lambda s: None,
            fixed_cost: bool = True) -> dict:
    """The peers table for one workload: every framework against the raw loop, interleaved.

    With `fixed_cost`, every framework also runs fits of a single optimizer step (one batch
    of data, a second instance of it), interleaved with the others. Then per repetition:

    * whole-fit ratio: fit of `w.steps` steps / the raw loop's;
    * per-step ratio: (t(steps) - t(1)) / the raw loop's, the marginal cost of a step, with
      what a fit call costs once (building the trainer, the loader, a garbage collection)
      taken out;
    * fixed cost of a fit call: t(1) - (t(steps) - t(1)) / (steps - 1).

    With the slicing loop among `names`, `result["vs_slice"]` has the whole-fit and per-step
    ratios again with the slicing loop as the baseline (per repetition, like the others).
    """
    torch.manual_seed(0)
    initial = mlp(w.dims)
    x, y = data(w)
    table = builders(names, initial, x, y, w, env)
    expected = {}
    fixed_cost = fixed_cost and w.steps > 1
    if fixed_cost:
        one = dataclasses.replace(w, steps=1)
        for name, build in builders(names, initial, x[: w.batch], y[: w.batch], one, env).items():
            table[f"{name}@1"] = build
            expected[f"{name}@1"] = 1
    result = compare(table, steps=w.steps, reps=w.reps, env=env, clock=clock, log=log,
                     label=f"{w.name} ({env.device}, {env.precision})", expected=expected)
    result["workload"] = dataclasses.asdict(w)
    times = result["run_seconds"] if clock == "wall" else result["run_cpu_seconds"]
    ran = [n for n in names if n in result["contenders"]]
    result["frameworks"] = ran
    result["whole_fit_ratio"] = {n: result["ratio"][n] for n in ran}
    if fixed_cost and "raw@1" in times:
        result.update(marginal_ratios(result, ran, w.steps))
    if "slice" in ran:  # the second floor: every figure again, relative to the slicing loop
        result["vs_slice"] = {"whole_fit_ratio": {n: ratio(result, n, "slice") for n in ran}}
        if fixed_cost and "slice@1" in times:
            result["vs_slice"]["step_ratio"] = marginal_ratios(result, ran, w.steps, baseline="slice")["step_ratio"]
    for n in list(result["skipped"]):  # a framework skipped twice is reported once
        if n.endswith("@1") and n[:-2] in result["skipped"]:
            del result["skipped"][n]
    return result
