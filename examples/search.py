"""Hyperparameter search on the digits with Optuna: pruning, a persistent SQLite study.

    python examples/search.py                 # 20 trials; run it again to continue the study
    optuna-dashboard sqlite:///digits-search.db   # browse the study (pip install optuna-dashboard)

Every trial builds a fresh network from `model_init(trial)` (its width is searched there),
the learning rate and batch size come from `hp_space`, and trials whose validation accuracy
trails the others are pruned after an epoch or two.
"""

from __future__ import annotations

import argparse

import optuna
import torch
from sklearn.datasets import load_digits

from fitkit import Model


def load():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def model_init(trial):
    hidden = trial.suggest_int("hidden", 16, 256, log=True) if trial is not None else 128
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def hp_space(trial):
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-4, 3e-2, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [16, 32, 64]),
    }


def search(n_trials: int, storage: str | None, epochs: int = 8):
    x, y = load()
    model = Model(model_init=model_init).compile("adam", "cross_entropy", ["accuracy"])
    return model.hyperparameter_search(
        x, y, validation_split=0.2, epochs=epochs, verbose=0,
        hp_space=hp_space, n_trials=n_trials, direction="maximize",
        compute_objective=lambda metrics: metrics["val_accuracy"],
        pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1),
        storage=storage, study_name="digits", load_if_exists=True,
        hp_name=lambda trial: f"trial-{trial.number}", output_dir="fitkit_output/search",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--storage", default="sqlite:///digits-search.db")
    opts = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = search(opts.trials, opts.storage)
    print(f"best trial {best.run_id}: val_accuracy={best.objective:.4f} with {best.hyperparameters}")
    if opts.storage:
        study = optuna.load_study(study_name="digits", storage=opts.storage)
        pruned = sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)
        print(f"{len(study.trials)} trials in {opts.storage} ({pruned} pruned); "
              f"browse them with: optuna-dashboard {opts.storage}")


if __name__ == "__main__":
    main()
