"""Digits: scikit-learn's bundled 8x8 digit images (1,797 samples, no download).

A small network, `compile("adam", "cross_entropy", ["accuracy"])`, `fit` with a validation
split, early stopping and a progress bar, the training curves saved as a PNG
(`fitkit_output/digits_history.png`), then a short Optuna search.

    python examples/digits.py            # what `make demo` runs
"""

from __future__ import annotations

import os
import sys

import torch
from sklearn.datasets import load_digits

from fitkit import Model
from fitkit.callbacks import EarlyStopping


def load() -> tuple[torch.Tensor, torch.Tensor]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    # Shuffle once with a fixed seed so the validation split (the last 20%) holds every class.
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def build(hidden: int = 128, dropout: float = 0.1) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def main() -> float:
    x, y = load()
    torch.manual_seed(0)
    model = Model(build()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=3e-3)
    print(model.summary(x[:2]))
    callbacks = [EarlyStopping(monitor="val_loss", patience=3, restore_best_weights=True)]
    history = model.fit(x, y, epochs=20, batch_size=32, validation_split=0.2, callbacks=callbacks,
                        verbose=1 if sys.stdout.isatty() else 2, seed=0)
    val_loss, val_accuracy = model.evaluate(x[int(len(x) * 0.8):], y[int(len(y) * 0.8):])  # Keras' list
    print(f"epochs run: {len(history.epoch)}")
    print(f"final validation accuracy: {val_accuracy:.4f} (loss {val_loss:.4f})")
    save_curves(history)
    return val_accuracy


def save_curves(history, path: str = os.path.join("fitkit_output", "digits_history.png")) -> None:
    """Loss and accuracy per epoch, training and validation, as a PNG (needs matplotlib)."""
    try:
        history.plot(path)
    except ImportError as error:  # the `plot` extra is optional
        print(f"training curves not drawn: {error}")
        return
    print(f"training curves: {os.path.abspath(path)}")


def short_search(n_trials: int = 4) -> None:
    """A short Optuna search (the full one is examples/search.py)."""
    import optuna
    from search import search  # examples/search.py

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = search(n_trials, storage=None, epochs=4)
    print(f"search: best of {n_trials} trials has val_accuracy={best.objective:.4f} "
          f"with {best.hyperparameters}")


if __name__ == "__main__":
    accuracy = main()
    if accuracy < 0.95:
        sys.exit(f"validation accuracy {accuracy:.4f} is below 0.95")
    short_search()
