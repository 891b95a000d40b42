"""Issue 46: the Trainer's `hyperparameter_search` as HF documents it, moved to fitkit with the
Trainer lines swapped: the script's `TrainingArguments` as `args=`, `compute_objective` called
with exactly the Trainer's evaluation records at the Trainer's evaluations, the same per-trial
values for the same sampled hyperparameters, and the trials' folders where the Trainer puts them."""

import os

import pytest

from fitkit import Model

transformers = pytest.importorskip("transformers")
optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)
from hf_tiny import SPEED, accuracy, classifier, token_data  # noqa: E402

TRAIN, EVAL = token_data(24, seed=0), token_data(16, seed=1)


def model_init(trial):
    return classifier()


def hp_space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-3, 1e-1, log=True),
            "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 3)}


def search(tmp_path, who, n_trials=3, **fields):
    """The search of `who` ("hf": the Trainer's, "fitkit") with one recording `compute_objective`:
    (every call's metrics, the best run, the folders written under output_dir)."""
    calls = []

    def objective(metrics):
        calls.append(dict(metrics))
        return metrics["eval_loss"]

    out = tmp_path / who
    options = dict(output_dir=str(out), report_to="none", disable_tqdm=True, per_device_train_batch_size=8,
                   logging_steps=1, eval_strategy="epoch", save_strategy="epoch", seed=0,
                   dataloader_pin_memory=False)
    options.update(fields)
    args = transformers.TrainingArguments(**options)
    search_options = dict(hp_space=hp_space, compute_objective=objective, n_trials=n_trials, direction="minimize",
                          sampler=optuna.samplers.RandomSampler(seed=0))
    if who == "hf":
        trainer = transformers.Trainer(model_init=model_init, args=args, train_dataset=TRAIN, eval_dataset=EVAL,
                                       compute_metrics=accuracy)
        best = trainer.hyperparameter_search(backend="optuna", **search_options)
    else:
        model = Model(model_init=model_init).compile()
        best = model.hyperparameter_search(TRAIN, validation_data=EVAL, args=args, compute_metrics=accuracy,
                                           **search_options)
    written = sorted(os.path.relpath(os.path.join(root, d), out) for root, dirs, _ in os.walk(out) for d in dirs
                     if d.startswith(("run-", "checkpoint-")))
    return calls, best, written


def test_the_search_takes_the_scripts_arguments_and_passes_the_trainers_metrics(tmp_path):
    theirs, hf_best, hf_written = search(tmp_path, "hf")
    ours, best, written = search(tmp_path, "fitkit")
    assert len(ours) == len(theirs)  # once per evaluation, none more at a trial's end
    assert [list(m) for m in ours] == [list(m) for m in theirs]  # eval_loss, eval_accuracy, the speed, epoch
    for hf_metrics, metrics in zip(theirs, ours):
        for key, value in hf_metrics.items():
            if not key.endswith(SPEED):
                assert metrics[key] == pytest.approx(value, abs=1e-5), key
    assert best.hyperparameters == hf_best.hyperparameters and best.run_id == hf_best.run_id
    assert best.objective == pytest.approx(hf_best.objective, abs=1e-5)
    assert written == hf_written and "run-0" in written  # output_dir/run-{trial.number}/checkpoint-N


def test_without_an_evaluation_in_training_the_objective_comes_from_one_evaluate(tmp_path):
    theirs, hf_best, _ = search(tmp_path, "hf", n_trials=1, eval_strategy="no", save_strategy="no")
    ours, best, _ = search(tmp_path, "fitkit", n_trials=1, eval_strategy="no", save_strategy="no")
    assert len(ours) == len(theirs) == 1
    assert list(ours[0]) == list(theirs[0])
    assert ours[0]["eval_loss"] == pytest.approx(theirs[0]["eval_loss"], abs=1e-5)
    assert best.objective == pytest.approx(hf_best.objective, abs=1e-5)
