"""End-to-end behaviour of compile / fit / evaluate / predict on one process."""

import mmap

import numpy as np
import pytest
import torch
from helpers import Pairs, mlp
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from fitkit import History, Model


def test_digits_reaches_95_percent_validation_accuracy():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16
    y = torch.tensor(d.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    model = Model(mlp(64, 10, hidden=128)).compile("adam", "cross_entropy", ["accuracy"], learning_rate=3e-3)
    history = model.fit(x, y, epochs=12, validation_split=0.2, verbose=0, seed=0)
    assert isinstance(history, History)
    assert history.epoch == list(range(12))
    assert set(history.history) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert history.history["val_accuracy"][-1] >= 0.95
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert model.history is history and model.state.global_step == 12 * 45


def test_compile_returns_self_and_chains(blobs):
    x, y = blobs
    model = Model(mlp())
    assert model.compile("sgd", "cross_entropy") is model
    history = Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def test_evaluate_is_exact_with_a_short_last_batch(blobs):
    x, y = blobs
    x, y = x[:103], y[:103]  # batch 10 -> last batch of 3
    w = torch.rand(103, generator=torch.Generator().manual_seed(1))
    net = mlp()
    model = Model(net).compile("adam", "cross_entropy", ["accuracy", "mae"] and ["accuracy"])
    result = model.evaluate(x, y, batch_size=10, return_dict=True)
    with torch.no_grad():
        logits = net(x)
    assert result["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, y).item(), rel=1e-6)
    assert result["accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item(), abs=1e-7)
    weighted = model.evaluate(x, y, batch_size=10, sample_weight=w, return_dict=True)
    per = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    assert weighted["loss"] == pytest.approx((per * w).mean().item(), rel=1e-6)


def test_training_loss_is_the_exact_epoch_average():
    # lr 0: the weights never change, so the epoch loss must equal the full-batch loss.
    x = torch.randn(37, 8, generator=torch.Generator().manual_seed(2))
    y = torch.arange(37) % 3
    net = mlp()
    h = Model(net).compile("sgd", "cross_entropy", learning_rate=0.0).fit(x, y, batch_size=8, verbose=0)
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(net(x), y).item()
    assert h.history["loss"][0] == pytest.approx(expected, rel=1e-6)


def test_predict_keeps_input_order_and_returns_cpu_tensor(blobs):
    x, _ = blobs
    net = mlp()
    model = Model(net).compile("adam", "cross_entropy")
    out = model.predict(x, batch_size=7)
    with torch.no_grad():
        expected = net(x)
    assert out.device.type == "cpu" and out.shape == (240, 3)
    torch.testing.assert_close(out, expected)
    # predict after a shuffled fit still returns input order
    model.fit(x, torch.zeros(240, dtype=torch.long), epochs=1, verbose=0)
    with torch.no_grad():
        torch.testing.assert_close(model.predict(x, batch_size=13), net(x))


def test_numpy_arrays_are_accepted(blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=1e-2)
    h = model.fit(x.double().numpy(), y.numpy(), epochs=3, verbose=0)
    assert h.history["accuracy"][-1] > 0.9
    assert model.evaluate(x.numpy(), y.numpy(), return_dict=True)["accuracy"] > 0.9
    assert isinstance(model.predict(x.numpy()), torch.Tensor)


class _DictDataset(Pairs):
    def __getitem__(self, i):
        return {"features": self.x[i], "labels": self.y[i]}


class _Stream(IterableDataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y))


class _KwargNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, features):
        return self.net(features)


@pytest.mark.parametrize("kind", ["tuple", "dataset", "iterable", "dataloader", "list", "dict"])
def test_input_forms_train_the_same_problem(blobs, kind):
    x, y = blobs
    if kind == "tuple":
        data = (x, y)
    elif kind == "dataset":
        data = Pairs(x, y)
    elif kind == "iterable":
        data = _Stream(x, y)
    elif kind == "dataloader":
        data = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    elif kind == "list":
        data = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 240, 32)]
    else:
        data = _DictDataset(x, y)
    net = _KwargNet() if kind == "dict" else mlp()
    model = Model(net).compile("adam", "cross_entropy", ["accuracy"], learning_rate=1e-2)
    h = model.fit(data, epochs=4, verbose=0, validation_data=data)
    assert h.history["accuracy"][-1] > 0.9
    assert h.history["val_accuracy"][-1] > 0.9
    assert model.state.global_step == 4 * 8


def test_a_dataloader_sampler_with_set_epoch_gets_each_epoch(blobs):
    """On one CPU process fitkit iterates the user's DataLoader itself (no per-batch device
    walk); a sampler with `set_epoch` (DistributedSampler-like) still gets the epoch number."""
    x, y = blobs

    class EpochAware(torch.utils.data.Sampler):
        def __init__(self, n):
            self.n, self.epochs = n, []

        def set_epoch(self, epoch):
            self.epochs.append(epoch)

        def __len__(self):
            return self.n

        def __iter__(self):
            g = torch.Generator().manual_seed(self.epochs[-1] if self.epochs else -1)
            return iter(torch.randperm(self.n, generator=g).tolist())

    sampler = EpochAware(len(x))
    loader = DataLoader(TensorDataset(x, y), batch_size=48, sampler=sampler)
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, features):
            if self.training:  # not fit's one check of the first batch (eval mode), only training steps
                seen.append(features)
            return self.net(features)

    model = Model(Spy()).compile("adam", "cross_entropy")
    model.fit(loader, epochs=3, verbose=0)
    assert sampler.epochs == [0, 1, 2]
    epochs = [torch.cat(seen[i * 5:(i + 1) * 5]) for i in range(3)]
    assert not torch.equal(epochs[0], epochs[1])  # a new order each epoch
    assert torch.allclose(epochs[2].sum(0), x.sum(0), atol=1e-3)  # every sample once an epoch


def test_validation_split_takes_the_last_fraction_before_shuffling():
    x = torch.arange(100, dtype=torch.float32).unsqueeze(1)
    y = torch.zeros(100)
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def forward(self, x):
            if self.training:
                self.trained = True
            elif getattr(self, "trained", False):  # validation, not fit's check of the first batches
                seen.append(x.squeeze(1).clone())
            return self.lin(x)

    Model(Spy()).compile("sgd", "mse").fit(x, y, validation_split=0.2, verbose=0, batch_size=8)
    assert torch.cat(seen).tolist() == list(range(80, 100))


def test_module_that_returns_its_own_loss_hf_style(blobs):
    x, y = blobs

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, features, labels=None):
            logits = self.net(features)
            if labels is None:
                return {"logits": logits}
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    model = Model(WithLoss()).compile("adam", loss=None, metrics=["accuracy"], learning_rate=1e-2)
    h = model.fit(_DictDataset(x, y), epochs=3, verbose=0)
    assert h.history["loss"][-1] < h.history["loss"][0]
    assert h.history["accuracy"][-1] > 0.9
    assert model.predict(_DictDataset(x, y))["logits"].shape == (240, 3)


def test_class_weight_and_sample_weight_change_the_loss():
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    y = torch.arange(64) % 2
    net = mlp(d_out=2)
    with torch.no_grad():
        per = torch.nn.functional.cross_entropy(net(x), y, reduction="none")
    model = Model(net).compile("sgd", "cross_entropy", learning_rate=0.0)
    plain = model.fit(x, y, batch_size=64, verbose=0).history["loss"][0]
    weighted = model.fit(x, y, batch_size=64, verbose=0, class_weight={0: 1.0, 1: 3.0}).history["loss"][0]
    cw = torch.where(y == 1, 3.0, 1.0)
    assert plain == pytest.approx(per.mean().item(), rel=1e-6)
    assert weighted == pytest.approx((per * cw).mean().item(), rel=1e-6)
    sw = torch.linspace(0, 2, 64)
    sampled = model.fit(x, y, sample_weight=sw, batch_size=16, verbose=0, shuffle=False).history["loss"][0]
    assert sampled == pytest.approx((per * sw).mean().item(), rel=1e-5)


def test_gradient_accumulation_matches_a_bigger_batch():
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(4))
    y = torch.arange(64) % 3
    a, b = mlp(seed=1), mlp(seed=1)
    Model(a).compile("sgd", "cross_entropy", learning_rate=0.1).fit(x, y, batch_size=16, shuffle=False, verbose=0)
    Model(b).compile("sgd", "cross_entropy", learning_rate=0.1, gradient_accumulation_steps=2).fit(
        x, y, batch_size=8, shuffle=False, verbose=0
    )
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_max_steps_and_schedulers(blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=1.0, lr_scheduler="linear", warmup_steps=2)
    seen = []

    from fitkit import TrainerCallback

    class Lr(TrainerCallback):
        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            seen.append(optimizer.param_groups[0]["lr"])

    model.fit(x, y, max_steps=10, batch_size=32, callbacks=[Lr()], verbose=0)
    assert model.state.global_step == 10 and model.state.max_steps == 10
    assert seen[0] == pytest.approx(1 / 2) and seen[1] == pytest.approx(1.0)  # HF's warm-up (step 1 at 0), then decay
    assert seen[-1] == pytest.approx(0.0, abs=1e-9) and all(a >= b for a, b in zip(seen[1:], seen[2:]))
    cos = []
    Model(mlp()).compile("adam", "cross_entropy", learning_rate=1.0, lr_scheduler="cosine").fit(
        x, y, max_steps=8, callbacks=[Lr()], verbose=0
    )
    cos = seen[10:]
    assert cos[3] == pytest.approx(0.5 * (1 + np.cos(np.pi * 4 / 8)))


def test_gradient_clipping_bounds_the_update():
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(5)) * 100
    y = torch.arange(32) % 3
    net = mlp()
    before = [p.detach().clone() for p in net.parameters()]
    Model(net).compile("sgd", "cross_entropy", learning_rate=1.0, max_grad_norm=0.5).fit(
        x, y, batch_size=32, verbose=0
    )
    delta = torch.sqrt(sum(((p - q) ** 2).sum() for p, q in zip(net.parameters(), before)))
    assert delta.item() == pytest.approx(0.5, rel=1e-4)


def test_metrics_by_name_instance_and_callable(blobs):
    import torchmetrics

    x, y = blobs

    def top_logit(preds, target):
        return preds.max(dim=1).values.mean()

    model = Model(mlp()).compile(
        "adam", "cross_entropy",
        metrics=["accuracy", "f1", torchmetrics.classification.MulticlassAccuracy(num_classes=3), top_logit],
        learning_rate=1e-2,
    )
    h = model.fit(x, y, epochs=2, verbose=0, validation_data=(x, y))
    for name in ("accuracy", "f1", "multiclass_accuracy", "top_logit"):
        assert name in h.history and "val_" + name in h.history
    assert h.history["accuracy"][-1] == pytest.approx(h.history["multiclass_accuracy"][-1], abs=1e-6)
    result = model.evaluate(x, y, return_dict=True)
    with torch.no_grad():
        logits = model.module(x)
    assert result["top_logit"] == pytest.approx(logits.max(1).values.mean().item(), rel=1e-5)


def test_binary_and_regression_metrics():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(200, 4, generator=g)
    yb = (x[:, 0] > 0).float()
    m = Model(mlp(4, 1)).compile("adam", "binary_crossentropy", ["accuracy", "auroc"], learning_rate=1e-2)
    h = m.fit(x, yb, epochs=5, verbose=0)
    assert h.history["accuracy"][-1] > 0.9 and h.history["auroc"][-1] > 0.95
    yr = x @ torch.tensor([1.0, -2.0, 0.5, 0.0])
    r = Model(mlp(4, 1)).compile("adam", "mse", ["mae"], learning_rate=1e-2)
    h = r.fit(x, yr, epochs=10, verbose=0)
    assert h.history["loss"][-1] < 0.5 * h.history["loss"][0]
    out = r.evaluate(x, yr, return_dict=True)
    pred = r.predict(x).squeeze(1)
    assert out["mae"] == pytest.approx((pred - yr).abs().mean().item(), rel=1e-5)


def test_fit_continues_training_and_compile_resets_the_optimizer(blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, verbose=0)
    first = model.optimizer
    model.fit(x, y, verbose=0)
    assert model.optimizer is first  # Keras: a second fit keeps the optimizer state
    model.compile("adam", "cross_entropy")
    model.fit(x, y, verbose=0)
    assert model.optimizer is not first


def test_model_init_builds_the_module(blobs):
    x, y = blobs
    calls = []

    def model_init(trial=None):
        calls.append(trial)
        return mlp()

    model = Model(model_init=model_init).compile("adam", "cross_entropy")
    model.fit(x, y, verbose=0)
    assert calls == [None] and isinstance(model.module, torch.nn.Sequential)


def test_summary_lists_layers_shapes_and_counts(blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    text = model.summary()
    assert "Total params: 195" in text and "Trainable params: 195" in text
    assert "Linear" in text and "ReLU" in text
    model.fit(x, y, verbose=0)
    assert "(None, 16)" in model.summary() and "(None, 3)" in model.summary()
    frozen = mlp()
    frozen[0].weight.requires_grad_(False)
    assert "Non-trainable params: 128" in Model(frozen).summary()


def test_verbose_two_prints_one_line_per_epoch(blobs, capsys):
    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy", ["accuracy"]).fit(x, y, epochs=3, verbose=2, validation_split=0.25)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[0] == "Epoch 1/3" and lines[2] == "Epoch 2/3"  # Keras 3: a title, then the line
    assert lines[1].startswith("6/6 - ") and "loss: " in lines[1] and "val_accuracy: " in lines[1]


def test_verbose_zero_prints_nothing(blobs, capsys):
    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, verbose=0)
    assert capsys.readouterr().out == ""


def test_verbose_one_draws_a_rich_bar(blobs, capsys):
    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, verbose=1)
    out = capsys.readouterr().out
    assert "Epoch 2/2" in out and "loss" in out


def test_closing_summary_has_speed_and_memory_figures(blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0)
    summary = model.state.log_history[-1]
    # HF rounds the runtime to 4 decimals and the speeds to 3: on a fast run (a few ms) the
    # runtime's rounding alone moves the quotient by more than 1%, so check within those bounds.
    runtime = summary["train_runtime"]
    assert runtime > 1e-4
    for key, count in (("train_steps_per_second", 30), ("train_samples_per_second", 30 * 16)):
        assert count / (runtime + 5e-5) - 5e-4 <= summary[key] <= count / (runtime - 5e-5) + 5e-4, key
    epochs = [r["loss"] for r in model.state.log_history if "loss" in r]
    assert summary["train_loss"] == pytest.approx(sum(epochs) / 2, rel=1e-6)  # equal-sized epochs
    assert not any(k.startswith("train_mem") for k in summary)
    assert "train_runtime" not in model.history.history

    class Hungry(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()
            self.kept = []

        def forward(self, x):
            if self.training and not self.kept:  # the first training step (fit's probe runs in eval mode)
                # 40 MiB of fresh anonymous pages, touched and kept: the RSS must grow by that much.
                # A malloc'd tensor would not do: glibc serves even a 40 MiB request from a free heap
                # chunk when one is large enough (left by earlier tests), and those pages are resident.
                pages = mmap.mmap(-1, 40 * 2**20)
                torch.frombuffer(pages, dtype=torch.uint8).fill_(1)
                self.kept.append(pages)
            return self.net(x)

    model = Model(Hungry()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, skip_memory_metrics=False)
    summary = model.state.log_history[-1]
    assert summary["train_mem_cpu_alloc_delta"] >= 36 * 2**20  # 40 MiB kept
    assert summary["train_mem_cpu_peaked_delta"] >= 0
