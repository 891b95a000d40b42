"""ReduceLROnPlateau and LearningRateScheduler: the rate the optimizer really used, epoch by epoch."""

import json

import pytest
import torch
from helpers import Script, mlp
from helpers import blobs as data

from fitkit import Model, TrainerCallback
from fitkit.callbacks import LambdaCallback, LearningRateScheduler, ReduceLROnPlateau


class Flat(torch.nn.Module):
    """Its output does not depend on its trainable parameter: any learning rate leaves the
    validation loss exactly flat."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fixed = torch.nn.Linear(8, 3).requires_grad_(False)
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.fixed(x) + 0.0 * self.unused


def fit(callbacks, module=None, epochs=6, lr=0.1, validation=True, **compile_options):
    x, y = data()
    model = Model(module or Flat()).compile("sgd", "cross_entropy", learning_rate=lr, **compile_options)
    history = model.fit(x, y, batch_size=8, epochs=epochs, validation_data=data(16, 1) if validation else None,
                        callbacks=callbacks, verbose=0, seed=0)
    return model, history


def epoch_rates(model):
    """The learning rate logged with each epoch's training record (the rate used in that epoch)."""
    return [r["learning_rate"] for r in model.state.log_history if "learning_rate" in r]


# -- ReduceLROnPlateau ------------------------------------------------------------------------------------
def test_rate_is_cut_after_patience_flat_evaluations():
    plateau = ReduceLROnPlateau(factor=0.5, patience=2)
    final = []
    at_end = LambdaCallback(on_train_end=lambda a, s, c, optimizer=None, **k: final.append(optimizer.param_groups[0]["lr"]))
    model, history = fit([plateau, at_end], epochs=7)
    assert len(set(history.history["val_loss"])) == 1  # really flat
    # evaluation 1 sets the best, evaluations 2 and 3 are flat -> cut; 4, 5 flat -> cut; 6, 7 -> cut
    assert epoch_rates(model) == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert final == pytest.approx([0.0125])  # the cut after the last epoch


def test_improving_values_keep_the_rate():
    plateau = ReduceLROnPlateau(factor=0.5, patience=1)
    model, _ = fit([Script("val_loss", [5, 4, 3, 2, 1, 0.5]), plateau], epochs=6)
    assert epoch_rates(model) == pytest.approx([0.1] * 6)


def test_min_delta_and_min_lr():
    plateau = ReduceLROnPlateau(factor=0.5, patience=1, min_delta=0.5, min_lr=0.03)
    model, _ = fit([Script("val_loss", [5, 4.8, 4.6, 4.4, 4.2, 4.0]), plateau], epochs=6)
    # steps of 0.2 are below min_delta: a cut after every evaluation but the first, floored at 0.03
    assert epoch_rates(model) == pytest.approx([0.1, 0.1, 0.05, 0.03, 0.03, 0.03])


def test_cooldown_waits_before_counting_again():
    plateau = ReduceLROnPlateau(factor=0.5, patience=1, cooldown=2)
    model, _ = fit([plateau], epochs=6)
    # cut at evaluation 2 (counter = 2); evaluation 3 counts it down to 1 and is skipped; evaluation 4
    # counts it down to 0 and counts again (Keras): cut at 4 and 6 instead of at every evaluation
    assert epoch_rates(model) == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    model, _ = fit([ReduceLROnPlateau(factor=0.5, patience=1)], epochs=4)
    assert epoch_rates(model) == pytest.approx([0.1, 0.1, 0.05, 0.025])


def test_mode_max_for_accuracy():
    plateau = ReduceLROnPlateau(monitor="val_accuracy", factor=0.5, patience=1)
    model, _ = fit([Script("val_accuracy", [0.1, 0.2, 0.3, 0.4]), plateau], epochs=4)
    assert epoch_rates(model) == pytest.approx([0.1] * 4)  # rising accuracy is improving


def test_a_step_scheduler_does_not_undo_the_cut():
    # warm-up makes fitkit build a LambdaLR that rewrites the rate at every step
    plateau = ReduceLROnPlateau(factor=0.5, patience=1)
    model, _ = fit([plateau], epochs=4, warmup_steps=1)
    assert epoch_rates(model) == pytest.approx([0.1, 0.1, 0.05, 0.025])


def test_argument_checks_and_state():
    with pytest.raises(ValueError, match="factor"):
        ReduceLROnPlateau(factor=1.0)
    with pytest.raises(ValueError, match="mode='min'"):
        ReduceLROnPlateau(monitor="val_custom")
    plateau = ReduceLROnPlateau(factor=0.5, patience=3)
    fit([plateau], epochs=3)
    saved = json.loads(json.dumps(plateau.state()))
    assert saved["wait"] == 2 and saved["cooldown_counter"] == 0
    resumed = ReduceLROnPlateau(factor=0.5, patience=3)
    resumed.load_state(saved)
    model, _ = fit([resumed], epochs=2)
    assert epoch_rates(model) == pytest.approx([0.1, 0.05])  # wait 2 -> 3 at the first evaluation: cut


# -- LearningRateScheduler ------------------------------------------------------------------------------------
def test_schedule_sets_the_rate_of_each_epoch():
    calls = []

    def schedule(epoch, lr):
        calls.append((epoch, lr))
        return 0.1 * (epoch + 1)

    model, _ = fit([LearningRateScheduler(schedule)], module=mlp(), epochs=3, lr=0.5, validation=False)
    assert [e for e, _ in calls] == [0, 1, 2]
    assert [lr for _, lr in calls] == pytest.approx([0.5, 0.1, 0.2])  # the current rate is passed in
    assert epoch_rates(model) == pytest.approx([0.1, 0.2, 0.3])


def test_schedule_of_the_epoch_only_and_per_group_rates():
    x, y = data()
    net = mlp()
    opt = lambda params: torch.optim.SGD([{"params": net[0].parameters(), "lr": 0.2},  # noqa: E731
                                          {"params": net[2].parameters(), "lr": 0.02}])
    model = Model(net).compile(opt, "cross_entropy")
    seen = []
    recorder = type("R", (TrainerCallback,), {
        "order": 20,
        "on_epoch_begin": lambda self, a, s, c, optimizer=None, **k: seen.append(
            [g["lr"] for g in optimizer.param_groups]),
    })()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, seed=0,
              callbacks=[LearningRateScheduler(lambda epoch: 0.01 * (epoch + 1)), recorder])
    assert seen == [pytest.approx([0.01, 0.01]), pytest.approx([0.02, 0.02])]

    halve = LearningRateScheduler(lambda epoch, lr: lr / 2)
    model = Model(net).compile(opt, "cross_entropy")
    seen.clear()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, seed=0, callbacks=[halve, recorder])
    assert seen == [pytest.approx([0.1, 0.01]), pytest.approx([0.05, 0.005])]


def test_schedule_survives_a_step_scheduler():
    rates = [0.3, 0.05, 0.02]
    model, _ = fit([LearningRateScheduler(lambda epoch, lr: rates[epoch])], module=mlp(), epochs=3,
                   validation=False, warmup_steps=1)
    assert epoch_rates(model)[1:] == pytest.approx([0.05, 0.02])


def test_schedule_must_return_a_rate():
    with pytest.raises(ValueError, match="epoch 0"):
        fit([LearningRateScheduler(lambda epoch, lr: float("nan"))], module=mlp(), epochs=1)
    with pytest.raises(ValueError, match="finite number"):
        fit([LearningRateScheduler(lambda epoch, lr: "fast")], module=mlp(), epochs=1)
    with pytest.raises(TypeError):
        LearningRateScheduler(0.1)
