"""`compile(jit_compile=...)`: the module runs under `torch.compile`.

Most tests pass a recording backend through the dict form (`{"backend": fn}`): torch.compile
calls it with each graph it captures, which proves the option reaches torch.compile without
paying inductor's compilation (the graph then runs eagerly, so losses match eager exactly). One
slow test trains with the real inductor backend.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch._dynamo.eval_frame import OptimizedModule

sys.path.insert(0, os.path.dirname(__file__))
from helpers import blobs, mlp

from fitkit import Model, TrainingArguments
from fitkit.config.jit_compile import compile_keywords, jit_kwargs

# torch's own import of a deprecated helper while it compiles (nothing fitkit calls)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def recording_backend(calls: list):
    """A torch.compile backend (a function: Lightning deep-copies the keywords, and a function
    copies as itself) that records the keywords each compilation passes it, then runs the graph."""
    def backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
        calls.append(kwargs)
        return gm.forward

    return backend


def forward_module(model: Model) -> torch.nn.Module:
    """The module the loop calls: what Fabric set up (inside its wrapper; on one device
    without Lightning, `LocalFabric`, the set-up module itself)."""
    wrapped = model.runtime.wrapped
    return wrapped.__dict__["_modules"].get("_forward_module", wrapped)


def fit(model: Model, epochs: int = 2, **options):
    x, y = blobs(48)
    return model.fit(x, y, epochs=epochs, batch_size=16, verbose=0, **options)


# -- values -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, fix", [
    ("fast", "'max-autotune'"), ("max_autotune", "did you mean 'max-autotune'?"), (1, "a mode string"),
    (None, "True"), ({"fullgrph": True}, "did you mean 'fullgraph'?"), ({"mode": "turbo"}, "'reduce-overhead'"),
    (["max-autotune"], "dict of torch.compile keywords"),
])
def test_bad_values_raise_naming_the_option_and_the_valid_ones(value, fix):
    with pytest.raises(ValueError, match="jit_compile") as caught:
        Model(mlp()).compile("adam", "cross_entropy", jit_compile=value)
    assert fix in str(caught.value)


def test_an_unknown_dict_key_lists_torch_compiles_keywords():
    with pytest.raises(ValueError) as caught:
        TrainingArguments(jit_compile={"mode": "default", "cudagraphs": True})
    for name in ("fullgraph", "dynamic", "backend", "mode", "options"):
        assert name in compile_keywords() and name in str(caught.value)


def test_values_resolve_to_torch_compile_keywords():
    assert jit_kwargs("auto") is None and jit_kwargs(False) is None
    assert jit_kwargs(True) == {} and jit_kwargs("reduce-overhead") == {"mode": "reduce-overhead"}
    given = {"mode": "max-autotune", "fullgraph": True, "dynamic": False}
    args = TrainingArguments(jit_compile=given)
    assert jit_kwargs(args.jit_compile) == given and args.jit_compile is not given  # a copy
    assert TrainingArguments().jit_compile == "auto"


# -- off by default ---------------------------------------------------------------------------------
def test_auto_does_not_compile_and_the_summary_is_unchanged():
    model = Model(mlp()).compile("adam", "cross_entropy")
    fit(model, epochs=1)
    assert not isinstance(forward_module(model), OptimizedModule)
    assert "jit_compile" not in model.summary()


# -- the option reaches torch.compile ---------------------------------------------------------------
def test_the_dict_form_reaches_torch_compile_and_every_call_runs_compiled():
    calls: list = []
    eager = Model(mlp()).compile("adam", "cross_entropy")
    model = Model(mlp()).compile("adam", "cross_entropy", jit_compile={"backend": recording_backend(calls),
                                                                       "fullgraph": True})
    history, expected = fit(model), fit(eager)
    assert isinstance(forward_module(model), OptimizedModule) and forward_module(model)._orig_mod is model.module
    assert calls, "torch.compile never called the backend"
    assert history.history["loss"] == expected.history["loss"]  # the recorded graphs run eagerly: same numbers
    # the user's module, as given: no `_orig_mod.` anywhere
    assert list(model.module.state_dict()) == list(eager.module.state_dict())
    assert all("_orig_mod" not in k for k in model.runtime.wrapped.state_dict())
    assert [w.shape for w in model.get_weights()] == [w.shape for w in eager.get_weights()]
    assert "jit_compile: torch.compile(backend=" in model.summary() and "fullgraph=True" in model.summary()
    # evaluate, predict and train_on_batch use the same compiled module
    x, y = blobs(48)
    seen = len(calls)
    assert model.evaluate(x, y, verbose=0, return_dict=True)["loss"] == pytest.approx(eager.evaluate(x, y, verbose=0, return_dict=True)["loss"], rel=1e-6)
    assert len(calls) > seen  # eval mode is another graph: compiled on first use
    torch.testing.assert_close(model.predict(x, verbose=0), eager.predict(x, verbose=0))
    wrapped = model.runtime.wrapped
    loss = model.train_on_batch(x[:16], y[:16])
    assert model.runtime.wrapped is wrapped and loss == pytest.approx(eager.train_on_batch(x[:16], y[:16]), rel=1e-6)


def test_a_mode_string_reaches_torch_compile(monkeypatch):
    given: list = []
    calls: list = []
    original = torch.compile

    def spy(module, **kwargs):  # what fitkit and Fabric ask of torch.compile, run on the recording backend
        given.append(dict(kwargs))
        return original(module, **{**kwargs, "backend": recording_backend(calls)})

    monkeypatch.setattr(torch, "compile", spy)
    model = Model(mlp()).compile("adam", "cross_entropy", jit_compile="max-autotune")
    fit(model, epochs=1)
    assert given and all(k.get("mode") == "max-autotune" for k in given)
    assert calls and calls[0].get("mode") == "max-autotune"  # torch passed the mode on to the backend
    assert "jit_compile: torch.compile(mode='max-autotune')" in model.summary()


# -- set up once, again when the option changes -----------------------------------------------------
def test_the_compiled_module_is_kept_across_fits_and_rebuilt_when_the_option_changes():
    calls: list = []
    model = Model(mlp()).compile("adam", "cross_entropy", jit_compile={"backend": recording_backend(calls)})
    fit(model, epochs=1)
    wrapped, optimizer, compiled = model.runtime.wrapped, model.optimizer, len(calls)
    fit(model, epochs=1)
    assert model.runtime.wrapped is wrapped and len(calls) == compiled  # nothing set up or compiled again
    fit(model, epochs=1, jit_compile=False)  # a fit option: this fit runs eagerly
    assert not isinstance(forward_module(model), OptimizedModule)
    assert model.optimizer is optimizer  # the same parameters: the optimizer and its state stay
    fit(model, epochs=1)  # compile's setting again
    assert isinstance(forward_module(model), OptimizedModule) and model.runtime.wrapped is not wrapped
    model.compile("adam", "cross_entropy")  # compiling again with "auto"
    fit(model, epochs=1)
    assert not isinstance(forward_module(model), OptimizedModule)


# -- saving and resuming across compiled and eager ---------------------------------------------------
@pytest.mark.parametrize("first, then", [("compiled", "eager"), ("eager", "compiled")])
def test_checkpoints_resume_across_compiled_and_eager(tmp_path, first, then):
    def model(kind: str, seed: int = 0) -> Model:
        jit = {"backend": recording_backend([])} if kind == "compiled" else False
        return Model(mlp(seed=seed)).compile("adam", "cross_entropy", jit_compile=jit)

    full = model("eager")
    fit(full, epochs=3, output_dir=str(tmp_path / "full"), save_strategy="epoch")
    fit(model(first), epochs=2, output_dir=str(tmp_path / "cut"), save_strategy="epoch")
    assert sorted(os.listdir(tmp_path / "cut")) == ["checkpoint-3", "checkpoint-6"]
    resumed = model(then, seed=3)  # other starting weights: the checkpoint must replace them
    fit(resumed, epochs=3, output_dir=str(tmp_path / "cut"), save_strategy="epoch", resume_from_checkpoint=True)
    assert resumed.state.global_step == 9
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        torch.testing.assert_close(a, b)


def test_save_and_load_across_compiled_and_eager(tmp_path):
    compiled = Model(mlp()).compile("adam", "cross_entropy", jit_compile={"backend": recording_backend([])})
    fit(compiled, epochs=1)
    compiled.save(str(tmp_path / "compiled.pt"))
    eager = Model(mlp(seed=5))
    eager.load_weights(str(tmp_path / "compiled.pt"))
    x, _ = blobs(48)
    torch.testing.assert_close(eager.predict(x, verbose=0), compiled.predict(x, verbose=0))
    eager.save_weights(str(tmp_path / "eager.pt"))
    again = Model(mlp(seed=6)).compile("adam", "cross_entropy", jit_compile={"backend": recording_backend([])})
    again.load_weights(str(tmp_path / "eager.pt"))
    torch.testing.assert_close(again.predict(x, verbose=0), compiled.predict(x, verbose=0))
    loaded = Model.load(str(tmp_path / "compiled.pt"), mlp(seed=7))
    assert loaded.config is None  # a dict holding a function is saved by name: compile again to pass it
    torch.testing.assert_close(loaded.predict(x, verbose=0), compiled.predict(x, verbose=0))
    named = Model(mlp()).compile("adam", "cross_entropy", jit_compile="max-autotune")
    named.save(str(tmp_path / "named.pt"))
    assert Model.load(str(tmp_path / "named.pt"), mlp()).config.args.jit_compile == "max-autotune"


# -- the real compiler --------------------------------------------------------------------------------
@pytest.mark.slow
def test_inductor_trains_to_the_same_loss_as_eager():
    """`jit_compile=True` with torch's default backend (inductor: C++ code generated and built
    here on CPU) trains to the losses of the eager run, and the loop runs the compiled module."""
    from torch._dynamo.utils import counters

    eager = Model(mlp()).compile("adam", "cross_entropy", metrics=["accuracy"])
    compiled = Model(mlp()).compile("adam", "cross_entropy", metrics=["accuracy"], jit_compile=True)
    expected = fit(eager, epochs=3).history
    counters.clear()
    history = fit(compiled, epochs=3).history
    assert isinstance(forward_module(compiled), OptimizedModule)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo captured graphs for inductor
    torch.testing.assert_close(torch.tensor(history["loss"]), torch.tensor(expected["loss"]), rtol=1e-4, atol=1e-6)
    assert history["accuracy"] == expected["accuracy"]
