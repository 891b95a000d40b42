"""`train_on_batch` in a loop: its set-up is paid once and kept while nothing it depends on
changes; each call is exactly a hand-written step."""

import functools

import torch
from helpers import mlp

from fitkit import Model
from fitkit.adapters import keras_optimizers

_net = functools.partial(mlp, 16, 4, 32)


def _batches(n=6):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def test_a_loop_of_train_on_batch_is_the_hand_written_loop():
    model = Model(_net()).compile("adam", "cross_entropy", learning_rate=1e-2)
    hand = _net()
    # what "adam" builds on CPU: torch's fused Adam with Keras' epsilon placement
    optimizer = keras_optimizers.Adam(hand.parameters(), lr=1e-2, eps=1e-7, fused=True)
    for x, y in _batches():
        reported = model.train_on_batch(x, y)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(hand(x), y)
        loss.backward()
        optimizer.step()
        assert reported == loss.item()  # the batch's loss before the update, as Keras reports it
    for a, b in zip(model.module.parameters(), hand.parameters()):
        assert torch.equal(a, b)


def test_the_kept_set_up_is_rebuilt_when_what_it_depends_on_changes():
    model = Model(_net()).compile("adam", "cross_entropy")
    (x, y), (x2, y2) = _batches(2)
    model.train_on_batch(x, y)
    kept = model.runtime.batch_stepper
    model.train_on_batch(x2, y2)
    assert model.runtime.batch_stepper is kept  # nothing changed: set up once
    model.test_on_batch(x, y)
    model.predict_on_batch(x)
    assert model.runtime.batch_stepper is kept

    model.compile("sgd", "cross_entropy")  # a fresh optimizer (Keras): the kept steps must not use the old one
    model.train_on_batch(x, y)
    assert model.runtime.batch_stepper is not kept
    assert type(model.runtime.batch_stepper.optimizer.optimizer).__name__ == "SGD"
    assert model.runtime.optimizer is model.runtime.batch_stepper.optimizer


def test_the_compiled_rate_is_set_on_every_call_as_before():
    model = Model(_net()).compile("adam", "cross_entropy", learning_rate=0.05)
    (x, y), (x2, y2) = _batches(2)
    model.train_on_batch(x, y)
    model.runtime.optimizer.param_groups[0]["lr"] = 0.5
    model.train_on_batch(x2, y2)
    assert model.runtime.optimizer.param_groups[0]["lr"] == 0.05


def test_inputs_that_need_adapting_still_are():
    """float64 features are cast to float32 (the module's dtype) as fit casts them; a length
    mismatch is still the clear error."""
    (x, y), = _batches(1)
    a = Model(_net()).compile("sgd", "cross_entropy")
    b = Model(_net()).compile("sgd", "cross_entropy")
    assert a.test_on_batch(x, y) == b.test_on_batch(x.double(), y)
    assert a.train_on_batch(x, y) == b.train_on_batch(x.double(), y)
    try:
        a.train_on_batch(x, y[:3])
    except ValueError as err:
        assert "`x` has 8 samples but `y` has 3" in str(err)
    else:
        raise AssertionError("a length mismatch trained")


def test_a_batch_read_through_a_loader_goes_to_the_device():
    """Inputs `adapt` reads through a loader (a DataLoader, a list of samples) come to the
    model's device as in-memory tensors do (was: AttributeError, a loader source has no `to`)."""
    from types import SimpleNamespace

    from fitkit.engine import on_batch

    runtime = SimpleNamespace(fabric=SimpleNamespace(device=torch.device("meta")))  # any device but the CPU
    (x, y), = _batches(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    samples = [{"x": row, "labels": label} for row, label in zip(x, y)]
    for data in (loader, samples):
        batch = on_batch._batch(runtime, _net(), data, None, None, None)
        inputs = batch.inputs["x"] if isinstance(batch.inputs, dict) else batch.inputs[0]
        assert inputs.device.type == batch.target.device.type == "meta" and inputs.shape == x.shape
