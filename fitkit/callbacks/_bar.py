"""`BarDisplay`: the live bars `ProgressBar` draws, one rich `Text` per frame.

rich's `Progress` lays its columns out as a table on every redraw (about 0.5 ms a frame
here); the bars fitkit shows have a fixed layout, so a frame is composed as one styled `Text`
instead (about 0.1 ms) and handed to a rich `Live` that only redraws when asked.
rich is imported only when a display is created.
"""

from __future__ import annotations

import time
from typing import Any

BAR_WIDTH = 30
_PULSE = 6  # cells of the moving segment on a bar whose total is unknown


class Row:
    """One bar: `title  ━━━━━╸━━━━  done/total  rate  ETA  values`."""

    __slots__ = ("title", "total", "completed", "resumed_at", "started", "finished", "values")

    def __init__(self, title: str, total: int | None, completed: int = 0, values: str = ""):
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


class BarDisplay:
    """Rows of bars on a rich console, redrawn only by `refresh()` (no thread, no timer).

    Example::

        from rich.console import Console
        display = BarDisplay(Console())
        display.start()
        row = display.add_row("Epoch 1/3", total=100)
        row.update(completed=40); display.refresh()
        display.stop()
    """

    def __init__(self, console: Any):
        from rich.live import Live
        from rich.text import Text

        self._text = Text
        self.console = console
        self.rows: list[Row] = []
        self._live = Live(console=console, auto_refresh=False, transient=True)

    def start(self) -> None:
        self._live.start()

    def stop(self) -> None:
        self._live.stop()

    def add_row(self, title: str, total: int | None, completed: int = 0, values: str = "") -> Row:
        row = Row(title, total, completed, values)
        self.rows.append(row)
        return row

    def remove_row(self, row: Row) -> None:
        if row in self.rows:
            self.rows.remove(row)

    def print(self, line: str) -> None:
        """A line above the bars (they are drawn again below it)."""
        self.console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)

    def refresh(self) -> None:
        self._live.update(self.render(), refresh=True)

    def render(self) -> Any:
        """The current frame: one line per row, cut with an ellipsis at the console's width."""
        now = time.monotonic()
        text = self._text(no_wrap=True, overflow="ellipsis", end="")
        width = max((len(row.title) for row in self.rows), default=0)
        for i, row in enumerate(self.rows):
            if i:
                text.append("\n")
            text.append(row.title.ljust(width) + " ")
            self._bar(text, row, now)
            total = "?" if row.total is None else str(row.total)
            text.append(f" {row.completed}/{total} ", "progress.download")
            rate = row.rate(now)
            if rate is None:
                text.append("- steps/s", "progress.data.speed")
            elif rate >= 1:
                text.append(f"{rate:.1f} steps/s", "progress.data.speed")
            else:
                text.append(f"{1 / rate:.1f}s/step", "progress.data.speed")
            if row.total is not None:
                left = max(row.total - row.completed, 0)
                eta = _clock(left / rate) if rate else "-:--:--"
                text.append(" ETA ")
                text.append(eta, "progress.remaining")
            if row.values:
                text.append(" " + row.values)
        return text

    @staticmethod
    def _bar(text: Any, row: Row, now: float) -> None:
        if row.total is None:  # unknown length: a segment that moves as time passes
            start = int(now * 10) % (BAR_WIDTH + _PULSE) - _PULSE
            lead, pulse = max(start, 0), min(start + _PULSE, BAR_WIDTH) - max(start, 0)
            text.append("━" * lead, "bar.back")
            text.append("━" * pulse, "bar.pulse")
            text.append("━" * (BAR_WIDTH - lead - pulse), "bar.back")
            return
        fraction = min(row.completed / row.total, 1.0) if row.total > 0 else 1.0
        halves = int(BAR_WIDTH * 2 * fraction)
        full, half = divmod(halves, 2)
        style = "bar.finished" if fraction >= 1.0 else "bar.complete"
        text.append("━" * full, style)
        if half:
            text.append("╸", style)
        rest = BAR_WIDTH - full - half
        if rest:
            text.append("━" * rest, "bar.back")
