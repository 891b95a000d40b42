"""Training curves with matplotlib (the optional `plot` extra, imported on use).

`History.plot()` calls `plot_history`; it can also be given any `{name: [value per epoch]}`
mapping, such as a `history.history` loaded back from JSON.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_INSTALL_HINT = 'plotting needs matplotlib: pip install "fitkit[plot]"'


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(_INSTALL_HINT) from error
    return matplotlib


def metric_names(history: Mapping[str, Sequence[float]]) -> list[str]:
    """The names to draw, one subplot each: `loss` first, then the others in logged order;
    `val_accuracy` belongs to `accuracy`."""
    names: list[str] = []
    for key in history:
        base = key.removeprefix("val_")
        if base and base not in names:
            names.append(base)
    if "loss" in names:
        names.remove("loss")
        names.insert(0, "loss")
    return names


def _chosen(history: Mapping[str, Sequence[float]], metrics: str | Iterable[str] | None) -> list[str]:
    available = metric_names(history)
    if metrics is None:
        return available
    if isinstance(metrics, str):
        metrics = [metrics]
    chosen: list[str] = []
    for name in metrics:
        base = name[4:] if name.startswith("val_") and name[4:] in available else name
        if base not in available:
            raise ValueError(f"`metrics`: {name!r} was not logged; the history holds {available}")
        if base not in chosen:
            chosen.append(base)
    return chosen


def plot_history(history: Mapping[str, Sequence[float]], epochs: Sequence[int] | None = None,
                 path: str | os.PathLike | None = None, metrics: str | Iterable[str] | None = None) -> Any:
    """Draw each metric per epoch, training and `val_` values on the same axes.

    Args:
        history: `{name: [one value per epoch]}`, as `History.history`.
        epochs: the 0-based epoch of each value (`History.epoch`); the x axis shows them
            1-based, as the progress lines do. Default: `0, 1, 2, ...`.
        path: where to save the picture, a PNG unless the name ends otherwise (`.svg`,
            `.pdf`); parent folders are created. A figure to save is drawn with the Agg backend
            and is not registered with pyplot: no window opens, nothing is left to close.
        metrics: the names to draw (`"loss"`, `"accuracy"`, ...; a `val_` name selects the same
            subplot). Default: every logged name.

    Returns:
        The matplotlib `Figure`, one subplot per metric name.
    """
    _matplotlib()
    names = _chosen(history, metrics)
    if not names:
        raise ValueError("nothing to plot: the history holds no logged values (did `fit` run?)")
    count = max((len(v) for v in history.values()), default=0)
    epochs = list(epochs) if epochs is not None else list(range(count))
    x = [e + 1 for e in epochs]

    columns = min(len(names), 3)
    rows = math.ceil(len(names) / columns)
    figure = _new_figure((4.8 * columns, 3.6 * rows), for_file=path is not None)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    from matplotlib.ticker import MaxNLocator

    for ax, name in zip(axes, names):
        for key in (name, f"val_{name}"):
            if key in history:
                values = [float(v) for v in history[key]]
                ax.plot(x[: len(values)], values, marker="o", markersize=3, label=key)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend()
    for ax in axes[len(names):]:
        ax.remove()
    figure.tight_layout()
    if path is not None:
        _save(figure, os.fspath(path))
    return figure


def _new_figure(size: tuple[float, float], for_file: bool) -> Any:
    """A pyplot figure for notebooks and `plt.show()`; for a file, one with no pyplot, no GUI
    backend and no window."""
    if not for_file:
        import matplotlib.pyplot as plt

        figure = plt.figure(figsize=size)
        _shown_once_in_notebooks(figure)
        return figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=size)
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Any, path: str) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    kind = os.path.splitext(path)[1][1:].lower() or "png"  # PNG unless the name says otherwise
    figure.savefig(path, format=kind, dpi=100)


def _shown_once_in_notebooks(figure: Any) -> None:
    """Under a notebook's inline backend, a pyplot figure that is a cell's result is shown twice:
    as the result, and again by the backend, which shows every pyplot figure at the cell's end.
    Here the result's display shows it and takes it out of pyplot (`plt.close`), so the cell's
    end does not show it again; a figure kept in a variable is still shown once, by the backend."""
    import matplotlib

    if "inline" in matplotlib.get_backend():
        figure._ipython_display_ = functools.partial(_display_once, figure)


def _display_once(figure: Any) -> None:
    import matplotlib.pyplot as plt
    from IPython.display import display

    hook = figure.__dict__.pop("_ipython_display_")  # shown the ordinary way, in the formats the notebook asks
    try:
        display(figure)
    finally:
        figure._ipython_display_ = hook
    plt.close(figure)
