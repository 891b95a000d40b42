"""What a fit shows in a notebook, checked by executing one in a real Jupyter kernel (nbclient).

The kernel runs this interpreter (a kernelspec written to a temporary folder, so no Jupyter
set-up of the machine's is used), without ipywidgets. One notebook, run once: a fit with the
live bar, a fit stopped as the stop button stops it (SIGINT, so `KeyboardInterrupt`), prints
after it, and `History.plot` shown as a cell's result and kept in a variable.
"""

import json
import os
import re
import sys

import pytest

nbformat = pytest.importorskip("nbformat", reason='notebook tests need the extra: pip install "fitkit[notebook]"')
nbclient = pytest.importorskip("nbclient", reason='notebook tests need the extra: pip install "fitkit[notebook]"')
pytest.importorskip("ipykernel", reason='notebook tests need the extra: pip install "fitkit[notebook]"')
pytest.importorskip("matplotlib", reason='History.plot needs matplotlib: pip install "fitkit[plot]"')

pytestmark = pytest.mark.slow  # a kernel process, and the first fit in it

TESTS = os.path.dirname(os.path.abspath(__file__))
#: Keras 3's final frame of an epoch's bar, then fitkit's figures; the `Epoch i/2` title is a line before it.
EPOCH = re.compile(r"^9/9 ━{20} \d+s \S+/step - loss: \d\.\d{4} - accuracy: \d\.\d{4} - val_loss: \d\.\d{4}"
                   r" - val_accuracy: \d\.\d{4} \| .* MiB$")
WIDGET = "application/vnd.jupyter.widget-view+json"

CELLS = {
    "setup": f"""
import os, signal, sys, time
sys.path.insert(0, {TESTS!r})
from helpers import blobs, mlp
from fitkit import Model, TrainerCallback

class Slow(TrainerCallback):  # a few ms a step, so the bar is drawn mid-epoch
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.01)

class StopButton(TrainerCallback):  # what Jupyter's stop button does: SIGINT to the kernel
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            os.kill(os.getpid(), signal.SIGINT)

x, y = blobs(192)
model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
""",
    "fit": "history = model.fit(x, y, epochs=2, batch_size=16, validation_split=0.25, callbacks=[Slow()])",
    "interrupted": "model.fit(x, y, epochs=2, batch_size=16, validation_split=0.25, callbacks=[Slow(), StopButton()])",
    "after": 'print("after", type(sys.stdout).__name__, type(sys.stderr).__name__)\nprint("second line")',
    "plot": "history.plot()",
    "kept": "figure = history.plot(metrics='loss')",
}


class RecordingClient(nbclient.NotebookClient):
    """Also keeps every message the kernel sent, per cell (display updates leave no trace in
    the saved outputs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.messages: dict[int, list[dict]] = {}

    def process_message(self, msg, cell, cell_index):
        self.messages.setdefault(cell_index, []).append(msg)
        return super().process_message(msg, cell, cell_index)


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """(notebook as saved, {cell name: its messages}, {cell name: its outputs})."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    folder = tmp_path_factory.mktemp("notebook")
    spec = folder / "kernels" / "fitkit-test"
    spec.mkdir(parents=True)
    env = {"IPYTHONDIR": str(folder / "ipython"), "JUPYTER_CONFIG_DIR": str(folder / "config"),
           "MPLCONFIGDIR": str(folder / "mpl"),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}  # a notebook's default, whatever ours is
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fitkit tests", "language": "python", "env": env}))
    manager = KernelManager(kernel_name="fitkit-test",
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(folder / "kernels")]))
    notebook = nbformat.v4.new_notebook()
    for name, source in CELLS.items():
        cell = nbformat.v4.new_code_cell(source.strip())
        if name == "interrupted":
            cell.metadata["tags"] = ["raises-exception"]
        notebook.cells.append(cell)
    client = RecordingClient(notebook, km=manager, timeout=240, resources={"metadata": {"path": str(folder)}})
    client.execute()
    path = folder / "run.ipynb"
    nbformat.write(notebook, str(path))
    saved = nbformat.read(str(path), as_version=4)
    names = list(CELLS)
    messages = {names[i]: client.messages.get(i, []) for i in range(len(names))}
    outputs = {name: saved.cells[i].outputs for i, name in enumerate(names)}
    return saved, messages, outputs


def _text(output) -> str:
    if output.output_type == "stream":
        return output.text
    return output.get("data", {}).get("text/plain", "")


def test_the_bar_is_one_display_per_epoch_updated_in_place_then_the_epoch_line(executed):
    _, messages, outputs = executed
    fit = outputs["fit"]
    # all that stays: one line per epoch, in order, each where that epoch's bar was
    assert [o.output_type for o in fit] == ["stream", "display_data", "stream", "display_data"], fit
    assert [_text(o) for o in fit[::2]] == ["Epoch 1/2\n", "Epoch 2/2\n"], fit
    assert all(EPOCH.match(_text(o)) for o in fit[1::2]), fit
    shown = [m for m in messages["fit"] if m["msg_type"] == "display_data"]
    updates = [m for m in messages["fit"] if m["msg_type"] == "update_display_data"]
    ids = [m["content"]["transient"]["display_id"] for m in shown]
    assert len(ids) == 2 and len(set(ids)) == 2  # a display per epoch
    frames = [m["content"]["data"] for m in updates if "text/html" in m["content"]["data"]]
    assert frames, "the bar was never redrawn in place"
    assert {m["content"]["transient"]["display_id"] for m in updates} == set(ids)
    assert any(re.search(r"^[━╸]+ \d+/9 ", f["text/plain"], re.M) for f in frames), frames[-1]
    assert any(re.search(r"validation +[━╸]+ \d/3 ", f["text/plain"]) for f in frames)  # its length is known
    assert all(f["text/html"].startswith("<pre") and "━" in f["text/html"] for f in frames)


def test_a_fit_leaves_no_empty_output_no_widget_and_no_warning(executed):
    saved, messages, outputs = executed
    assert "widgets" not in saved.metadata
    for name, cell_outputs in outputs.items():
        for output in cell_outputs:
            data = output.get("data", {})
            assert WIDGET not in data, (name, output)
            html = data.get("text/html", "")
            assert not re.fullmatch(r"\s*<pre[^>]*>\s*</pre>\s*", html), (name, output)
            if output.output_type in ("stream", "display_data"):
                assert _text(output).strip() or data.get("image/png"), (name, output)
    assert not any(o.output_type == "stream" and o.name == "stderr" for o in outputs["fit"])
    assert not any("ipywidgets" in json.dumps(m["content"]) for m in messages["fit"])


def test_prints_after_an_interrupted_fit_are_plain_text_again(executed):
    _, _, outputs = executed
    interrupted = outputs["interrupted"]
    assert interrupted[-1].output_type == "error" and interrupted[-1].ename == "KeyboardInterrupt"
    # the kernel's own streams, not proxies that made each print an HTML block
    after = outputs["after"]
    assert [(o.output_type, o.get("name")) for o in after] == [("stream", "stdout")], after
    assert after[0].text == "after OutStream OutStream\nsecond line\n"


def test_an_interrupted_epoch_keeps_its_last_frame(executed):
    _, _, outputs = executed
    (bar,) = [o for o in outputs["interrupted"] if o.output_type == "display_data"]
    # SIGINT came in step 3's on_step_end, before the display (which runs last) counted it
    assert re.search(r"^[━╸]+ 2/9 ", bar.data["text/plain"], re.M), bar


def test_history_plot_shows_each_figure_once(executed):
    _, _, outputs = executed
    for name in ("plot", "kept"):  # a cell's result, and a figure kept in a variable
        images = [o for o in outputs[name] if "image/png" in o.get("data", {})]
        assert len(images) == 1, (name, outputs[name])
