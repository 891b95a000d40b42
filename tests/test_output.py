"""Output as a Keras user expects it: no library banner or warning that is not the user's
business, a validation bar that knows its length, values readable at 80 columns, and the
epoch line's order with `eval_strategy="steps"`."""

import io
import logging
import os
import re
import subprocess
import sys
import time
import warnings

import pytest
import torch
from helpers import blobs, mlp, reserved_port

from fitkit import Model, TrainerCallback, TrainingArguments
from fitkit.callbacks import ProgressBar
from fitkit.callbacks.display import progress as progress_module

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "quiet_output.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BANNER = ("Initializing distributed", "distributed_backend=", "All distributed processes registered", "-" * 20)


def _run_ddp(devices: int, *extra: str) -> tuple[str, str]:
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, SCRIPT, str(devices), *extra], capture_output=True, text=True,
                              timeout=240, env=dict(os.environ, MASTER_PORT=str(port)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, proc.stderr


@pytest.mark.slow
def test_a_distributed_fit_prints_no_banner_and_no_deprecation_warning():
    out, err = _run_ddp(2)
    for text in BANNER:
        assert text not in out + err, out + err
    assert "deprecated" not in out + err, out + err
    # what remains: rank zero's epoch line, and what the script itself printed
    lines = [line for line in out.splitlines() if line]
    epochs = [line for line in lines if re.match(r"^\d+/\d+ - ", line)]  # one epoch: no title line (Keras)
    assert len(epochs) == 1 and re.match(r"^\d+/\d+ - .* - val_accuracy: \d\.\d{4} \| .* MiB$", epochs[0]), out
    assert sorted(set(lines) - set(epochs)) == ["DONE rank=0", "DONE rank=1"], out
    assert err.strip() == "", err


@pytest.mark.slow
def test_log_level_info_brings_lightning_s_banner_back():
    out, err = _run_ddp(1, "info")  # DDP on one process still initializes a process group
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/1" in out + err, out + err
    assert "All distributed processes registered" in out + err


def test_lightning_s_logger_follows_log_level():
    from fitkit.engine.devices.quiet import LIGHTNING_LOGGER, quiet_lightning

    logger = logging.getLogger(LIGHTNING_LOGGER + ".utilities.distributed")  # where the banner is logged
    before = logging.getLogger(LIGHTNING_LOGGER).level
    try:
        quiet_lightning(TrainingArguments(), 0, 0)  # "passive": not the user's business
        assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
        quiet_lightning(TrainingArguments(log_level="debug"), 0, 0)
        assert logger.isEnabledFor(logging.DEBUG)
        quiet_lightning(TrainingArguments(log_level="info", log_level_replica="error"), 1, 1)  # a replica
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    finally:
        logging.getLogger(LIGHTNING_LOGGER).setLevel(before)


def test_the_scheduler_does_not_warn_about_its_order():
    x, y = blobs(64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, batch_size=16, verbose=0,
                                                           lr_scheduler_type="linear", warmup_steps=2)
    # torch: "Detected call of `lr_scheduler.step()` before `optimizer.step()`" (or any other)
    assert [str(w.message) for w in caught] == []


class _Terminal:
    """Makes `ProgressBar` draw its terminal bars into a buffer, `width` columns wide."""

    def __init__(self, monkeypatch, width: int = 160):
        from rich.console import Console

        self.buffer = io.StringIO()
        console = Console(file=self.buffer, force_terminal=True, width=width, color_system=None)
        monkeypatch.setattr(progress_module, "_live_console", lambda: console)

    def frames(self) -> str:
        return ANSI.sub("", self.buffer.getvalue()).replace("\r", "\n")


class _SlowValidation(TrainerCallback):  # validation batches slow enough to be drawn mid-evaluation
    def on_prediction_step(self, args, state, control, **kwargs):
        time.sleep(0.02)


def test_the_validation_bar_knows_its_length(monkeypatch):
    terminal = _Terminal(monkeypatch)
    lengths = []

    class Lengths(TrainerCallback):
        def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
            lengths.append(len(eval_dataloader))

    x, y = blobs(96)  # 24 validation samples: 3 batches of 8
    Model(mlp()).compile("adam", "cross_entropy").fit(
        x, y, epochs=1, batch_size=8, validation_split=0.25, verbose=0,
        callbacks=[ProgressBar(refresh_seconds=0.0), _SlowValidation(), Lengths()])
    frames = terminal.frames()
    assert re.search(r"validation [━╸]+ 2/3 ", frames), frames
    assert "/?" not in frames
    assert lengths == [3, 3, 3]  # callbacks get a sized eval_dataloader for in-memory data too


def test_a_validation_dataloader_gives_its_own_length(monkeypatch):
    terminal = _Terminal(monkeypatch)
    x, y = blobs(64)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:20], y[:20]), batch_size=5)
    Model(mlp()).compile("adam", "cross_entropy").fit(
        x, y, epochs=1, batch_size=16, validation_data=loader, verbose=0,
        callbacks=[ProgressBar(refresh_seconds=0.0), _SlowValidation()])
    assert re.search(r"validation [━╸]+ 4/4 ", terminal.frames())


def test_values_stay_readable_at_80_columns():
    from rich.console import Console

    from fitkit.callbacks.display.bar import TerminalBars

    buffer = io.StringIO()
    bars = TerminalBars(Console(file=buffer, force_terminal=True, width=80, color_system=None))
    epoch = bars.add_row("Epoch 12/20", total=240)
    epoch.started -= 10.0  # 24 steps/s
    epoch.update(completed=240)
    values = "loss: 0.0258 - accuracy: 0.9930 - val_loss: 0.0731 - val_accuracy: 0.9778 - top_k: 1.0000"
    epoch.values = values
    validation = bars.add_row("  validation", total=60)
    validation.started -= 2.0
    validation.update(completed=37)
    streams = (sys.stdout, sys.stderr)
    bars.start()
    try:
        bars.refresh()
    finally:
        bars.stop()
    assert (sys.stdout, sys.stderr) == streams
    screen = ANSI.sub("", buffer.getvalue())
    last = screen.replace("\r", "\n").split("\n")
    lines = [line for line in last if line.strip()]
    assert all(len(line) <= 79 for line in lines), lines  # the 80th column would wrap
    assert "…" not in screen  # nothing cut
    for value in values.split(" - "):  # each value whole, on one line
        assert sum(value in line for line in lines) == 1, (value, lines)
    assert re.match(r"^Epoch 12/20  [━╸]{30} 240/240 ", lines[0]), lines  # the bar keeps its width
    assert lines[-1].startswith("  validation ") and " 37/60 " in lines[-1], lines


def test_epoch_line_order_with_evaluation_every_few_steps(capsys):
    class SlowEvaluation(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            time.sleep(0.4)

    x, y = blobs(128)  # 96 training samples: 6 steps, evaluated every 2 (the last at the epoch's end)
    Model(mlp()).compile("adam", "cross_entropy", ["accuracy"]).fit(
        x, y, epochs=1, batch_size=16, validation_split=0.25, verbose=2, eval_strategy="steps", eval_steps=2,
        callbacks=[SlowEvaluation()])
    (line,) = capsys.readouterr().out.splitlines()
    # training values first, then validation, as docs/display.md gives (the first evaluation's
    # values were logged before the epoch's training values)
    match = re.match(r"^6/6 - (\S+) - ([\d.]+)(us|ms|s)/step - loss: \S+ - accuracy: \S+ - val_loss: \S+"
                     r" - val_accuracy: \S+ \| ", line)
    assert match, line
    per_step = float(match.group(2)) / {"us": 1e6, "ms": 1e3, "s": 1}[match.group(3)]
    assert per_step * 6 < 1.2, line  # the evaluations inside the epoch (1.2 s of sleep) are not training time
