"""Three of Lightning Fabric's official examples (the Lightning repository's `examples/fabric/`),
re-expressed small, each a function of the Fabric it runs on, for tests/test_fabric_examples.py.

- `image_classifier`: `image_classifier/train_fabric.py`, a script's own loop (seeding, loaders,
  `setup`, `backward`, a step scheduler, an `all_gather`ed test loss, a saved model), on
  scikit-learn's 8x8 digits instead of MNIST, with a small convolutional net.
- `language_model`: `language_model/train.py`, another script's loop (a seeded split, shuffled
  batches, gradients clipped by value, a validation loss each epoch), on a token stream it makes,
  with a one-layer causal transformer.
- `MiniTrainer`: `build_your_own_trainer/trainer.py`, a trainer class around a Fabric (hooks
  through `call`, the optimizer stepped with a closure, gradient accumulation, a plateau
  scheduler on the validation accuracy, a checkpoint a epoch and resuming from the latest),
  its training loader shuffled and read by two worker processes that add noise to each sample.

`python tests/scripts/fabric_examples.py OUT` runs them on `model.fabric` of a one-device fitkit
run, then on Lightning's `Fabric(accelerator="cpu", devices=1)`, each trainer resuming from the
other's checkpoints too, and writes OUT/results.pt: for each side the final weights, what its
loggers and hooks received, what it printed, its checkpoint files; and which of Lightning's
packages fitkit's side had imported at each point. The data is OUT/data.pt where that exists
(`digits()` saved by the test), else `digits()`.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

LIGHTNING = ("lightning_fabric", "lightning")


def loaded() -> list[str]:
    return sorted(name for name in LIGHTNING if name in sys.modules)


def digits(train: int = 320, test: int = 160) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first `train` + `test` of scikit-learn's digits as (N, 1, 8, 8) images, normalized
    with the training images' mean and deviation (the example's MNIST transform)."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images[: train + test], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    y = torch.tensor(labels[: train + test], dtype=torch.long)
    x = (x - x[:train].mean()) / x[:train].std()
    return x[:train], y[:train], x[train:], y[train:]


def describe(value: object) -> object:
    """A hook's or logger's argument in comparable terms (a Fabric's own objects by kind only:
    one side's set-up module is the module, the other's Fabric's wrapper)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype), value.double().sum().item())
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {key: describe(v) for key, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return "object"


class Recorder:
    """A Fabric logger (`log_metrics`) and a Fabric callback answering every `on_...` hook."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.calls.append(("log_metrics", describe(metrics), step))

    def __getattr__(self, name: str) -> object:
        if not name.startswith("on_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.calls.append((name, describe(list(args)), describe(kwargs)))


# -- image_classifier/train_fabric.py ---------------------------------------------------------------
class DigitsNet(torch.nn.Module):
    """The example's net, shrunk to 8x8 images: two convolutions, a pooling, two dropouts."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 4, 3), torch.nn.Conv2d(4, 8, 3)
        self.dropout1, self.dropout2 = torch.nn.Dropout(0.25), torch.nn.Dropout(0.5)
        self.fc1, self.fc2 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(self.dropout1(x), 1)))
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


def image_classifier(fabric, data, directory: str, epochs: int = 2, batch_size: int = 32, lr: float = 1.0,
                     gamma: float = 0.7, seed: int = 1, log_interval: int = 4) -> dict:
    """The example's `run(hparams)`: Adadelta and StepLR, the test loss summed over the test set
    and `all_gather`ed; every line printed goes through `fabric.print`, every value printed
    also to the loggers through `log_dict`."""
    fabric.seed_everything(seed)
    with fabric.rank_zero_first(local=False):  # the example's download: rank 0 first
        x_train, y_train, x_test, y_test = data
        train_set, test_set = TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)
    train_loader, test_loader = fabric.setup_dataloaders(DataLoader(train_set, batch_size=batch_size),
                                                         DataLoader(test_set, batch_size=batch_size))
    net = DigitsNet()
    model, optimizer = fabric.setup(net, torch.optim.Adadelta(net.parameters(), lr=lr))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=gamma)
    for epoch in range(1, epochs + 1):
        model.train()
        for batch_idx, (x, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(x), target)
            fabric.backward(loss)
            optimizer.step()
            if batch_idx == 0 or (batch_idx + 1) % log_interval == 0:
                fabric.print(f"Train Epoch: {epoch} [{batch_idx * len(x)}/{len(train_loader.dataset)} "
                             f"({100.0 * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}")
                fabric.log_dict({"train_loss": loss, "lr": optimizer.param_groups[0]["lr"]},
                                step=(epoch - 1) * len(train_loader) + batch_idx)
        scheduler.step()
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for x, target in test_loader:
                output = model(x)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                correct += int((output.argmax(dim=1) == target).sum())
        test_loss = fabric.all_gather(test_loss).sum() / len(test_loader.dataset)
        fabric.print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: ({100 * correct / len(y_test):.0f}%)\n")
        fabric.log_dict({"test_loss": test_loss, "test_correct": correct}, step=epoch)
    fabric.save(os.path.join(directory, "digits_cnn.pt"), {"model": model})
    # the example's own call passes the state first (`fabric.save(model.state_dict(), "mnist_cnn.pt")`)
    try:
        fabric.save(model.state_dict(), os.path.join(directory, "swapped.pt"))
        swapped: object = "returned"
    except Exception as error:  # noqa: BLE001 - the error is what both Fabrics are compared on
        swapped = (type(error).__name__, str(error))
    return {"weights": net.state_dict(), "swapped_save": swapped}


# -- language_model/train.py ---------------------------------------------------------------------------
class TinyLanguageModel(torch.nn.Module):
    """A small stand-in for the example's demo Transformer: token and position embeddings, one
    causal self-attention layer with dropout, log-probabilities over the vocabulary for each
    position, flattened as the example's loss takes them (`target` only gives the shape)."""

    def __init__(self, vocab_size: int, length: int, width: int = 16) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tokens, self.positions = torch.nn.Embedding(vocab_size, width), torch.nn.Embedding(length, width)
        self.layer = torch.nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=32, dropout=0.1,
                                                      batch_first=True)
        self.head = torch.nn.Linear(width, vocab_size)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(length))

    def forward(self, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(inputs) + self.positions(torch.arange(inputs.shape[1]))
        hidden = self.layer(hidden, src_mask=self.mask, is_causal=True)
        return F.log_softmax(self.head(hidden), dim=-1).view(-1, self.vocab_size)


def token_windows(count: int = 240, length: int = 8, vocab_size: int = 12) -> TensorDataset:
    """Windows of a token stream (a repeating pattern, one token in five replaced at random) and
    the same windows shifted by one: the next token to predict at each position."""
    generator = torch.Generator().manual_seed(3)
    stream = torch.arange(count + length + 1) % 7
    noisy = torch.rand(len(stream), generator=generator) < 0.2
    stream[noisy] = torch.randint(0, vocab_size, (int(noisy.sum()),), generator=generator)
    inputs = torch.stack([stream[i : i + length] for i in range(count)])
    return TensorDataset(inputs, torch.stack([stream[i + 1 : i + length + 1] for i in range(count)]))


def language_model(fabric, max_epochs: int = 2, log_interval: int = 4) -> dict:
    """The example's `main`: the data split with a seeded generator, SGD with gradients clipped
    by value after each backward, a validation pass each epoch; all printed through `fabric.print`."""
    fabric.seed_everything(42)
    dataset = token_windows()
    generator = torch.Generator().manual_seed(42)
    train_set, val_set, _ = torch.utils.data.random_split(dataset, [len(dataset) - 40, 20, 20], generator=generator)
    train_loader = DataLoader(train_set, batch_size=20, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=20, shuffle=False)
    net = TinyLanguageModel(vocab_size=12, length=8)
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    train_loader, val_loader = fabric.setup_dataloaders(train_loader, val_loader)
    for epoch in range(max_epochs):
        for batch_idx, (inputs, target) in enumerate(train_loader):
            loss = F.nll_loss(model(inputs, target), target.view(-1))
            fabric.backward(loss)
            fabric.clip_gradients(model, optimizer, clip_val=0.25)
            optimizer.step()
            optimizer.zero_grad()
            if batch_idx % log_interval == 0:
                fabric.print(f"epoch: {epoch} - iteration: {batch_idx} - loss {loss.item():.4f}")
        fabric.print("Validating ...")
        model.eval()
        with torch.no_grad():
            losses = torch.zeros(len(val_loader))
            for k, (inputs, target) in enumerate(val_loader):
                losses[k] = F.nll_loss(model(inputs, target), target.view(-1)).item()
        model.train()
        fabric.print(f"val loss {losses.mean().item():.4f}")
    return {"weights": net.state_dict()}


# -- build_your_own_trainer/trainer.py and run.py -----------------------------------------------------
class NoisyDigits(Dataset):
    """The training images, each read with fresh noise from the generator of the process that
    reads it: a `DataLoader` worker's, so the sample depends on how the workers were seeded."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index] + 0.1 * torch.randn(self.x[index].shape), self.y[index]


class DigitsModule(torch.nn.Module):
    """run.py's `MNISTModule` for 8x8 images, as a plain module with the methods the trainer
    calls: a step returning the loss and the accuracy, Adam with a plateau scheduler on the
    validation accuracy, and the scheduler step a `LightningModule` does by default."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, 1, 1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(4, 8, 3, 1, 1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(8 * 2 * 2, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: list, batch_idx: int) -> dict:
        x, y = batch
        logits = self(x)
        return {"loss": F.cross_entropy(logits, y), "accuracy": (logits.argmax(-1) == y).float().mean()}

    def validation_step(self, batch: list, batch_idx: int) -> dict:
        return self.training_step(batch, batch_idx)

    def configure_optimizers(self) -> tuple:
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)
        return optimizer, {"scheduler": plateau, "monitor": "val_accuracy", "interval": "epoch", "frequency": 1}

    def lr_scheduler_step(self, scheduler: object, metric: object) -> None:
        scheduler.step() if metric is None else scheduler.step(metric)


class MiniTrainer:
    """The example's `MyCustomTrainer` on a Fabric given to it (the example builds its own from
    its arguments): one optimizer and scheduler, hooks through `fabric.call`, a checkpoint a epoch
    in `checkpoint_dir`, resuming from the latest there when `fit` gets a `ckpt_path`. It adds
    one thing: each step's outputs go to the loggers (`log_dict`; the example puts them on its
    progress bar). `probe(label)` is called on each side of the trainer's first read of
    `fabric.strategy`."""

    def __init__(self, fabric, checkpoint_dir: str, max_epochs: int, limit_train_batches: int = 10**9,
                 limit_val_batches: int = 10**9, grad_accum_steps: int = 1, probe=lambda label: None) -> None:
        self.fabric, self.checkpoint_dir, self.max_epochs = fabric, checkpoint_dir, max_epochs
        self.limit_train_batches, self.limit_val_batches = limit_train_batches, limit_val_batches
        self.grad_accum_steps, self.probe = grad_accum_steps, probe
        self.global_step = self.current_epoch = 0
        self.should_stop = False
        self._current_train_return: dict = {}
        self._current_val_return: dict = {}

    def fit(self, model: DigitsModule, train_loader: DataLoader, val_loader: DataLoader,
            ckpt_path: str | None = None) -> None:
        self.fabric.launch()
        train_loader = self.fabric.setup_dataloaders(train_loader, use_distributed_sampler=True)
        val_loader = self.fabric.setup_dataloaders(val_loader, use_distributed_sampler=True)
        self.probe("before strategy")
        strategy = self.fabric.strategy
        self.probe("after strategy")
        from lightning_fabric.strategies import FSDPStrategy

        if isinstance(strategy, FSDPStrategy):
            raise NotImplementedError("the trainer does not support FSDP")
        optimizer, scheduler_cfg = model.configure_optimizers()
        model, optimizer = self.fabric.setup(model, optimizer)
        # the example keeps the whole scheduler config (a dict holding the scheduler) in the state,
        # which torch.load's weights-only default then refuses; the scheduler itself loads
        state = {"model": model, "optim": optimizer, "scheduler": scheduler_cfg["scheduler"]}
        if ckpt_path is not None and os.path.isdir(ckpt_path):
            latest = self.latest_checkpoint(self.checkpoint_dir)
            if latest is not None:
                self.load(state, latest)
                self.should_stop = self.current_epoch >= self.max_epochs
        while not self.should_stop:
            self.train_loop(model, optimizer, train_loader, scheduler_cfg)
            self.val_loop(model, val_loader)
            self.step_scheduler(model, scheduler_cfg, "epoch", self.current_epoch)
            self.current_epoch += 1
            self.should_stop = self.current_epoch >= self.max_epochs
            self.save(state)
        self.should_stop = False

    def train_loop(self, model, optimizer, train_loader, scheduler_cfg: dict) -> None:
        self.fabric.call("on_train_epoch_start")
        for batch_idx, batch in enumerate(train_loader):
            if self.should_stop or batch_idx >= self.limit_train_batches:
                break
            self.fabric.call("on_train_batch_start", batch, batch_idx)
            should_step = self.global_step % self.grad_accum_steps == 0
            if should_step:
                self.fabric.call("on_before_optimizer_step", optimizer)
                optimizer.step(partial(self.training_step, model=model, batch=batch, batch_idx=batch_idx))
                self.fabric.call("on_before_zero_grad", optimizer)
                optimizer.zero_grad()
            else:
                self.training_step(model=model, batch=batch, batch_idx=batch_idx)
            self.fabric.call("on_train_batch_end", self._current_train_return, batch, batch_idx)
            if should_step:
                self.step_scheduler(model, scheduler_cfg, "step", self.global_step)
            self.fabric.log_dict({f"train_{k}": v for k, v in self._current_train_return.items()},
                                 step=self.global_step)
            self.global_step += int(should_step)
        self.fabric.call("on_train_epoch_end")

    def val_loop(self, model, val_loader) -> None:
        model.eval()
        torch.set_grad_enabled(False)
        self.fabric.call("on_validation_epoch_start")
        for batch_idx, batch in enumerate(val_loader):
            if batch_idx >= self.limit_val_batches:
                break
            self.fabric.call("on_validation_batch_start", batch, batch_idx)
            out = {k: v.detach() for k, v in model.validation_step(batch, batch_idx).items()}
            self.fabric.call("on_validation_batch_end", out, batch, batch_idx)
            self._current_val_return = out
        self.fabric.call("on_validation_epoch_end")
        model.train()
        torch.set_grad_enabled(True)

    def training_step(self, model, batch: list, batch_idx: int) -> torch.Tensor:
        outputs = model.training_step(batch, batch_idx=batch_idx)
        self.fabric.call("on_before_backward", outputs["loss"])
        self.fabric.backward(outputs["loss"])
        self.fabric.call("on_after_backward")
        self._current_train_return = {k: v.detach() for k, v in outputs.items()}
        return outputs["loss"]

    def step_scheduler(self, model, scheduler_cfg: dict, level: str, current_value: int) -> None:
        if scheduler_cfg["interval"] != level or current_value % scheduler_cfg["frequency"] != 0:
            return
        candidates = {None: None, **{f"train_{k}": v for k, v in self._current_train_return.items()},
                      **{f"val_{k}": v for k, v in self._current_val_return.items()}}
        model.lr_scheduler_step(scheduler_cfg["scheduler"], candidates[scheduler_cfg["monitor"]])

    def save(self, state: dict) -> None:
        state.update(global_step=self.global_step, current_epoch=self.current_epoch)
        self.fabric.save(os.path.join(self.checkpoint_dir, f"epoch-{self.current_epoch:04d}.ckpt"), state)

    def load(self, state: dict, path: str) -> None:
        remainder = self.fabric.load(path, state)
        self.global_step, self.current_epoch = remainder.pop("global_step"), remainder.pop("current_epoch")
        if remainder:
            raise RuntimeError(f"Unused checkpoint values: {remainder}")

    @staticmethod
    def latest_checkpoint(checkpoint_dir: str) -> str | None:
        names = sorted(os.listdir(checkpoint_dir)) if os.path.isdir(checkpoint_dir) else []
        return os.path.join(checkpoint_dir, names[-1]) if names else None


def train_digits(fabric, data, checkpoint_dir: str, max_epochs: int, resume: bool = False, probe=None) -> dict:
    """run.py's `train`: the trainer on the digits, training batches shuffled and read by two
    workers (seeded first: the example's loaders draw from torch's generator)."""
    fabric.seed_everything(7)
    x_train, y_train, x_test, y_test = data
    train_loader = DataLoader(NoisyDigits(x_train, y_train), batch_size=32, shuffle=True, num_workers=2)
    val_loader = DataLoader(TensorDataset(x_test, y_test), batch_size=32, shuffle=False)
    module = DigitsModule()
    trainer = MiniTrainer(fabric, checkpoint_dir, max_epochs=max_epochs, limit_train_batches=8,
                          limit_val_batches=4, probe=probe or (lambda label: None))
    trainer.fit(module, train_loader, val_loader, ckpt_path=checkpoint_dir if resume else None)
    return {"weights": module.state_dict(), "global_step": trainer.global_step, "epoch": trainer.current_epoch}


# -- the runner ------------------------------------------------------------------------------------
def _contents(directory: str) -> dict:
    return {name: torch.load(os.path.join(directory, name), weights_only=True) for name in sorted(os.listdir(directory))}


def _recorded(fabric, run, callback: bool) -> tuple[object, list, str]:
    """`run()`, with a `Recorder` among `fabric`'s loggers (and its callbacks, as
    `Fabric(callbacks=[r])` would hold it: Fabric keeps them in `_callbacks`, as LocalFabric
    does), and what it printed."""
    recorder, printed = Recorder(), io.StringIO()
    fabric.loggers.append(recorder)
    if callback:
        fabric._callbacks.append(recorder)
    try:
        with contextlib.redirect_stdout(printed):
            result = run()
    finally:
        fabric.loggers.remove(recorder)
        if callback:
            fabric._callbacks.remove(recorder)
    return result, recorder.calls, printed.getvalue()


def run_side(name: str, fabric_for, data, root: str, probes: list) -> dict:
    """Both examples on the Fabric `fabric_for()` gives (a new one per example, as each builds its own)."""
    directory = os.path.join(root, name)
    os.makedirs(os.path.join(directory, "classifier"))
    side: dict = {}
    fabric = fabric_for()
    image, calls, printed = _recorded(
        fabric, lambda: image_classifier(fabric, data, os.path.join(directory, "classifier")), callback=False)
    side["image"] = {**image, "calls": calls, "printed": printed, "files": _contents(os.path.join(directory, "classifier"))}
    probes.append((f"{name}: after image_classifier", loaded()))
    fabric = fabric_for()
    text, calls, printed = _recorded(fabric, lambda: language_model(fabric), callback=False)
    side["text"] = {**text, "calls": calls, "printed": printed}
    probes.append((f"{name}: after language_model", loaded()))
    fabric = fabric_for()
    trainer_dir = os.path.join(directory, "trainer")
    probe = lambda label: probes.append((f"{name}: trainer {label}", loaded()))  # noqa: E731
    result, calls, printed = _recorded(fabric, lambda: train_digits(fabric, data, trainer_dir, 2, probe=probe),
                                       callback=True)
    side["trainer"] = {**result, "calls": calls, "printed": printed, "files": _contents(trainer_dir)}
    return side


def resume_side(name: str, fabric_for, data, checkpoint_dir: str) -> dict:
    """The trainer resuming in `checkpoint_dir` (the other side's files) for a third epoch."""
    fabric = fabric_for()
    result, calls, _ = _recorded(fabric, lambda: train_digits(fabric, data, checkpoint_dir, 3, resume=True),
                                 callback=True)
    return {**result, "calls": calls, "file": torch.load(os.path.join(checkpoint_dir, "epoch-0003.ckpt"),
                                                         weights_only=True)}


def main(root: str) -> None:
    import shutil

    torch.set_num_threads(1)
    given = os.path.join(root, "data.pt")  # the digits as the test made them (it saves this process scikit-learn)
    data = tuple(torch.load(given, weights_only=True)) if os.path.exists(given) else digits()
    probes: list = [("start", loaded())]
    from fitkit import Model

    model = Model(torch.nn.Linear(64, 10)).compile("sgd", "cross_entropy", accelerator="cpu")
    model.fit(data[0].flatten(1), data[1], epochs=1, batch_size=64, verbose=0)
    probes.append(("fitkit: after fit", loaded()))
    results = {"fitkit": run_side("fitkit", lambda: model.fabric, data, root, probes)}
    import lightning_fabric

    results["lightning"] = run_side("lightning", lambda: lightning_fabric.Fabric(accelerator="cpu", devices=1),
                                    data, root, probes)
    # each side resumes from the other's checkpoints
    for name, other in (("fitkit", "lightning"), ("lightning", "fitkit")):
        shutil.copytree(os.path.join(root, other, "trainer"), os.path.join(root, f"{name}-resumed"))
    results["fitkit_resumed"] = resume_side("fitkit", lambda: model.fabric, data, os.path.join(root, "fitkit-resumed"))
    results["lightning_resumed"] = resume_side("lightning", lambda: lightning_fabric.Fabric(accelerator="cpu", devices=1),
                                               data, os.path.join(root, "lightning-resumed"))
    results["fabric_type"] = type(model.fabric).__name__
    results["probes"] = probes
    torch.save(results, os.path.join(root, "results.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
