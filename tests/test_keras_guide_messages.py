"""Two messages a Keras user meets in the guides, saying what to do: `self.add_loss(...)` in a
torch module's forward (fitkit has none: return the extra loss, override `compute_loss`), and a
`ModelCheckpoint` path with `{loss}` saved every N batches (`logging_strategy="steps"` makes the
values there)."""

import os

import pytest
import torch

from fitkit import Model
from fitkit.callbacks import ModelCheckpoint
from fitkit.common.keras_idioms import keras_idiom_hint


class WithAddLoss(torch.nn.Module):
    """The built-in-methods guide's `ActivityRegularizationLayer`, ported as written."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(3, 1)

    def forward(self, x):
        out = self.dense(x)
        self.add_loss(1e-2 * out.abs().mean())
        return out


def test_add_loss_is_answered_with_what_to_do():
    hint = keras_idiom_hint(AttributeError("'WithAddLoss' object has no attribute 'add_loss'"))
    assert "fitkit has no add_loss" in hint and "compute_loss" in hint and "return the extra loss" in hint
    assert keras_idiom_hint(AttributeError("'Net' object has no attribute 'dense2'")) is None
    assert keras_idiom_hint(ValueError("object has no attribute 'add_loss'")) is None


def test_add_loss_in_fit_names_the_fix():
    with pytest.raises(ValueError, match="fitkit has no add_loss.*compute_loss"):
        Model(WithAddLoss()).compile("sgd", "mse").fit(torch.randn(8, 3), torch.randn(8, 1), verbose=0)


def test_checkpoint_path_with_loss_every_n_batches_names_logging_strategy(tmp_path):
    x, y = torch.randn(64, 3), torch.randn(64, 1)
    path = os.path.join(tmp_path, "m-{loss:.3f}.pt")

    def fit(**options):
        Model(torch.nn.Linear(3, 1)).compile("sgd", "mse").fit(
            x, y, batch_size=8, epochs=1, verbose=0, **options,
            callbacks=[ModelCheckpoint(path, save_freq=4, save_weights_only=True)])

    with pytest.raises(KeyError, match=r'uses \{loss\}.*logging_strategy=\\?"steps\\?"'):
        fit()
    fit(logging_strategy="steps", logging_steps=4)  # what the message says: a file per save, named by its loss
    assert len(os.listdir(tmp_path)) == 2
