"""What a run shows: the rich progress bar on a terminal, plain lines on a pipe, the summary table."""

import io
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest
import torch
from helpers import blobs, mlp

from fitkit import Model, TrainerCallback
from fitkit.callbacks import ProgressBar
from fitkit.callbacks.display import progress as progress_module
from fitkit.callbacks.display.progress import format_duration, format_logs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
#: Keras 3's epoch title, then its line (`12/12 - 1s - 4ms/step - loss: ... - val_accuracy: 0.9612`), then
#: fitkit's figures after `|` (the bar's final frame has Keras' 20-cell bar instead of the dashes).
TITLE = re.compile(r"^Epoch (\d+)/(\d+)$")
KERAS_VALUES = r"loss: \d+\.\d{4} - accuracy: \d\.\d{4} - val_loss: \d+\.\d{4} - val_accuracy: \d\.\d{4}"
EXTRAS = r" \| [\d.]+ steps/s - \d+ samples/s - ETA \d+:\d\d:\d\d - peak \d+ MiB"
EPOCH_LINE = re.compile(r"^12/12 - \d+s - \d+(us|ms|s)/step - " + KERAS_VALUES + EXTRAS + "$")
FINAL_FRAME = re.compile(r"^12/12 ━{20} \d+s \d+(us|ms|s)/step - " + KERAS_VALUES + EXTRAS + "$")


def epoch_lines(lines, pattern=EPOCH_LINE):
    """The epoch numbers of each `Epoch i/n` title followed by a line matching `pattern`."""
    lines = [line.strip() for line in lines if line.strip()]
    return [TITLE.match(a).group(1) for a, b in zip(lines, lines[1:]) if TITLE.match(a) and pattern.match(b)]

# One child process runs three fits, each with its stdout on another stream (so torch and
# Fabric are imported once): verbose=1 on a pipe (its real stdout), verbose=1 on a
# pseudo-terminal, verbose=2 on a second pseudo-terminal. 96 training samples in batches of 8
# make 12 steps an epoch; 32 validation samples make 4 validation batches.
SCRIPT = """
import os, sys, time, torch
sys.path.insert(0, {tests!r})
from helpers import blobs, mlp
from fitkit import Model, TrainerCallback

class Slow(TrainerCallback):  # a few ms a step, so the bar is seen mid-epoch
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.004)

def run(stream, verbose):
    sys.stdout = stream
    print("start", flush=True)
    x, y = blobs(128)
    Model(mlp()).compile("adam", "cross_entropy", ["accuracy"]).fit(
        x, y, epochs=3, batch_size=8, validation_split=0.25, verbose=verbose, callbacks=[Slow()])
    print("end", flush=True)

pipe = sys.stdout
run(pipe, 1)
for fd, verbose in ((int(sys.argv[1]), 1), (int(sys.argv[2]), 2)):
    terminal = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
    run(terminal, verbose)
    terminal.close()
sys.stdout = pipe
"""


def _clean_env() -> dict:
    unset = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(TERM="xterm-256color", COLUMNS="160", LINES="40", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """{"pipe": text, "terminal": text, "terminal_v2": text} written by the child process."""
    folder = tmp_path_factory.mktemp("display")
    script = folder / "run_fits.py"
    script.write_text(SCRIPT.format(tests=os.path.join(ROOT, "tests")))
    terminals = [pty.openpty() for _ in range(2)]
    proc = subprocess.Popen([sys.executable, str(script), str(terminals[0][1]), str(terminals[1][1])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=_clean_env(), cwd=folder, pass_fds=[t[1] for t in terminals])
    for _, secondary in terminals:
        os.close(secondary)
    names = {proc.stdout.fileno(): "pipe", proc.stderr.fileno(): "stderr",
             terminals[0][0]: "terminal", terminals[1][0]: "terminal_v2"}
    chunks = {name: [] for name in names.values()}
    open_fds, deadline = set(names), time.monotonic() + 240
    try:
        while open_fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(open_fds), [], [], 1.0)
            for fd in ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the terminal's last writer closed it
                    data = b""
                if data:
                    chunks[names[fd]].append(data)
                else:
                    open_fds.discard(fd)
    finally:
        for primary, _ in terminals:
            os.close(primary)
        proc.wait(timeout=60)
    texts = {name: b"".join(parts).decode("utf-8", "replace") for name, parts in chunks.items()}
    assert proc.returncode == 0, texts
    return texts


def test_terminal_draws_live_bars_then_one_keras_line_per_epoch(outputs):
    raw = outputs["terminal"]
    assert "\x1b[" in raw and "\r" in raw  # a live display: cursor movement, redraws
    frames = ANSI.sub("", raw).replace("\r\n", "\n").replace("\r", "\n")
    # the bar's pieces: steps done / total, rate, ETA, and the live running values
    assert re.search(r"━+\s+12/12 \d+\.\d steps/s\s+ETA", frames), frames
    assert re.search(r"━ \d+/12 ", frames)  # mid-epoch frames exist too (redrawn on the timer)
    assert re.search(r"12/12 .*loss: \d\.\d{4} - accuracy: \d\.\d{4}", frames)
    # validation: a transient bar counting the 4 batches, whose number is known up front
    assert re.search(r"validation\s+━+\s+4/4 ", frames), frames
    # each epoch leaves its Keras line
    lines = [line.strip() for line in frames.splitlines()]
    assert [TITLE.match(line).group(1) for line in lines if TITLE.match(line)] == ["1", "2", "3"], frames
    assert len([line for line in lines if FINAL_FRAME.match(line)]) == 3, frames  # the bars' final frames
    assert "\x1b[?25h" in raw  # the cursor is shown again at the end
    assert frames.strip().startswith("start") and frames.strip().endswith("end")


def test_pipe_gets_one_plain_line_per_epoch_and_no_control_characters(outputs):
    out = outputs["pipe"]
    assert "\x1b" not in out and "\r" not in out
    lines = out.splitlines()
    assert lines[0] == "start" and lines[-1] == "end"
    epochs = lines[1:-1]
    assert len(epochs) == 6, out
    assert epoch_lines(epochs) == ["1", "2", "3"] and all(TITLE.match(l) for l in epochs[::2]), out


def test_verbose_two_prints_plain_lines_even_on_a_terminal(outputs):
    raw = outputs["terminal_v2"]
    assert "\x1b" not in raw  # no rich display at all
    lines = [l for l in raw.replace("\r\n", "\n").splitlines() if l]
    assert lines[0] == "start" and lines[-1] == "end"
    assert epoch_lines(lines[1:-1]) == ["1", "2", "3"] and len(lines) == 8, raw


def test_logged_values_and_durations_format():
    logs = {"loss": 0.12344, "accuracy": 0.96123, "learning_rate": 0.001, "epoch": 3.0,
            "val_loss": 0.2, "val_accuracy": 0.95, "stopped": "why", "flag": True}
    assert format_logs(logs) == "loss: 0.1234 - accuracy: 0.9612 - val_loss: 0.2000 - val_accuracy: 0.9500"
    assert format_logs({"loss": 1e-6}) == "loss: 1.0000e-06"
    assert (format_duration(1.234), format_duration(0.25), format_duration(75)) == ("1.2s", "250ms", "1m 15s")


def _frame(display):
    """The text of the frame the bars draw now."""
    from fitkit.callbacks.display import bar

    return "\n".join("".join(piece for piece, _ in pieces) for pieces in bar.frame(display.rows, bar.time.monotonic()))


class _FakeTerminal:
    """Makes the bar draw on a rich console that writes to a buffer as a terminal would."""

    def __init__(self, monkeypatch):
        from rich.console import Console

        from fitkit.callbacks.display.bar import TerminalBars

        self.buffer = io.StringIO()
        self.refreshes = 0
        console = Console(file=self.buffer, force_terminal=True, width=160, color_system=None)
        monkeypatch.setattr(progress_module, "_live_console", lambda: console)
        original = TerminalBars.refresh

        def counting(display):
            self.refreshes += 1
            return original(display)

        monkeypatch.setattr(TerminalBars, "refresh", counting)


def test_bar_redraws_on_a_timer_not_per_step(monkeypatch):
    terminal = _FakeTerminal(monkeypatch)
    x, y = blobs(256)
    model = Model(mlp()).compile("adam", "cross_entropy")
    started = time.monotonic()
    model.fit(x, y, epochs=2, batch_size=2, verbose=0, callbacks=[ProgressBar(refresh_seconds=0.5)])
    elapsed = time.monotonic() - started
    # 256 steps: at most one redraw per 0.5 s, plus the fixed ones at epoch begin / end / log
    assert terminal.refreshes <= elapsed / 0.5 + 12, (terminal.refreshes, elapsed)
    text = terminal.buffer.getvalue()
    assert "128/128" in text and "steps/s" in text
    plain = ANSI.sub("", text)
    assert len(re.findall(r"128/128 ━{20} ", plain)) == 2 and "Epoch 1/2" in plain and "Epoch 2/2" in plain


def test_bar_reads_no_tensor_per_step(monkeypatch):
    _FakeTerminal(monkeypatch)
    reads = []
    for name in ("item", "tolist", "__float__"):
        original = getattr(torch.Tensor, name)

        def wrapper(t, *a, _original=original, **k):
            if f"{os.sep}torch{os.sep}" not in sys._getframe(1).f_code.co_filename:
                reads.append(1)
            return _original(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    counts = []
    for n in (64, 512):  # 8 and 64 steps: the display must not add reads that grow with steps
        x, y = blobs(n)
        model = Model(mlp()).compile("adam", "cross_entropy")
        reads.clear()
        # the running values are read at the epoch's first step, then on their timer: kept off here
        bar = ProgressBar(refresh_seconds=0.0, values_seconds=3600)
        model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[bar])
        counts.append(len(reads))
    assert counts[0] == counts[1], counts


def test_the_bar_shows_running_values_from_each_epochs_first_step(monkeypatch):
    _FakeTerminal(monkeypatch)
    first = []

    class Watching(ProgressBar):
        def on_epoch_begin(self, args, state, control, **kwargs):
            super().on_epoch_begin(args, state, control, **kwargs)
            self.fresh = True

        def on_step_end(self, args, state, control, **kwargs):
            super().on_step_end(args, state, control, **kwargs)
            if self.fresh:
                first.append(self._task.values)
                self.fresh = False

    x, y = blobs(64)
    model = Model(mlp()).compile("adam", "cross_entropy")
    # the values' own timer never comes due in this run: only the epoch's first step shows them
    model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[Watching(refresh_seconds=0.0, values_seconds=3600)])
    assert len(first) == 2 and all(v.startswith("loss: ") for v in first), first


def test_only_the_world_zero_process_displays(blobs, capsys):
    class NotZero(TrainerCallback):  # order 0: runs before the display (order 100)
        def on_train_begin(self, args, state, control, **kwargs):
            state.is_world_process_zero = False

    x, y = blobs
    Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=2, verbose=2, callbacks=[NotZero()])
    assert capsys.readouterr().out == ""


def test_summary_is_a_rich_table_captured_as_plain_text():
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                              torch.nn.Sequential(torch.nn.Linear(128, 10)))
    net[0].bias.requires_grad_(False)
    text = Model(net).summary(torch.randn(2, 64))
    assert isinstance(text, str) and repr(text) == str(text)
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines[0] == 'Model: "Sequential"'
    table = [l for l in lines if l[:1] in "┏┃┡│└"]
    assert len({len(l) for l in table}) == 1  # one width: a drawn table
    header = [c.strip() for c in table[1].strip("┃").split("┃")]
    assert header == ["Layer (type)", "Output shape", "Params", "Trainable"]
    rows = [[c.strip() for c in l.strip("│").split("│")] for l in table if l.startswith("│")]
    assert rows == [
        ["0 (Linear)", "(None, 128)", "8,320", "8,192"],
        ["1 (ReLU)", "(None, 128)", "0", "0"],
        ["2 (Sequential)", "(None, 10)", "0", "0"],
        ["2.0 (Linear)", "(None, 10)", "1,290", "1,290"],
    ]
    assert "│   2.0 (Linear)" in text  # nested modules are indented
    assert lines[-3:] == ["Total params: 9,610", "Trainable params: 9,482", "Non-trainable params: 128"]


def test_summary_draws_in_colour_on_a_rich_console():
    from rich.console import Console

    summary = Model(mlp()).summary()
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor", width=200)
    console.print(summary)
    coloured = console.file.getvalue()
    assert "\x1b[" in coloured  # styles
    assert ANSI.sub("", coloured).rstrip("\n").splitlines() == str(summary).splitlines()


def test_a_display_left_open_by_a_failed_run_is_closed_by_the_next(monkeypatch):
    from fitkit.callbacks.display.bar import _Above as FileProxy

    terminal = _FakeTerminal(monkeypatch)

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("boom")

    x, y = blobs(64)
    model = Model(mlp()).compile("adam", "cross_entropy")
    try:
        with pytest.raises(RuntimeError, match="boom"):
            model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[ProgressBar(), Boom()])
        # fit closes its displays on any exit: the streams are the process's again
        assert not isinstance(sys.stdout, FileProxy) and progress_module._OPEN_DISPLAYS == []
        model.fit(x, y, epochs=1, batch_size=8, verbose=0, callbacks=[ProgressBar()])
        assert not isinstance(sys.stdout, FileProxy) and not isinstance(sys.stderr, FileProxy)
        assert progress_module._OPEN_DISPLAYS == []
        assert terminal.buffer.getvalue().count("\x1b[?25h") == 2  # each display gave the cursor back
    finally:
        progress_module._stop_open_displays()


def test_bar_frame_layout(monkeypatch):
    from types import SimpleNamespace

    from rich.console import Console

    from fitkit.callbacks.display import bar as _bar
    from fitkit.callbacks.display.bar import BAR_WIDTH, TerminalBars

    clock = [1000.0]  # the bars' clock, set by the test: the rate is exact, however busy the machine
    monkeypatch.setattr(_bar, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)
    display = TerminalBars(console)
    epoch = display.add_row("Epoch 2/10", total=300, completed=20)  # resumed at step 20
    clock[0] += 2.0
    epoch.update(completed=137)
    epoch.values = "loss: 0.1234"
    validation = display.add_row("  validation", total=None)
    validation.update(completed=3)
    first, second = _frame(display).split("\n")
    bar = first[len("Epoch 2/10   "):][:BAR_WIDTH]
    assert first.startswith("Epoch 2/10   ") and second.startswith("  validation ")  # titles aligned
    assert bar == "━" * 13 + "╸" + "━" * 16  # 137/300 of 30 cells: 13 full, one half
    rate = re.search(r" 137/300 (\d+\.\d) steps/s ETA 0:00:(\d\d) loss: 0\.1234$", first)
    assert rate and rate.groups() == ("58.5", "03"), first  # 117 steps in 2 s; 163 left: 2.8 s
    assert " 3/? " in second and "ETA" not in second
    epoch.update(completed=300)
    assert epoch.finished is not None and "━" * BAR_WIDTH + " 300/300 " in _frame(display)
    display.remove_row(validation)
    assert "\n" not in _frame(display)


def test_lines_printed_while_the_bars_are_up_go_above_them():
    from rich.console import Console

    from fitkit.callbacks.display.bar import TerminalBars

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=120, color_system=None)
    bars = TerminalBars(console)
    streams = (sys.stdout, sys.stderr)
    bars.start()
    try:
        assert sys.stderr is streams[1]  # not a terminal here (captured): left alone
        row = bars.add_row("Epoch 1/1", total=4)
        row.update(completed=1)
        bars.refresh()
        print("first", end="")  # a line in two writes
        print(" line")
        kept = sys.stdout
        sys.stdout.write("no newline yet")
    finally:
        bars.stop()
    assert (sys.stdout, sys.stderr) == streams
    kept.write("after\n")  # a proxy kept past the end writes straight through
    screen = ANSI.sub("", buffer.getvalue())
    assert buffer.getvalue().startswith("\x1b[?25l") and buffer.getvalue().endswith("\x1b[?25h")
    assert screen.count("first line\n") == 1 and screen.count("no newline yet\n") == 1
    # each write erases the bar ("\r" + erase line), prints the text, draws the bar again below it
    lines = [line for line in screen.replace("\r", "\n").split("\n") if line]
    first = lines.index("first line")
    assert re.match(r"Epoch 1/1 [━╸]+ 1/4 ", lines[first + 1]), lines
    assert lines[-1] == "no newline yet"  # the bar is gone at the end (transient)


def test_bars_shrink_to_fit_a_narrow_terminal():
    from fitkit.callbacks.display.bar import BAR_WIDTH, frame
    from fitkit.callbacks.display.bar import Row as BarRow

    row = BarRow("Epoch 13/20", total=45)
    row.update(completed=20)
    row.values = "loss: 0.0258 - accuracy: 0.9930"

    def bar_cells(width):
        (line,) = frame([row], time.monotonic(), width)
        return sum(len(text) for text, style in line if style and style.startswith("bar."))

    assert bar_cells(None) == bar_cells(200) == BAR_WIDTH
    assert 10 <= bar_cells(100) < BAR_WIDTH  # made room for the values
    assert bar_cells(60) == 10  # never narrower than 10 cells; the caller cuts the rest
