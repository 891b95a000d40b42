"""How many fitkit modules a reader follows for one story, measured by running the code: a profile
(`sys.setprofile`) records the module of every fitkit function called between two moments of a real
`fit`. The counts are a report (printed, and kept in `REPORT` for the session's summary), not a cap:
a test fails only when a story jumps past its recorded count by more than `JUMP` modules, so a module
split by job costs nothing while a story that suddenly runs through many more modules is caught.

- one `save_strategy="epoch"` save, from the epoch's end (`on_epoch_end`, before `DefaultFlowCallback` asks
  for the save) to `on_save` (on a run that does not log: the epoch-end log is its own story; so are each
  stateful callback's `state()`, which the save asks for, and another callback's own `on_epoch_end`
  record: `History`'s here);
- a Keras-style callback's `on_epoch_end`, reached from the loop (the fitkit frames on the stack when it
  runs: the loop, the handler, the adapter);
- one training step, from `on_step_begin` to `on_step_end` (the optimizer's own `step` is its story, as
  torch's is).

`python tests/test_story_modules.py` prints the report.
"""

from __future__ import annotations

import sys

import torch
from helpers import mlp, seeded_classes

from fitkit import Model, TrainerCallback
from fitkit.callbacks import Callback, Order

#: The counts recorded when the report was made (the stories as the code tells them now).
RECORDED = {"epoch-end save": 8, "keras on_epoch_end": 3, "training step": 7}
#: How far past its recorded count a story may go before the test fails: a jump, not a split.
JUMP = 2
REPORT: dict[str, list[str]] = {}


def _report(story: str, modules: list[str]) -> None:
    REPORT[story] = modules
    print(f"{story}: {len(modules)} modules (recorded {RECORDED[story]}): {' '.join(modules)}")
    assert len(modules) <= RECORDED[story] + JUMP, (
        f"the {story} story jumped from {RECORDED[story]} to {len(modules)} modules: {' '.join(modules)}")


def _inside_state(frame) -> str | None:
    """The callback module this call runs inside (its frame or a caller's) when that is another
    story than the save's: a stateful callback's `state()` (what it saves), or a callback's own
    `on_epoch_end` record (`History`'s under step logging); None otherwise."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("fitkit.callbacks") and (frame.f_code.co_name == "state" or (
                frame.f_code.co_name == "on_epoch_end" and name != "fitkit.callbacks.flow")):
            return name
        frame = frame.f_back
    return None


def _in_optimizer(frame) -> bool:
    """True inside an optimizer's own methods (or the helpers they call)."""
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), torch.optim.Optimizer):
            return True
        frame = frame.f_back
    return False


class _Profile:
    """The fitkit modules whose functions are called while `on` is set."""

    def __init__(self) -> None:
        self.on = False
        self.modules: set[str] = set()
        self.exported: set[str] = set()

    def __call__(self, frame, event, arg) -> None:
        if self.on and event == "call":
            name = frame.f_globals.get("__name__", "")
            exporting = _inside_state(frame)
            if _in_optimizer(frame):
                pass  # the optimizer's own update (torch's, or Keras' algorithm on torch's kernels)
            elif exporting:
                self.exported.add(exporting)  # what a stateful callback saves is its own story
            elif name.startswith("fitkit"):
                self.modules.add(name)

    def start(self) -> None:
        self.modules, self.on = set(), True

    def stop(self) -> list[str]:
        self.on = False
        return sorted(self.modules)


def _fit(tmp_path, *callbacks, **options):
    x, y = seeded_classes(64, 8, 3, global_rng=True)
    model = Model(mlp()).compile("adam", "cross_entropy")
    profile = callbacks[0].profile
    sys.setprofile(profile)
    try:
        model.fit(x, y, epochs=2, batch_size=16, verbose=0, output_dir=str(tmp_path), callbacks=list(callbacks),
                  **options)
    finally:
        sys.setprofile(None)


def test_an_epoch_end_save_story_is_reported(tmp_path):
    found = {}

    class Probe(TrainerCallback):
        profile = _Profile()
        order = Order.FLOW - 1  # before DefaultFlowCallback, which asks for the save

        def on_epoch_end(self, args, state, control, **kwargs):
            if state.global_step == 8:  # the end of the second epoch
                self.profile.start()

        def on_save(self, args, state, control, **kwargs):
            if self.profile.on:
                found["modules"] = self.profile.stop()

    _fit(tmp_path, Probe(), save_strategy="epoch", logging_strategy="no")
    modules = [m for m in found["modules"] if m != __name__]
    assert "fitkit.engine.checkpoint.checkpointer" in modules  # the checker sees the save
    assert Probe.profile.exported == {"fitkit.callbacks.history"}  # its record and its saved rows
    _report("epoch-end save", modules)


def test_a_keras_style_on_epoch_end_story_is_reported(tmp_path):
    found = {}

    class KerasStyle(Callback):
        profile = _Profile()

        def on_epoch_end(self, epoch, logs=None):
            frame, stack = sys._getframe(1), []
            while frame is not None:
                name = frame.f_globals.get("__name__", "")
                if name.startswith("fitkit") and name not in stack:
                    stack.append(name)
                if name == "fitkit.engine.loop":
                    break
                frame = frame.f_back
            found["stack"] = stack

    _fit(tmp_path, KerasStyle())
    assert found["stack"][-1] == "fitkit.engine.loop"
    _report("keras on_epoch_end", found["stack"])


def test_one_training_step_story_is_reported(tmp_path):
    found = {}

    class Probe(TrainerCallback):
        profile = _Profile()

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 5:  # a step inside the second epoch: no first-batch checks
                self.profile.start()

        def on_step_end(self, args, state, control, **kwargs):
            if self.profile.on:
                found["modules"] = self.profile.stop()

    _fit(tmp_path, Probe())
    modules = [m for m in found["modules"] if m != __name__]
    assert "fitkit.engine.step" in modules
    _report("training step", modules)


if __name__ == "__main__":  # print the report
    import tempfile

    import pytest

    with tempfile.TemporaryDirectory():
        raise SystemExit(pytest.main([__file__, "-q", "-s", "-p", "no:cacheprovider"]))
