"""One rule decides whether a logged value is better higher or lower (`fitkit.common.logs.direction`):
best-model tracking, `EarlyStopping`, `ModelCheckpoint`, `ReduceLROnPlateau`, HF's `EarlyStoppingCallback`
and the `args.greater_is_better` a transformers callback reads agree, for `compute_metrics` values named
like an error (`error`, `wer`: lower is better) and like a score (`bleu`: higher is better)."""

from __future__ import annotations

import os

import pytest
from helpers import mlp, seeded_classes

from fitkit import Model, TrainerCallback
from fitkit.callbacks import EarlyStopping, EarlyStoppingCallback, ModelCheckpoint, ReduceLROnPlateau
from fitkit.common.logs import direction, greater_is_better

#: the value each evaluation reports: best at the second evaluation when lower is better, at the
#: third when higher is better
SERIES = [0.5, 0.2, 0.4, 0.3]


def _scripted(name):
    calls = []

    def compute_metrics(prediction):
        calls.append(1)
        return {name: SERIES[len(calls) - 1]}

    return compute_metrics


@pytest.mark.parametrize("name", ["error", "wer"])
def test_names_like_an_error_are_lower_is_better_everywhere(tmp_path, name):
    x, y = seeded_classes(32, 4, 2, global_rng=True)
    assert direction(f"val_{name}") == direction(f"eval_{name}") == direction(name) == "min"

    seen = {}

    class HFView(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen["greater_is_better"] = args.greater_is_better

    HFView.__module__ = "transformers.custom"  # a callback from transformers sees HF-shaped args
    best_only = ModelCheckpoint(str(tmp_path / "mc-{epoch}.pt"), monitor=f"val_{name}", save_best_only=True)
    stop = EarlyStopping(monitor=f"val_{name}", patience=0)
    model = Model(mlp(4, 2)).compile("sgd", "cross_entropy", compute_metrics=_scripted(name))
    model.fit(x, y, validation_data=(x, y), epochs=4, batch_size=16, verbose=0, output_dir=str(tmp_path / "run"),
              save_strategy="epoch", metric_for_best_model=name, callbacks=[best_only, stop, HFView()])
    # best-model tracking: the lowest value, at the second epoch (steps 2, 4, 6: two batches an epoch)
    assert model.state.best_metric == 0.2
    assert model.state.best_model_checkpoint == str(tmp_path / "run" / "checkpoint-4")
    # ModelCheckpoint wrote the first and the improving second epoch only
    assert sorted(os.listdir(tmp_path)) == sorted(["mc-1.pt", "mc-2.pt", "run"])
    # EarlyStopping (patience 0) stopped at the first value that did not go down: the third epoch
    assert len(model.history.epoch) == 3
    assert seen["greater_is_better"] is False


def test_hf_early_stopping_and_plateau_follow_the_same_rule(tmp_path):
    x, y = seeded_classes(32, 4, 2, global_rng=True)
    cut = ReduceLROnPlateau(monitor="val_error", patience=0, factor=0.5)
    hf_stop = EarlyStoppingCallback(early_stopping_patience=1)
    model = Model(mlp(4, 2)).compile("sgd", "cross_entropy", learning_rate=0.1, compute_metrics=_scripted("error"))
    model.fit(x, y, validation_data=(x, y), epochs=4, batch_size=16, verbose=0, output_dir=str(tmp_path),
              save_strategy="epoch", metric_for_best_model="error", load_best_model_at_end=True, callbacks=[cut, hf_stop])
    # 0.5, 0.2 improve; 0.4 does not: HF's callback (patience 1) stops after the 3rd evaluation (higher-is-better
    # would have stopped after the 2nd)
    assert len(model.history.epoch) == 3
    # the plateau (patience 0) cut the rate once, after the 3rd evaluation (higher-is-better: after the 2nd and 3rd)
    assert model.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5)


def test_names_like_a_score_are_higher_is_better_everywhere(tmp_path):
    x, y = seeded_classes(32, 4, 2, global_rng=True)
    assert direction("val_bleu") == direction("eval_bleu") == "max" and greater_is_better("eval_bleu")
    best_only = ModelCheckpoint(str(tmp_path / "mc-{epoch}.pt"), monitor="val_bleu", save_best_only=True)
    model = Model(mlp(4, 2)).compile("sgd", "cross_entropy", compute_metrics=_scripted("bleu"))
    model.fit(x, y, validation_data=(x, y), epochs=4, batch_size=16, verbose=0, output_dir=str(tmp_path / "run"),
              save_strategy="epoch", metric_for_best_model="bleu", callbacks=[best_only])
    assert model.state.best_metric == 0.5
    assert model.state.best_model_checkpoint == str(tmp_path / "run" / "checkpoint-2")
    assert sorted(os.listdir(tmp_path)) == ["mc-1.pt", "run"]


def test_an_explicit_choice_and_a_metric_objects_own_direction_win_over_the_name():
    assert direction("val_error", greater_is_better=True) == "max"
    assert direction("val_error", {"val_error": "max"}) == "max"
    assert direction("eval_error", {"val_error": "max"}) == "max"  # the other spellings of one value
    assert greater_is_better("val_unnamed_thing")  # HF's default for a name nothing decides
