"""`Model.save` keeps the optimizer state: one more epoch after `Model.load` equals one more
epoch in the original process, bit for bit on CPU; `save_weights` stays weights only."""

import functools

import pytest
import torch
from helpers import mlp, seeded_classes

from fitkit import Model

_net = functools.partial(mlp, 6, 3)
_data = functools.partial(seeded_classes, 96, 6, 3, seed=1)


@pytest.mark.parametrize("optimizer, options", [("adam", {}), ("rmsprop", {}),
                                                ("adamw", {"lr_scheduler": "cosine", "warmup_steps": 2})])
def test_one_more_epoch_after_load_equals_the_original(tmp_path, optimizer, options):
    x, y = _data()
    original = Model(_net()).compile(optimizer, "cross_entropy", metrics=["accuracy"], **options)
    original.fit(x, y, batch_size=16, epochs=1, seed=3, verbose=0)
    path = str(tmp_path / "model.pt")
    original.save(path)
    loaded = Model.load(path, _net())
    for model in (original, loaded):
        model.fit(x, y, batch_size=16, epochs=1, seed=4, verbose=0)
    for a, b in zip(original.module.parameters(), loaded.module.parameters()):
        assert torch.equal(a, b)
    assert loaded.history.history["loss"] == original.history.history["loss"]


def test_the_file_loads_weights_only_and_holds_the_optimizer_state(tmp_path):
    x, y = _data()
    model = Model(_net()).compile("adam", "cross_entropy", lr_scheduler="linear")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.save(str(tmp_path / "m.pt"))
    payload = torch.load(str(tmp_path / "m.pt"), weights_only=True)
    assert payload["optimizer"]["state"][0]["step"] == 6  # 96 / 16 steps
    assert payload["scheduler"]["last_epoch"] == 6
    assert Model.load(str(tmp_path / "m.pt"), _net()).saved_scheduler_state["last_epoch"] == 6
    model.save_weights(str(tmp_path / "w.pt"))
    weights = torch.load(str(tmp_path / "w.pt"), weights_only=True)
    assert set(weights) == set(model.module.state_dict())


def test_a_model_saved_before_any_fit_loads_with_a_fresh_optimizer(tmp_path):
    model = Model(_net()).compile("sgd", "cross_entropy")
    model.save(str(tmp_path / "m.pt"))
    loaded = Model.load(str(tmp_path / "m.pt"), _net())
    loaded.fit(*_data(), batch_size=16, epochs=1, verbose=0)
    assert loaded.optimizer is not None
