"""A callback written for `transformers.Trainer` (subclassing the real `transformers.TrainerCallback`)
runs unchanged in fitkit."""

import pytest
from helpers import blobs, mlp

from fitkit import Model, TrainerCallback
from fitkit.callbacks import CallbackHandler

transformers = pytest.importorskip("transformers")


def data(n=64, seed=0):
    return blobs(n, seed)


class HFStopper(transformers.TrainerCallback):
    """Plain HF callback code: reads args / state, flips control at step 5 and returns it."""

    def __init__(self, stop_at=5):
        self.stop_at = stop_at
        self.seen, self.logs, self.metrics = [], [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append((args.output_dir, state.global_step, state.epoch, len(state.log_history)))
        if state.global_step == self.stop_at:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.append(dict(metrics))


def test_real_transformers_callback_stops_training_where_it_asked(tmp_path):
    cb = HFStopper(stop_at=5)
    assert not isinstance(cb, TrainerCallback)
    assert CallbackHandler([cb]).listeners("on_epoch_begin") == []  # transformers' empty hooks are skipped

    model = Model(mlp()).compile("adam", "cross_entropy", learning_rate=0.01)
    model.fit(*data(), batch_size=16, epochs=3, output_dir=str(tmp_path), logging_strategy="steps",
              logging_steps=2, validation_data=data(16, 1), callbacks=[cb], verbose=0, seed=0)
    assert model.state.global_step == 5
    assert [s[1] for s in cb.seen] == [1, 2, 3, 4, 5]
    assert {s[0] for s in cb.seen} == {str(tmp_path)}
    assert [s[2] for s in cb.seen] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.25])
    # log_history grows by the step-2 record, then the step-4 record + epoch 1's validation record (step
    # logging: no epoch-average record, as HF)
    assert [s[3] for s in cb.seen] == [0, 0, 1, 1, 3]
    assert "loss" in cb.logs[0] and "learning_rate" in cb.logs[0]
    assert [sorted(m) for m in cb.metrics][0] == ["eval_loss"]  # a transformers callback sees HF's names
    assert model.history.history["val_loss"]  # fitkit's own records keep Keras names
    # the stop at step 5 ends the run in epoch 2; its epoch-end evaluation still runs
    assert len(cb.metrics) == 2
