"""Model.save / Model.load: weights-only files, atomic writes, the compile configuration."""

import os

import pytest
import torch
from helpers import mlp

from fitkit import Model


def test_round_trip_predicts_identically_and_keeps_training(blobs, tmp_path):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=1e-2)
    model.fit(x, y, epochs=2, verbose=0)
    path = tmp_path / "model.pt"
    model.save(str(path))
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary file left behind
    payload = torch.load(path, weights_only=True)
    assert payload["format"] == "fitkit-model"

    loaded = Model.load(str(path), mlp(seed=123))
    torch.testing.assert_close(loaded.predict(x), model.predict(x))
    assert loaded.evaluate(x, y) == pytest.approx(model.evaluate(x, y))
    history = loaded.fit(x, y, epochs=1, verbose=0)
    assert history.history["accuracy"][0] > 0.9

    from_init = Model.load(str(path), lambda: mlp(seed=7))
    torch.testing.assert_close(from_init.predict(x), model.predict(x))


def test_pickled_code_is_refused(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"format": "fitkit-model", "state_dict": {}, "config": None, "x": Evil()}, path)
    with pytest.raises(ValueError, match="not a fitkit model file that loads safely"):
        Model.load(str(path), mlp())
    assert not marker.exists()
