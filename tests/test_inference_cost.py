"""`evaluate` and `predict` do per batch what a hand-written loop does: named classification
metrics updated in blocks (with the per-batch values, bit for bit), no event fired that no
callback hears, the same numbers as the per-batch sums, under inference mode where nothing needs
autograd; named metrics are reused from one call to the next."""

import pytest
import torch
from helpers import mlp, seeded_classes

from fitkit import Model, TrainerCallback
from fitkit.adapters import held_batches, metric_specs
from fitkit.adapters.metrics import MetricSet
from fitkit.events.handler import CallbackHandler

BATCH = 8


def _batches(kind, n=6):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        if kind == "multiclass":
            out.append((torch.randn(BATCH, 5, generator=g), torch.randint(0, 5, (BATCH,), generator=g)))
        elif kind == "binary":
            out.append((torch.randn(BATCH, 1, generator=g), torch.randint(0, 2, (BATCH, 1), generator=g).float()))
        elif kind == "onehot":
            labels = torch.randint(0, 5, (BATCH,), generator=g)
            out.append((torch.randn(BATCH, 5, generator=g), torch.nn.functional.one_hot(labels, 5).float()))
        else:  # multilabel
            out.append((torch.randn(BATCH, 4, generator=g), torch.randint(0, 2, (BATCH, 4), generator=g).float()))
    return out


NAMES = {
    "multiclass": ["accuracy", "f1", "precision", "recall", "auroc", "top_k_categorical_accuracy"],
    "binary": ["accuracy", "f1", "auroc", "auc"],
    "onehot": ["categorical_accuracy", "f1"],
    "multilabel": ["binary_accuracy", "f1", "auroc"],  # ("recall" there is Keras' own, per element)
}


@pytest.mark.parametrize("kind", list(NAMES))
def test_block_updates_give_the_per_batch_values_bit_for_bit(kind, monkeypatch):
    batches = _batches(kind)
    blocks = MetricSet(NAMES[kind], "val_")
    for preds, target in batches:
        blocks.update(preds, target)
    assert all(item[1]._update_count == 0 for item in blocks._items)  # held: no torchmetrics update yet
    held = blocks.compute()
    assert all(item[1]._update_count == 1 for item in blocks._items)  # one update for the six batches

    monkeypatch.setattr(held_batches, "HELD_BYTES", -1)  # given at every batch: the per-batch updates
    each = MetricSet(NAMES[kind], "val_")
    for preds, target in batches:
        each.update(preds, target)
    assert all(item[1]._update_count == len(batches) for item in each._items)
    assert held == each.compute()


def test_counted_accuracy_is_torchmetrics_micro_accuracy_bit_for_bit_and_shares_its_state():
    from torchmetrics.classification import MulticlassAccuracy

    from fitkit.adapters.counted_accuracy import CountedAccuracy

    g = torch.Generator().manual_seed(5)
    ours, theirs = CountedAccuracy(7, torch.device("cpu")), MulticlassAccuracy(7, average="micro", validate_args=False)
    assert float(ours.compute()) == float(theirs.compute()) == 0.0
    for n in (1, 3, 64, 1000, 7):
        shapes = [((n, 7), (n,)), ((n, 7, 3), (n, 3)), ((n,), (n,))]  # scores, scores per position, labels
        for preds_shape, target_shape in shapes:
            preds = torch.randn(*preds_shape, generator=g) if len(preds_shape) > 1 else torch.randint(0, 7, (n,), generator=g)
            target = torch.randint(0, 7, target_shape, generator=g)
            ours.update(preds, target)
            theirs.update(preds, target)
            assert ours.compute().dtype == theirs.compute().dtype == torch.float32
            assert ours.compute().item() == theirs.compute().item()  # the same float32 division
    for key, value in theirs.metric_state.items():  # the state under torchmetrics' names, shapes and dtypes
        assert torch.equal(ours.metric_state[key], value) and ours.metric_state[key].dtype == value.dtype
    resumed = CountedAccuracy(7, torch.device("cpu"))
    resumed.load(theirs.metric_state)  # a checkpoint of either resumes into the other
    assert resumed.compute().item() == theirs.compute().item()
    back = MulticlassAccuracy(7, average="micro", validate_args=False)
    for key, value in ours.metric_state.items():
        setattr(back, key, value)
    back._update_count = 1
    assert back.compute().item() == ours.compute().item()
    for tp, fn in ((16777217, 3), (16777219, 16777217)):  # counts float32 rounds: the division is float32's too
        big = {"tp": torch.tensor([tp]), "fn": torch.tensor([fn]), "fp": torch.tensor([fn]), "tn": torch.tensor([0])}
        resumed.load(big)
        for key, value in big.items():
            setattr(back, key, value)
        back._computed = None  # (torchmetrics keeps its last value until an update)
        assert resumed.compute().item() == back.compute().item()
    ours.reset()
    assert ours.count == 0 and float(ours.compute()) == 0.0 and ours.metric_state["tp"].tolist() == [0]


def test_the_named_metrics_directions_are_their_torchmetrics_classes():
    """The directions known without importing torchmetrics are the classes' own."""
    from torchmetrics import classification, regression

    classes = {"accuracy": classification.BinaryAccuracy, "f1": classification.BinaryF1Score,
               "precision": classification.BinaryPrecision, "recall": classification.BinaryRecall,
               "auroc": classification.BinaryAUROC, "top_k": classification.MulticlassAccuracy,
               "mae": regression.MeanAbsoluteError, "mse": regression.MeanSquaredError}
    assert set(metric_specs.HIGHER_IS_BETTER) == set(classes)
    for name, cls in classes.items():
        assert cls.higher_is_better is metric_specs.HIGHER_IS_BETTER[name]


def test_what_is_read_or_saved_mid_epoch_includes_the_held_batches():
    batches = _batches("multiclass")
    metrics = MetricSet(["accuracy"])
    for preds, target in batches[:3]:
        metrics.update(preds, target)
    state = metrics.export_state()
    correct = sum(int((p.argmax(-1) == t).sum()) for p, t in batches[:3])
    assert float(metrics.results()["accuracy"]) == pytest.approx(correct / (3 * BATCH))
    restored = MetricSet(["accuracy"])
    restored.load_state(state)
    for preds, target in batches[3:]:
        metrics.update(preds, target)
        restored.update(preds, target)
    assert restored.compute() == metrics.compute()
    metrics.update(*batches[0])  # held, then dropped by the reset
    metrics.reset()
    preds, target = batches[1]
    metrics.update(preds, target)
    assert metrics.compute()["accuracy"] == pytest.approx(float((preds.argmax(-1) == target).float().mean()))


@pytest.fixture(scope="module")
def model_and_data():
    x, y = seeded_classes(100, 6, 4, seed=1)
    return Model(mlp(6, 4)).compile("adam", "cross_entropy", ["accuracy"]), x, y


def test_evaluate_gives_the_per_batch_sums(model_and_data):
    model, x, y = model_and_data
    got = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    net = model.module
    total, correct = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for i in range(0, len(x), BATCH):
            out = net(x[i:i + BATCH])
            total += torch.nn.functional.cross_entropy(out, y[i:i + BATCH]).double() * len(out)
            correct += int((out.argmax(-1) == y[i:i + BATCH]).sum())
    assert got["loss"] == float(total) / len(x)  # the same float64 sum, exactly
    assert got["accuracy"] == pytest.approx(correct / len(x), abs=1e-7)


def test_no_event_is_fired_per_batch_that_nobody_hears(model_and_data, monkeypatch):
    model, x, y = model_and_data
    fired = []
    real = CallbackHandler.call_event

    def counting(self, event, *args, **kwargs):
        fired.append(event)
        return real(self, event, *args, **kwargs)

    monkeypatch.setattr(CallbackHandler, "call_event", counting)
    per_call = {}
    for n in (2 * BATCH, 10 * BATCH):
        for call in ("evaluate", "predict"):
            fired.clear()
            if call == "evaluate":
                model.evaluate(x[:n], y[:n], batch_size=BATCH, verbose=0)
            else:
                model.predict(x[:n], batch_size=BATCH, verbose=0)
            per_call.setdefault(call, []).append(len(fired))
    assert per_call["evaluate"][0] == per_call["evaluate"][1]  # not one more call per batch
    assert per_call["predict"][0] == per_call["predict"][1]

    class Steps(TrainerCallback):
        def __init__(self):
            self.steps = 0

        def on_prediction_step(self, args, state, control, **kwargs):
            self.steps += 1

    listener = Steps()
    model.evaluate(x[:n], y[:n], batch_size=BATCH, verbose=0, callbacks=[listener])
    model.predict(x[:n], batch_size=BATCH, verbose=0, callbacks=[listener])
    assert listener.steps == 20  # heard: once per batch, as before


class _ModeRecorder(torch.nn.Module):
    """A linear layer that records whether each forward ran under inference mode."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.modes = torch.nn.Linear(6, 4), []

    def forward(self, x):
        self.modes.append(torch.is_inference_mode_enabled())
        return self.linear(x)


def test_evaluate_and_predict_run_under_inference_mode_and_give_ordinary_tensors(model_and_data):
    _, x, y = model_and_data
    net = _ModeRecorder()
    model = Model(net).compile("adam", "cross_entropy", ["accuracy", "sparse_categorical_accuracy"])
    first = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    one = model.predict(x[:BATCH], batch_size=BATCH, verbose=0)  # one batch: not joined by a copy
    assert net.modes and all(net.modes)
    assert not one.is_inference()
    one.add_(1)  # a user's in-place update and autograd use work on what predict returns
    torch.nn.functional.mse_loss(torch.zeros_like(one, requires_grad=True), one).backward()
    # Metric states built in inference mode are reset in place outside it, by Keras' metrics too.
    model.fit(x, y, batch_size=BATCH, epochs=2, validation_split=0.2, verbose=0)
    net.modes.clear()
    model.fit(x, y, batch_size=BATCH, epochs=1, validation_split=0.2, verbose=0)
    assert False in net.modes and True in net.modes  # training with grad, validation in inference mode
    again = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert set(again) == set(first)


class _WithGradInside(torch.nn.Module):
    """A forward that differentiates inside (as a physics-informed network does)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(1, 1)

    def forward(self, t):
        with torch.enable_grad():
            t = t.detach().requires_grad_(True)
            (du,) = torch.autograd.grad((self.linear(t) ** 2).sum(), t)
        return du


def test_a_forward_that_needs_autograd_falls_back_to_no_grad():
    t = torch.linspace(-1, 1, 20).unsqueeze(1)
    model = Model(_WithGradInside()).compile("adam", "mse")
    got = model.evaluate(t, t, batch_size=BATCH, verbose=0, return_dict=True)
    predicted = model.predict(t, batch_size=BATCH, verbose=0)
    w, b = model.module.linear.weight.item(), model.module.linear.bias.item()
    expected = 2 * (w * t + b) * w  # d/dt (w t + b)^2
    torch.testing.assert_close(predicted, expected)
    assert got["loss"] == pytest.approx(float(torch.nn.functional.mse_loss(expected, t)), rel=1e-6)


def test_a_failing_forward_raises_its_first_error_with_the_hint():
    model = Model(torch.nn.Linear(3, 2)).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match="the module raised on the first batch"):
        model.evaluate(torch.randn(10, 5), torch.randint(0, 2, (10,)), verbose=0)


def test_overridden_test_and_predict_steps_run_under_no_grad_not_inference_mode():
    seen = []

    class Own(Model):
        def test_step(self, data):
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
            x, y = data
            return {"loss": torch.nn.functional.mse_loss(self(x), y)}

        def predict_step(self, data):
            seen.append((torch.is_grad_enabled(), torch.is_inference_mode_enabled()))
            return self(data[0] if isinstance(data, (tuple, list)) else data)

    model = Own(torch.nn.Linear(2, 1)).compile("adam", "mse")
    x = torch.randn(8, 2)
    model.evaluate(x, torch.randn(8, 1), batch_size=4, verbose=0)
    model.predict(x, batch_size=4, verbose=0)
    assert seen == [(False, False)] * 4


def test_released_metrics_serve_the_next_set_with_the_same_values():
    batches = _batches("multiclass")
    fresh = MetricSet(NAMES["multiclass"])
    for preds, target in batches[:3]:
        fresh.update(preds, target)
    before = [item[1] for item in fresh._items]
    fresh.compute()
    fresh.release()
    reused = MetricSet(NAMES["multiclass"])
    for preds, target in batches:
        reused.update(preds, target)
    assert all(a is b for a, b in zip(before, (item[1] for item in reused._items), strict=True))  # reset
    new = MetricSet(NAMES["multiclass"])  # nothing spare now: constructed
    for preds, target in batches:
        new.update(preds, target)
    assert not any(item[1] is m for item in new._items for m in before)
    assert reused.compute() == new.compute()
    reused.release()
    other = MetricSet(["accuracy"])  # another class count: not the spare of 5 classes
    other.update(torch.randn(4, 3), torch.randint(0, 3, (4,)))
    assert other._items[0][1] is not before[0] and other._items[0][1].num_classes == 3


def test_the_label_metrics_of_one_output_share_one_argmax_a_batch(monkeypatch):
    batches = _batches("multiclass")
    calls = []
    real = torch.Tensor.argmax

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    shared = MetricSet(["accuracy", "f1", "precision", "recall"])
    monkeypatch.setattr(torch.Tensor, "argmax", counting)
    for preds, target in batches:
        shared.update(preds, target)
    monkeypatch.setattr(torch.Tensor, "argmax", real)
    assert len(calls) == len(batches)  # not one per metric
    values = shared.compute()
    for name in ("accuracy", "f1", "precision", "recall"):  # each as when alone
        alone = MetricSet([name])
        for preds, target in batches:
            alone.update(preds, target)
        assert alone.compute()[name] == values[name]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("with_y", [True, False])
def test_sliced_batches_cover_the_shard_in_order(drop_last, with_y):
    from fitkit.engine.data.sources import TensorSource

    x, y = torch.arange(23.0).unsqueeze(1), torch.arange(23)
    for rank in (0, 1):
        source = TensorSource(x, y if with_y else None, batch_size=4, shuffle=False, seed=None, drop_last=drop_last,
                              rank=rank, world_size=2, pad=False)
        lo = source.offset
        got = list(source.batches(0))
        sizes = [b.size for b in got]
        n = source.num_samples
        assert sizes == [4] * (n // 4) + ([] if drop_last or n % 4 == 0 else [n % 4])
        rows = torch.cat([b.inputs[0] for b in got]).squeeze(1)
        assert torch.equal(rows, x[lo:lo + sum(sizes)].squeeze(1))
        assert all(b.size == len(b.inputs[0]) for b in got)
        if with_y:
            assert torch.equal(torch.cat([b.target for b in got]), y[lo:lo + sum(sizes)])
        else:
            assert all(b.target is None for b in got)
    shuffled = TensorSource(x, y, batch_size=4, shuffle=True, seed=1, drop_last=drop_last)
    got = list(shuffled.batches(0))
    assert [b.size for b in got] == [4] * 5 + ([] if drop_last else [3])
    assert all(torch.equal(b.inputs[0].squeeze(1).long(), b.target) for b in got)  # rows and labels together
    if not drop_last:
        assert sorted(torch.cat([b.target for b in got]).tolist()) == list(range(23))


class _Counted(torch.utils.data.Dataset):
    """Samples that count their reads; with `noise`, each read draws from torch's generator."""

    def __init__(self, n=40, noise=False):
        self.x, self.y = seeded_classes(n, 4, 3, seed=5)
        self.noise, self.reads = noise, [0] * n

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads[i] += 1
        x = self.x[i] + 1e-3 * torch.randn(4) if self.noise else self.x[i]
        return x, self.y[i]


@pytest.mark.parametrize("noise", [False, True])
def test_evaluate_on_a_dataloader_reads_each_batch_once_and_draws_as_a_hand_pass(noise):
    data = _Counted(noise=noise)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    torch.manual_seed(0)
    model = Model(torch.nn.Linear(4, 3)).compile("sgd", "cross_entropy", ["accuracy"])
    model.evaluate(loader, verbose=0)  # first call: arguments, metrics built
    data.reads = [0] * len(data)
    torch.manual_seed(1)
    ours = model.evaluate(loader, verbose=0, return_dict=True)
    after_ours = torch.rand(3)
    # the checks read the pass's own first batch: each sample once, random draws or not
    assert data.reads == [1] * len(data)
    torch.manual_seed(1)
    total, correct = 0.0, 0
    with torch.no_grad():
        for x, y in loader:  # the hand pass: its iterator draws one base seed, as fitkit's pass does
            out = model.module(x)
            total += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(-1) == y).sum())
    assert torch.equal(torch.rand(3), after_ours)
    if not noise:
        assert ours["loss"] == pytest.approx(total / len(data), rel=1e-6)
        assert ours["accuracy"] == pytest.approx(correct / len(data))
