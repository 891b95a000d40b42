"""The live bars `ProgressBar` draws: `TerminalBars` in a terminal, `NotebookBars` in Jupyter.

A frame is a few lines of styled pieces with a fixed layout. In a terminal it is written
as one string with precomputed colour codes (a redraw costs tens of microseconds; rich's
general-purpose `Progress` / `Live` pipeline cost 0.1-0.4 ms a redraw here, between
training steps). In a notebook it is an IPython display updated in place (HTML with the same
colours, and plain text), which needs no widget library. rich provides the console (colour
system, width, notebook detection) and is imported only when a display is created.
"""

from __future__ import annotations

import html
import sys
import threading
import time
from typing import Any

BAR_WIDTH = 30
_PULSE = 6  # cells of the moving segment on a bar whose total is unknown
_STYLES = ("bar.complete", "bar.finished", "bar.back", "bar.pulse", "progress.download", "progress.data.speed",
           "progress.remaining")

HIDE_CURSOR, SHOW_CURSOR, ERASE_LINE, UP = "\x1b[?25l", "\x1b[?25h", "\x1b[2K", "\x1b[1A"


class Row:
    """One bar: `title  ━━━━━╸━━━━  done/total  rate  ETA  values`."""

    __slots__ = ("title", "total", "completed", "resumed_at", "started", "finished", "values")

    def __init__(self, title: str, total: int | None, completed: int = 0, values: str = "") -> None:
        self.title = title
        self.total = total
        self.completed = self.resumed_at = completed  # a resumed epoch starts part-way
        self.started = time.monotonic()
        self.finished: float | None = None
        self.values = values

    def update(self, completed: int | None = None, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        if completed is not None:
            self.completed = completed
        if self.finished is None and self.total is not None and self.completed >= self.total:
            self.finished = time.monotonic()  # rate and ETA stop moving once the bar is full

    def rate(self, now: float) -> float | None:
        """Steps per second since the bar appeared (steps it started with excluded)."""
        elapsed = (self.finished or now) - self.started
        done = self.completed - self.resumed_at
        return done / elapsed if elapsed > 0 and done > 0 else None


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


Pieces = list[tuple[str, "str | None"]]


def frame(rows: list[Row], now: float, width: int | None = None, values: bool = True) -> list[Pieces]:
    """The lines to draw, one per row, each a list of `(text, rich style name or None)` pieces.

    With `width` (the terminal's), the bars shrink (down to 10 cells) so that the values
    after them fit; what still does not fit is cut by the caller (or laid out by `layout`).
    `values=False` leaves the logged values out.
    """
    title = max((len(row.title) for row in rows), default=0)
    tails = [_tail(row, now, values) for row in rows]
    bar = BAR_WIDTH
    if width is not None and tails:
        longest = max(_length(tail) for tail in tails)
        bar = max(10, min(BAR_WIDTH, width - title - 1 - longest))
    return [([(row.title.ljust(title) + " ", None)] if title else []) + _bar(row, now, bar) + tail
            for row, tail in zip(rows, tails)]


def layout(rows: list[Row], now: float, width: int) -> list[Pieces]:
    """`frame` fitted to `width` columns. When the values do not fit after the bars, each row's
    values go on lines of their own below it, aligned with the bar and broken between two
    values, so that every value stays readable in a narrow (80-column) terminal::

        Epoch 2/2    ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 24/24 10.3 steps/s ETA 0:00:00
                     loss: 0.9514 - accuracy: 0.3333 - val_loss: 0.8525
                     val_accuracy: 0.3359
    """
    lines = frame(rows, now, width)
    if all(_length(line) <= width for line in lines):
        return lines
    indent = max(len(row.title) for row in rows) + 1
    if width - indent < 24:  # too little room beside the titles: indent by two only
        indent = 2
    out: list[Pieces] = []
    for row, line in zip(rows, frame(rows, now, width, values=False)):
        out.append(line)
        out.extend([(" " * indent + text, None)] for text in wrap_values(row.values, width - indent))
    return out


def wrap_values(values: str, room: int) -> list[str]:
    """`"loss: 0.1 - accuracy: 0.9 - ..."` as lines of at most `room` characters, broken only
    between two values (a single value longer than `room` keeps a line of its own)."""
    lines: list[str] = []
    for value in values.split(" - ") if values else ():
        if lines and len(lines[-1]) + 3 + len(value) <= room:
            lines[-1] += " - " + value
        else:
            lines.append(value)
    return lines


def _length(pieces: Pieces) -> int:
    return sum(len(piece) for piece, _ in pieces)


def _tail(row: Row, now: float, values: bool = True) -> Pieces:
    """What follows the bar: steps, rate, ETA, values."""
    pieces: list[tuple[str, str | None]] = []
    total = "?" if row.total is None else str(row.total)
    pieces.append((f" {row.completed}/{total} ", "progress.download"))
    rate = row.rate(now)
    if rate is None:
        pieces.append(("- steps/s", "progress.data.speed"))
    elif rate >= 1:
        pieces.append((f"{rate:.1f} steps/s", "progress.data.speed"))
    else:
        pieces.append((f"{1 / rate:.1f}s/step", "progress.data.speed"))
    if row.total is not None:
        left = max(row.total - row.completed, 0)
        pieces.append((" ETA ", None))
        pieces.append((_clock(left / rate) if rate else "-:--:--", "progress.remaining"))
    if values and row.values:
        pieces.append((" " + row.values, None))
    return pieces


def _bar(row: Row, now: float, width: int = BAR_WIDTH) -> list[tuple[str, str]]:
    if row.total is None:  # unknown length: a segment that moves as time passes
        start = int(now * 10) % (width + _PULSE) - _PULSE
        lead, pulse = max(start, 0), min(start + _PULSE, width) - max(start, 0)
        return [("━" * lead, "bar.back"), ("━" * pulse, "bar.pulse"), ("━" * (width - lead - pulse), "bar.back")]
    fraction = min(row.completed / row.total, 1.0) if row.total > 0 else 1.0
    full, half = divmod(int(width * 2 * fraction), 2)
    style = "bar.finished" if fraction >= 1.0 else "bar.complete"
    return [("━" * full + "╸" * half, style), ("━" * (width - full - half), "bar.back")]


class _Bars:
    """Rows and the frame they make; subclasses draw it."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.rows: list[Row] = []

    def add_row(self, title: str, total: int | None, completed: int = 0, values: str = "") -> Row:
        row = Row(title, total, completed, values)
        self.rows.append(row)
        return row

    def remove_row(self, row: Row) -> None:
        if row in self.rows:
            self.rows.remove(row)

    def print(self, line: str) -> None:
        """A line for the user, shown where the display puts its lines (subclasses draw it)."""
        raise NotImplementedError

    def finish(self, line: str) -> None:
        """The bars give way to `line` (an epoch's summary): they are removed and the line
        stays where they were."""
        self.rows.clear()
        self.print(line)


#: Escape codes of the styles, by colour system (rich's default theme).
_CODES: dict[str | None, dict[str, tuple[str, str]]] = {}


class TerminalBars(_Bars):
    """Bars at the bottom of a terminal, redrawn only by `refresh()` (no thread, no timer).

    While the bars are up, `sys.stdout` (and `sys.stderr` when it is a terminal too) go
    through a proxy that writes each complete line above them. `stop()` erases them and gives the streams and cursor back.

    Example::

        from rich.console import Console
        bars = TerminalBars(Console())
        bars.start()
        row = bars.add_row("Epoch 1/3", total=100)
        row.update(completed=40); bars.refresh()
        bars.stop()
    """

    def __init__(self, console: Any) -> None:
        super().__init__(console)
        system = console.color_system
        if system not in _CODES:
            _CODES[system] = {name: self._code(name) for name in _STYLES}
        self._codes = _CODES[system]
        self._width, self._width_read = 80, -1.0
        self._out: Any = None
        self._shown = 0  # lines of the frame now on screen
        self._saved: tuple[Any, Any] | None = None
        self._lock = threading.Lock()

    def _code(self, name: str) -> tuple[str, str]:
        """The escape codes that open and close a rich theme style on this console."""
        with self.console.capture() as capture:
            self.console.print("\0", style=name, end="", markup=False, highlight=False)
        before, _, after = capture.get().partition("\0")
        return before, after

    def start(self) -> None:
        self._out = self.console.file
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _Above(self, sys.stdout)
        if _isatty(sys.stderr):  # stderr sent to a file or a pipe stays there
            sys.stderr = _Above(self, sys.stderr)
        self._write(HIDE_CURSOR)

    def stop(self) -> None:
        with self._lock:
            if self._out is None:
                return
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, _Above) and stream._pending:  # a last line without its newline
                    self._write(self._erase() + stream._pending + "\n")
                    stream._pending = ""
            self._write(self._erase() + SHOW_CURSOR)
            if self._saved is not None:
                sys.stdout, sys.stderr = self._saved
                self._saved = None
            self._out = None

    def print(self, line: str) -> None:
        """A line above the bars (they are drawn again below it)."""
        self.write_above(line + "\n")

    def write_above(self, text: str) -> None:
        with self._lock:  # a thread may print while the loop redraws
            if self._out is not None:
                self._write(self._erase() + text + self._draw())

    def refresh(self) -> None:
        with self._lock:
            if self._out is not None:
                self._write(self._erase() + self._draw())

    def _erase(self) -> str:
        shown, self._shown = self._shown, 0
        if not shown:
            return ""
        return "\r" + ERASE_LINE + (UP + ERASE_LINE) * (shown - 1)

    def _draw(self) -> str:
        if not self.rows:
            return ""
        now = time.monotonic()
        if now - self._width_read > 1.0:  # a resized terminal is seen within a second
            self._width, self._width_read = max(self.console.width - 1, 10), now  # the last column would wrap
        width = self._width
        codes = self._codes
        lines = []
        for pieces in layout(self.rows, now, width):
            out, used = [], 0
            for piece, style in pieces:
                if not piece:
                    continue
                if used + len(piece) > width:
                    piece = piece[: max(width - used - 1, 0)] + "…"
                if style is None:
                    out.append(piece)
                else:
                    before, after = codes[style]
                    out.append(before + piece + after)
                used += len(piece)
                if used >= width:
                    break
            lines.append("".join(out))
        self._shown = len(lines)
        return "\n".join(lines)

    def _write(self, text: str) -> None:
        if text:
            self._out.write(text)
            self._out.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class _Above:
    """A stream proxy: complete lines written while the bars are up go above them."""

    def __init__(self, bars: TerminalBars, stream: Any) -> None:
        self._bars, self.rich_proxied_file = bars, stream
        self._pending = ""

    def write(self, text: str) -> int:
        if self._bars._out is None:  # kept past the display's end: plain writes again
            return self.rich_proxied_file.write(text)
        head, newline, tail = (self._pending + text).rpartition("\n")
        self._pending = tail
        if newline:
            self._bars.write_above(head + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._bars.write_above(self._pending + "\n")
            self._pending = ""

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...
        return getattr(self.rich_proxied_file, name)


class NotebookBars(_Bars):
    """Bars in a notebook cell (Jupyter, VS Code, Colab): an IPython display updated in place.

    Each epoch's bars are one display output (HTML in the terminal's colours, plain text as
    its fallback) that `finish` turns into the epoch's line, so the cell keeps one line per
    epoch and the live bar sits below the lines before it, as in a terminal. It needs IPython
    only (no ipywidgets, no widget state saved in the notebook), and it leaves `sys.stdout`
    and `sys.stderr` alone: what is printed meanwhile is ordinary output below the bars.

    Example (in a notebook)::

        bars = NotebookBars(Console())
        row = bars.add_row("Epoch 1/3", total=100)
        row.update(completed=40); bars.refresh()     # the display appears, then updates
        bars.finish("Epoch 1/3 - 1.2s - 12ms/step - loss: 0.4000")
        bars.stop()
    """

    def __init__(self, console: Any) -> None:
        super().__init__(console)
        self._handle: Any = None  # the IPython DisplayHandle of the bars now shown
        # by style name; a piece without a style (None) has no colour
        self._colours: dict[str | None, str | None] = {name: _colour(console, name) for name in _STYLES}

    def start(self) -> None:
        """Nothing shows until a row is drawn (so a fit that draws none leaves no output)."""

    def stop(self) -> None:
        """Stop updating. Bars still up (an interrupted epoch) stay as their last frame."""
        if self._handle is not None and self.rows:
            self.refresh()
        self._handle = None
        self.rows.clear()

    def print(self, line: str) -> None:
        print(line, flush=True)

    def finish(self, line: str) -> None:
        self.rows.clear()
        if self._handle is None:
            self.print(line)
        else:
            self._handle.update({"text/plain": line}, raw=True)
            self._handle = None  # the next epoch's bars are a new display, below this line

    def refresh(self) -> None:
        if not self.rows:
            return
        bundle = self.bundle()
        if self._handle is None:
            from IPython.display import display

            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)

    def bundle(self) -> dict[str, str]:
        """The current frame as a display's MIME bundle: `text/html` (coloured) and `text/plain`."""
        lines = frame(self.rows, time.monotonic())
        plain = "\n".join("".join(piece for piece, _ in line) for line in lines)
        spans = []
        for line in lines:
            spans.append("".join(_span(piece, self._colours.get(style)) for piece, style in line))
        return {"text/plain": plain, "text/html": _PRE + "\n".join(spans) + "</pre>"}


#: Monospace as the notebook shows code output; a long list of values wraps instead of scrolling.
_PRE = '<pre style="white-space: pre-wrap">'


def _colour(console: Any, name: str) -> str | None:
    """The CSS colour of a rich theme style (`#f92672`), None when it has none."""
    colour = console.get_style(name).color
    return colour.get_truecolor().hex if colour is not None else None


def _span(text: str, colour: str | None) -> str:
    text = html.escape(text)
    return f'<span style="color: {colour}">{text}</span>' if colour else text


def bars_for(console: Any) -> TerminalBars | NotebookBars:
    """The display that suits `console`."""
    return NotebookBars(console) if console.is_jupyter else TerminalBars(console)
