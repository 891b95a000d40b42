"""SIGTERM in the middle of an epoch, for every `save_strategy`: the SIGTERM checkpoint is the
last word (no later save records a position past the last step trained), and a resumed run
ends at the same step with the same weights as an uninterrupted one.

The signal is sent in-process, from a callback at a chosen step: the handler runs as soon as
`os.kill` returns, so the loop sees it at the end of that very step, as a real preemption."""

import os
import signal

import pytest
import torch

from fitkit import Model, TrainerCallback
from tests.helpers import blobs, mlp

STEPS_PER_EPOCH = 15  # 60 samples, batch 4


class SigtermAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def _fit(out, strategy, epochs, *, init_seed=1, resume=False, sigterm_at=None):
    x, y = blobs(80, seed=0)
    model = Model(mlp(seed=init_seed, dropout=0.2)).compile("adam", "cross_entropy", learning_rate=1e-2)
    options = {"save_strategy": strategy, "save_on_sigterm": True}
    if strategy == "steps":
        options["save_steps"] = 7
    if strategy == "best":
        options["eval_strategy"] = "epoch"
    callbacks = [SigtermAt(sigterm_at)] if sigterm_at else []
    model.fit(x[:60], y[:60], validation_data=(x[60:], y[60:]), batch_size=4, epochs=epochs, seed=3, verbose=0,
              output_dir=str(out), resume_from_checkpoint=resume, callbacks=callbacks, **options)
    return model


def _weights(model):
    return [p.detach().clone() for p in model.module.parameters()]


@pytest.mark.parametrize("epochs,stop_at", [(2, 20), (3, 20)])
@pytest.mark.parametrize("strategy", ["no", "steps", "epoch", "best"])
def test_sigterm_mid_epoch_resumes_exactly_for_every_save_strategy(tmp_path, strategy, epochs, stop_at):
    reference = _fit(tmp_path / "reference", strategy, epochs)
    assert reference.state.global_step == epochs * STEPS_PER_EPOCH

    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        _fit(out, strategy, epochs, sigterm_at=stop_at)
    assert stop.value.code == 0
    newest = max(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-"))
    assert newest == stop_at

    resumed = _fit(out, strategy, epochs, init_seed=99, resume=True)  # other weights: only the checkpoint helps
    assert resumed.state.global_step == reference.state.global_step
    for mine, theirs in zip(_weights(resumed), _weights(reference)):
        assert torch.equal(mine, theirs)


def test_sigterm_at_the_last_step_of_an_epoch_resumes_exactly(tmp_path):
    reference = _fit(tmp_path / "reference", "epoch", 2)
    with pytest.raises(SystemExit):
        _fit(tmp_path / "run", "epoch", 2, sigterm_at=STEPS_PER_EPOCH)
    resumed = _fit(tmp_path / "run", "epoch", 2, init_seed=99, resume=True)
    assert resumed.state.global_step == reference.state.global_step
    for mine, theirs in zip(_weights(resumed), _weights(reference)):
        assert torch.equal(mine, theirs)
