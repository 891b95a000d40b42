"""`History.plot`: one subplot per metric, training and validation curves, a PNG on request."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import mlp

from fitkit import History, Model

matplotlib = pytest.importorskip("matplotlib", reason='History.plot needs matplotlib: pip install "fitkit[plot]"')

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def history():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(120) % 3
    x = torch.randn(3, 8, generator=g)[y] * 3 + torch.randn(120, 8, generator=g)
    return Model(mlp()).compile("adam", "cross_entropy", ["accuracy"]).fit(
        x, y, epochs=4, batch_size=16, validation_split=0.25, verbose=0)


def _curves(figure) -> dict:
    """{subplot title: {line label: (xs, ys)}}."""
    return {ax.get_title(): {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}
            for ax in figure.axes}


def test_plot_saves_a_png_with_the_history_curves(history, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    path = tmp_path / "plots" / "curves.png"  # the folder is created
    figure = history.plot(path)
    assert isinstance(figure, matplotlib.figure.Figure)
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert plt.get_fignums() == before  # drawn off pyplot: no window, nothing left open
    curves = _curves(figure)
    assert list(curves) == ["loss", "accuracy"]
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for title, lines in curves.items():
        assert list(lines) == [title, f"val_{title}"]
        for label, (xs, ys) in lines.items():
            assert xs == [1, 2, 3, 4]  # epochs, counted from 1 as in the progress lines
            assert ys == history.history[label]
    assert all(ax.get_xlabel() == "epoch" for ax in figure.axes)


def test_plot_selected_metrics(history):
    import matplotlib.pyplot as plt

    figure = history.plot(metrics=["val_accuracy"])  # a val_ name picks the same subplot
    try:
        assert figure.number in plt.get_fignums()  # without a path: a pyplot figure (notebooks, plt.show)
        curves = _curves(figure)
        assert list(curves) == ["accuracy"]
        assert curves["accuracy"]["val_accuracy"][1] == pytest.approx(history.history["val_accuracy"])
    finally:
        plt.close(figure)
    with pytest.raises(ValueError, match=r"'f1' was not logged.*\['loss', 'accuracy'\]"):
        history.plot(metrics=["f1"])


def test_plot_of_an_empty_history_says_why():
    with pytest.raises(ValueError, match="nothing to plot"):
        History().plot()


def test_missing_matplotlib_names_the_extra(history, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r'pip install "fitkit\[plot\]"'):
        history.plot()


def test_history_does_not_import_matplotlib_until_plot():
    code = ("import sys\nfrom fitkit import History\nfrom fitkit.callbacks import History as H\n"
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_demo_saves_the_digits_curves(tmp_path, monkeypatch):
    """examples/digits.py's `save_curves`, as `make demo` runs it, on a short history."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "examples"))
    monkeypatch.chdir(tmp_path)
    digits = pytest.importorskip("digits")
    h = History()
    h.epoch, h.history = [0, 1], {"loss": [1.0, 0.5], "accuracy": [0.5, 0.9], "val_loss": [1.1, 0.7],
                                   "val_accuracy": [0.4, 0.8]}
    digits.save_curves(h)
    written = tmp_path / "fitkit_output" / "digits_history.png"
    assert written.read_bytes()[:8] == PNG_MAGIC
