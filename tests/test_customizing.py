"""Customizing what happens in `fit` (issue 19): overridden `train_step`, `compute_loss`,
`test_step`, `predict_step`; events that carry the batch, outputs and loss; custom events.

The scenarios re-express Keras' guide "Customizing what happens in fit()" and the
pytorch-accelerated examples the seeds quote (ClassificationMetricsCallback,
SavePredictionsCallback, a subclassed trainer firing "verify_train_batch"); each checks values.
"""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import Recorder, blobs, mlp

from fitkit import Model, TrainerCallback, unpack_data

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "custom_step.py")


def regression(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(n, 1, generator=g)


def small_net(seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def same_weights(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.module.parameters(), b.module.parameters()))


# -- train_step -------------------------------------------------------------------------------
class OwnMetric(Model):
    """Keras' first example: its own loss and an extra value (mean absolute error) to log."""

    def __init__(self, module):
        super().__init__(module)
        self.seen = []  # (mae, batch size) of every step

    def train_step(self, data):
        x, y, _ = unpack_data(data)
        y_pred = self.module(x)
        loss = torch.nn.functional.mse_loss(y_pred, y)
        self.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        mae = (y_pred - y).abs().mean().detach()
        self.seen.append((mae.item(), len(x)))
        return {"loss": loss, "mae": mae}


def test_a_custom_train_step_trains_and_logs_its_own_values_averaged_per_epoch():
    x, y = regression()
    model = OwnMetric(small_net()).compile("sgd", learning_rate=0.05)
    history = model.fit(x, y, epochs=3, batch_size=20, shuffle=False, verbose=0)
    assert set(history.history) == {"loss", "mae"}
    steps = model.seen
    assert len(steps) == 9 and model.state.global_step == 9  # 3 batches of 20, 20, 8 per epoch
    for epoch in range(3):
        block = steps[3 * epoch: 3 * epoch + 3]
        expected = sum(m * n for m, n in block) / sum(n for _, n in block)  # sample-weighted, as the loss
        assert history.history["mae"][epoch] == pytest.approx(expected, rel=1e-6)
    assert history.history["loss"][2] < history.history["loss"][0]


class SuperStep(Model):
    def train_step(self, data):
        return super().train_step(data)


@pytest.mark.parametrize("options", [
    {},
    {"gradient_accumulation_steps": 2, "max_grad_norm": 0.5, "lr_scheduler": "linear", "warmup_steps": 2},
])
def test_the_default_train_step_called_from_an_override_matches_fitkits_own_loop(options):
    """Accumulation, clipping, the scheduler and the events keep working around an override."""
    x, y = regression()
    plain, custom = Model(small_net()), SuperStep(small_net())
    records = []
    for model in (plain, custom):
        recorder = Recorder()
        model.compile("adam", "mse", learning_rate=0.01, **options)
        history = model.fit(x, y, epochs=2, batch_size=8, callbacks=[recorder], verbose=0)
        records.append((history.history, recorder.events, model.state.global_step,
                        [p.detach().clone() for p in model.module.parameters()]))
    (h1, e1, s1, w1), (h2, e2, s2, w2) = records
    assert s1 == s2 and e1 == e2 and h1 == h2
    assert all(torch.equal(a, b) for a, b in zip(w1, w2))
    if options:
        assert "on_substep_end" in e1 and e1.count("on_optimizer_step") == s1 == 6


# -- compute_loss -------------------------------------------------------------------------------
class WithPenalty(Model):
    def compute_loss(self, x, y, y_pred, sample_weight=None):
        loss = super().compute_loss(x, y, y_pred, sample_weight)
        return loss + 1e-2 * sum(p.square().sum() for p in self.module.parameters())


def test_compute_loss_adds_a_penalty_used_by_the_default_train_and_test_steps():
    x, y = regression()
    net = small_net()
    penalised = WithPenalty(net).compile("sgd", "mse", learning_rate=0.05)
    h1 = penalised.fit(x, y, epochs=3, batch_size=16, shuffle=False, validation_data=(x, y), verbose=0)
    # The same penalty as a plain loss callable over the same module: the same run.
    twin = small_net()
    reference = Model(twin).compile(
        "sgd", lambda out, target: torch.nn.functional.mse_loss(out, target)
        + 1e-2 * sum(p.square().sum() for p in twin.parameters()), learning_rate=0.05)
    h2 = reference.fit(x, y, epochs=3, batch_size=16, shuffle=False, validation_data=(x, y), verbose=0)
    assert same_weights(penalised, reference)
    assert h1.history.keys() == h2.history.keys()
    for name in h1.history:
        assert h1.history[name] == pytest.approx(h2.history[name], rel=1e-6)
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(net(x), y) + 1e-2 * sum(p.square().sum() for p in net.parameters())
    assert penalised.evaluate(x, y, return_dict=True)["loss"] == pytest.approx(expected.item(), rel=1e-5)


# -- test_step and predict_step --------------------------------------------------------------------
class OwnEvaluation(Model):
    def test_step(self, data):
        x, y, _ = unpack_data(data)
        y_pred = self.module(x)
        return {"loss": torch.nn.functional.mse_loss(y_pred, y), "max_error": (y_pred - y).abs().max()}

    def predict_step(self, data):
        x, _, _ = unpack_data(data)
        return {"mean": self.module(x), "doubled": 2 * self.module(x)}


def test_test_step_values_are_val_prefixed_in_fit_and_plain_in_evaluate():
    x, y = regression()
    model = OwnEvaluation(small_net()).compile("sgd", "mse", learning_rate=0.05)
    history = model.fit(x[:32], y[:32], epochs=2, batch_size=8, validation_data=(x[32:], y[32:]), verbose=0)
    assert {"loss", "val_loss", "val_max_error"} == set(history.history)
    result = model.evaluate(x, y, batch_size=16, return_dict=True)  # three batches of 16
    with torch.no_grad():
        errors = [(model.module(x[i:i + 16]) - y[i:i + 16]) for i in (0, 16, 32)]
    assert set(result) == {"loss", "max_error"}
    assert result["max_error"] == pytest.approx(sum(e.abs().max().item() for e in errors) / 3, rel=1e-6)
    assert result["loss"] == pytest.approx(sum(e.square().mean().item() for e in errors) / 3, rel=1e-6)
    assert not model.module.training or model.module.training  # mode is restored either way
    out = model.predict(x, batch_size=10)
    with torch.no_grad():
        torch.testing.assert_close(out["doubled"], 2 * model.module(x))
        torch.testing.assert_close(out["mean"], model.module(x))


# -- a GAN: two optimizers built in the subclass ---------------------------------------------------
class GAN(Model):
    """Keras' GAN example, shrunk: a generator of 1-D samples and a discriminator."""

    def __init__(self, latent=2):
        torch.manual_seed(0)
        nets = torch.nn.ModuleDict({
            "generator": torch.nn.Sequential(torch.nn.Linear(latent, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)),
            "discriminator": torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)),
        })
        super().__init__(nets)
        self.latent = latent
        self.d_optimizer = torch.optim.Adam(nets["discriminator"].parameters(), lr=1e-2)
        self.g_optimizer = torch.optim.Adam(nets["generator"].parameters(), lr=1e-2)
        self.steps = []

    def train_step(self, data):
        real, _, _ = unpack_data(data)
        nets, bce = self.module, torch.nn.functional.binary_cross_entropy_with_logits
        noise = torch.randn(len(real), self.latent)
        fake = nets.generator(noise).detach()
        scores = nets.discriminator(torch.cat([fake, real]))
        labels = torch.cat([torch.ones(len(real), 1), torch.zeros(len(real), 1)])
        d_loss = bce(scores, labels)
        self.d_optimizer.zero_grad()
        self.backward(d_loss)
        self.d_optimizer.step()
        generator_before = [p.detach().clone() for p in nets.generator.parameters()]
        g_loss = bce(nets.discriminator(nets.generator(torch.randn(len(real), self.latent))),
                     torch.zeros(len(real), 1))
        self.g_optimizer.zero_grad()
        self.backward(g_loss)
        self.g_optimizer.step()
        self.steps.append((d_loss.item(), g_loss.item(), len(real), generator_before))
        return {"d_loss": d_loss, "g_loss": g_loss}


def test_a_gan_step_with_two_optimizers_of_its_own():
    real = 3.0 + 0.5 * torch.randn(64, 1, generator=torch.Generator().manual_seed(0))
    gan = GAN().compile("sgd", loss=None)  # the compiled optimizer is never stepped
    before = {k: v.clone() for k, v in gan.module.state_dict().items()}
    history = gan.fit(real, epochs=3, batch_size=16, verbose=0)
    assert set(history.history) == {"d_loss", "g_loss"} and gan.state.global_step == 12
    for epoch in range(3):
        block = gan.steps[4 * epoch: 4 * epoch + 4]
        assert history.history["d_loss"][epoch] == pytest.approx(sum(d for d, *_ in block) / 4, rel=1e-6)
        assert history.history["g_loss"][epoch] == pytest.approx(sum(g for _, g, *_ in block) / 4, rel=1e-6)
    after = gan.module.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)  # both networks trained
    assert gan.optimizer.state_dict()["state"] == {}  # fitkit's own optimizer untouched
    # The discriminator's step does not move the generator: it changed only in its own step.
    first_generator = gan.steps[0][3]
    assert all(torch.equal(a, b) for a, b in zip(first_generator, before_generator(before)))


def before_generator(state):
    return [state[k] for k in state if k.startswith("generator.")]


# -- events that carry the batch, outputs and loss --------------------------------------------------
class ClassificationMetrics(TrainerCallback):
    """pytorch-accelerated's ClassificationMetricsCallback, as a fitkit callback: accuracy from
    the evaluation batches' outputs and targets."""

    def __init__(self):
        self.correct = self.total = 0
        self.results = []

    def on_prediction_step(self, args, state, control, batch=None, outputs=None, **kwargs):
        _, y, _ = unpack_data(batch)
        self.correct += int((outputs.argmax(1) == y).sum())
        self.total += len(y)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.results.append(self.correct / self.total)
        self.correct = self.total = 0


class SavePredictions(TrainerCallback):
    """pytorch-accelerated's SavePredictionsCallback: a CSV of predictions and targets."""

    def __init__(self, path):
        self.path, self.rows = path, []

    def on_prediction_step(self, args, state, control, batch=None, outputs=None, **kwargs):
        _, y, _ = unpack_data(batch)
        self.rows += zip(outputs.argmax(1).tolist(), y.tolist())

    def on_evaluate(self, args, state, control, **kwargs):
        with open(self.path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["prediction", "target"])
            writer.writerows(self.rows)
        self.rows = []


def test_prediction_step_callbacks_compute_metrics_and_save_predictions(tmp_path):
    x, y = blobs(90)
    metrics, saver = ClassificationMetrics(), SavePredictions(tmp_path / "predictions.csv")
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"], learning_rate=0.01)
    history = model.fit(x[:60], y[:60], epochs=2, batch_size=16, validation_data=(x[60:], y[60:]),
                        callbacks=[metrics], verbose=0)
    assert metrics.results == pytest.approx(history.history["val_accuracy"])
    result = model.evaluate(x, y, batch_size=32, callbacks=[metrics, saver], return_dict=True)
    assert metrics.results[-1] == pytest.approx(result["accuracy"])
    with open(tmp_path / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["prediction"]) for r in rows] == model.predict(x).argmax(1).tolist()
    assert [int(r["target"]) for r in rows] == y.tolist()


class StepSpy(TrainerCallback):
    def __init__(self):
        self.steps, self.substeps = [], []

    def on_step_end(self, args, state, control, batch=None, outputs=None, loss=None, **kwargs):
        self.steps.append((batch, outputs, loss))

    def on_substep_end(self, args, state, control, batch=None, outputs=None, loss=None, **kwargs):
        self.substeps.append((batch, outputs, loss))


def test_step_events_receive_the_batch_outputs_and_loss_of_the_step():
    x, y = blobs(32)
    spy, recorder = StepSpy(), Recorder()
    model = Model(mlp()).compile("sgd", "cross_entropy", gradient_accumulation_steps=2)
    model.fit(x, y, epochs=1, batch_size=8, shuffle=False, callbacks=[spy, recorder], verbose=0)
    assert len(spy.steps) == len(spy.substeps) == 2
    (bx, by), outputs, loss = spy.steps[0]
    assert torch.equal(bx, x[8:16]) and torch.equal(by, y[8:16])  # the step's last micro-batch
    assert outputs.shape == (8, 3) and loss.dim() == 0 and loss.requires_grad
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(outputs, by))
    (sx, _), _, _ = spy.substeps[0]
    assert torch.equal(sx, x[:8])
    # A callback that takes only **kwargs (HF's style) gets them too, and ignores them.
    assert {"batch", "outputs", "loss"} <= set(recorder.kwargs["on_step_end"])


# -- custom events ------------------------------------------------------------------------------------
class VerifyBatch(TrainerCallback):
    def __init__(self):
        self.calls = []

    def verify_train_batch(self, args, state, control, xb=None, yb=None, **kwargs):
        assert xb.shape[0] == yb.shape[0]
        self.calls.append((state.global_step, xb.shape[0]))


class Verifying(Model):
    def train_step(self, data):
        x, y, _ = unpack_data(data)
        self.call_event("verify_train_batch", xb=x, yb=y)
        return super().train_step(data)


def test_a_custom_event_reaches_every_callback_that_has_it():
    x, y = blobs(40)
    verify = VerifyBatch()
    model = Verifying(mlp()).compile("sgd", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=16, callbacks=[verify, Recorder()], verbose=0)
    assert verify.calls == [(0, 16), (1, 16), (2, 8), (3, 16), (4, 16), (5, 8)]


# -- misuse ---------------------------------------------------------------------------------------------
def test_step_pieces_outside_a_step_and_bad_returns_are_named():
    model = Model(mlp()).compile("sgd", "cross_entropy")
    with pytest.raises(RuntimeError, match="backward.*overridden train_step"):
        model.backward(torch.tensor(1.0, requires_grad=True))

    class Wrong(Model):
        def train_step(self, data):
            return 1.0

    x, y = blobs(16)
    with pytest.raises(TypeError, match="`train_step` must return a dict"):
        Wrong(mlp()).compile("sgd", "cross_entropy").fit(x, y, verbose=0)


def test_nothing_overridden_keeps_the_fast_path(monkeypatch):
    from fitkit.callbacks import ProgressBar
    from fitkit.engine import loop
    from fitkit.engine.overrides import StepOverrides

    assert not StepOverrides.of(Model(mlp()), Model)
    own = StepOverrides.of(Verifying(mlp()), Model)
    assert own.train_step is not None and own.test_step is None and own

    def refuse(batch):
        raise AssertionError("the batch keywords were built, but no callback takes them")

    # fitkit's own flow, display and checkpoint callbacks listen to step events but take no batch
    monkeypatch.setattr(loop, "as_data", refuse)
    x, y = blobs(32)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    model.fit(x[:24], y[:24], epochs=1, batch_size=8, validation_data=(x[24:], y[24:]), verbose=0,
              callbacks=[ProgressBar()])
    model.evaluate(x, y, verbose=2)
    assert model.state.global_step == 3


# -- several processes ------------------------------------------------------------------------------------
def _results(*args, launcher=()):
    proc = subprocess.run([*(launcher or [sys.executable]), SCRIPT, *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(lines, key=lambda r: r["rank"])


@pytest.fixture(scope="module")
def one_process():
    (single,) = _results("--devices", "1")
    return single


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_an_overridden_train_step_on_two_processes_matches_one_process(strategy, one_process):
    single = one_process
    ranks = _results("--strategy", strategy, "--devices", "2")
    assert len(ranks) == 2 and ranks[0]["weights"] == ranks[1]["weights"]
    for got in ranks:
        assert got["global_step"] == single["global_step"] == 4
        for a, b in zip(got["weights"], single["weights"]):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
        for name in ("loss", "penalty"):
            assert got["history"][name] == pytest.approx(single["history"][name], rel=1e-5)


def test_the_customizing_page_runs(tmp_path, monkeypatch, capsys):
    """Every code block of docs/customizing.md, in order, as one script."""
    import re

    page = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "customizing.md")
    with open(page) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 8
    monkeypatch.chdir(tmp_path)
    exec(compile("\n".join(blocks), page, "exec"), {"__name__": "customizing"})
    assert "accuracy" in capsys.readouterr().out
    with open(tmp_path / "predictions.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["prediction", "target"] and len(rows) == 257
