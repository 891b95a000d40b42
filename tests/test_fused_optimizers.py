"""Named optimizers run torch's fastest exact implementation; what the user builds is left as given.

The implementation a run uses is recorded in its checkpoints (the manifest, and the optimizer
state's parameter groups), and a resumed run steps with the implementation it was written with.
"""

import json
import os

import pytest
import torch

from fitkit import Model
from fitkit.adapters import keras_optimizers
from fitkit.adapters.optimizers import FASTEST, OPTIMIZERS, fastest_implementation, implementation
from fitkit.engine.checkpoint import layout, listing


def _net(seed=0, embedding=False):
    torch.manual_seed(seed)
    if embedding:
        return torch.nn.Sequential(torch.nn.Embedding(20, 8, sparse=True), torch.nn.Flatten(), torch.nn.Linear(16, 3))
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 3))


def _data(n=96):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _trained(optimizer, epochs=1, **options):
    x, y = _data()
    model = Model(_net()).compile(optimizer, "cross_entropy", learning_rate=1e-2)
    model.fit(x, y, batch_size=16, epochs=epochs, seed=3, verbose=0, **options)
    return model


@pytest.mark.parametrize("name, expected", [("adam", "fused"), ("adamw", "fused"), ("adagrad", "fused"),
                                            ("sgd", "for-loop"), ("rmsprop", "foreach"), ("adadelta", "for-loop"),
                                            ("adamax", "foreach"), ("nadam", "for-loop"), ("lion", "foreach")])
def test_each_name_builds_the_fastest_implementation_on_cpu(name, expected):
    model = _trained(name)
    built = model.runtime.optimizer.optimizer
    assert implementation(built) == expected
    if issubclass(OPTIMIZERS[name][0], keras_optimizers.ForeachOptimizer):  # fitkit's own: always foreach
        assert expected == "foreach"
    else:
        assert FASTEST.get((name, "cpu"), "for-loop") == expected  # the table the choice reads
    assert type(built).__name__.lower() == name
    assert f"Optimizer: {type(built).__name__} ({expected})" in model.summary()


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_name_builds_the_fastest_implementation_on_cuda(name):
    x, y = _data()
    model = Model(_net()).compile(name, "cross_entropy", accelerator="cuda", devices=1)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert implementation(model.runtime.optimizer) == FASTEST.get((name, "cuda"), "foreach")


def test_what_the_user_builds_is_left_as_given():
    assert implementation(_trained(torch.optim.Adam).runtime.optimizer) == "for-loop"  # a class
    assert implementation(_trained(lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True)).runtime.optimizer) == "foreach"
    net = _net()
    given = torch.optim.AdamW(net.parameters(), lr=1e-2, fused=False)
    model = Model(net).compile(given, "cross_entropy")
    model.fit(*_data(), batch_size=16, verbose=0)
    assert model.runtime.optimizer.optimizer is given and implementation(given) == "for-loop"
    assert "Optimizer: AdamW (for-loop)" in model.summary()


def test_summary_before_the_first_fit_says_what_the_name_will_build():
    assert "Optimizer: Adam (fused on cpu, cuda, torch's default elsewhere; built at the first fit)" in \
        Model(_net()).compile("adam", "cross_entropy").summary()
    assert "Optimizer: SGD (as given)" in Model(_net()).compile(torch.optim.SGD, "cross_entropy").summary()
    assert "Optimizer" not in Model(_net()).summary()  # not compiled: no optimizer to speak of


def test_fused_computes_the_default_update():
    """The same algorithm: weights agree with torch's default implementation to float rounding
    (given the hyperparameters the name builds: Keras' epsilon)."""
    fused, default = _trained("adam", epochs=3), _trained(lambda p: keras_optimizers.Adam(p, eps=1e-7), epochs=3)
    assert implementation(fused.runtime.optimizer) == "fused"
    for a, b in zip(fused.module.parameters(), default.module.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert fused.history.history["loss"] == pytest.approx(default.history.history["loss"], rel=1e-4)


def test_sparse_gradients_and_complex_parameters_keep_the_default_loop():
    x = torch.randint(0, 20, (64, 2))
    y = torch.randint(0, 3, (64,))
    net = _net(embedding=True)
    assert fastest_implementation("adam", list(net.parameters()), net) is None
    model = Model(net).compile("sgd", "cross_entropy")
    model.fit(x, y, batch_size=16, verbose=0)  # a fused step would raise on the sparse gradient
    assert implementation(model.runtime.optimizer) == "for-loop"
    sparse = Model(_net(embedding=True)).compile(keras_optimizers.KerasAdagrad, "cross_entropy")  # made dense
    dense_net = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Flatten(), torch.nn.Linear(16, 3))
    dense_net.load_state_dict(_net(embedding=True).state_dict())
    dense = Model(dense_net).compile(keras_optimizers.KerasAdagrad, "cross_entropy")
    sparse.fit(x, y, batch_size=16, verbose=0, seed=1)
    dense.fit(x, y, batch_size=16, verbose=0, seed=1)
    for a, b in zip(sparse.module.parameters(), dense.module.parameters()):
        torch.testing.assert_close(a, b)

    class Complex(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 3, dtype=torch.complex64))

        def forward(self, x):
            return (x.to(torch.complex64) @ self.w).abs()

    cmodel = Model(Complex()).compile("adam", "mse")
    cmodel.fit(torch.randn(32, 8), torch.rand(32, 3), batch_size=8, verbose=0)
    assert implementation(cmodel.runtime.optimizer) == "for-loop"


def test_hf_fused_name_builds_the_fused_optimizer():
    model = _trained("adam", optim="adamw_torch_fused")
    assert type(model.runtime.optimizer.optimizer).__name__ == "AdamW"
    assert implementation(model.runtime.optimizer) == "fused"


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-true"])
def test_fused_under_reduced_precision_on_cpu(precision):
    model = _trained("adam", epochs=2, precision=precision)
    assert implementation(model.runtime.optimizer) == "fused"
    assert all(torch.isfinite(torch.tensor(v)) for v in model.history.history["loss"])
    assert model.history.history["loss"][-1] < model.history.history["loss"][0]


def _checkpointed(out, optimizer, stop_at=None, resume=False, seed=0, **compile_options):
    x, y = _data()
    model = Model(_net(seed)).compile(optimizer, "cross_entropy", learning_rate=1e-2, **compile_options)
    options = dict(max_steps=stop_at) if stop_at else {}
    model.fit(x, y, batch_size=16, epochs=4, seed=3, verbose=0, output_dir=str(out), save_strategy="steps",
              save_steps=5, resume_from_checkpoint=resume or None, **options)
    return model


def _momentum_sgd(params):
    return keras_optimizers.SGD(params, lr=1e-2, momentum=0.9)


@pytest.mark.parametrize("optimizer, kind", [("adam", "fused"), ("adagrad", "fused"), ("rmsprop", "foreach"),
                                                (_momentum_sgd, "for-loop")])
def test_resume_with_a_fused_optimizer_is_bit_identical(tmp_path, optimizer, kind):
    """Also the state Keras' algorithms add: Adam's step count, SGD's last rate (the rate halves
    every 3 steps: the momentum buffer is rescaled as the rate changes, across the resume too)."""
    halving = lambda opt, total: torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)  # noqa: E731
    options = {"lr_scheduler": halving} if optimizer is _momentum_sgd else {}
    full = _checkpointed(tmp_path / "full", optimizer, **options)
    _checkpointed(tmp_path / "cut", optimizer, stop_at=10, **options)  # checkpoints at steps 5 and 10 (mid-epoch 2)
    newest = listing.list_checkpoints(str(tmp_path / "cut"))[-1]
    with open(os.path.join(newest, layout.MANIFEST), encoding="utf-8") as f:
        assert json.load(f)["optimizer_implementation"] == kind
    resumed = _checkpointed(tmp_path / "cut", optimizer, resume=True, seed=99, **options)  # another initialisation
    assert implementation(resumed.runtime.optimizer) == kind
    assert resumed.state.global_step == full.state.global_step == 24
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)


def test_a_checkpoint_resumes_with_the_implementation_it_was_written_with(tmp_path):
    """A run written with the default loop (a class given, or before names built fused) resumed
    under the name "adam" keeps stepping with the default loop: bit-identical to going on."""
    full = _checkpointed(tmp_path / "full", keras_optimizers.Adam)
    _checkpointed(tmp_path / "cut", keras_optimizers.Adam, stop_at=10)
    newest = listing.list_checkpoints(str(tmp_path / "cut"))[-1]
    with open(os.path.join(newest, layout.MANIFEST), encoding="utf-8") as f:
        assert json.load(f)["optimizer_implementation"] == "for-loop"
    resumed = _checkpointed(tmp_path / "cut", "adam", resume=True, seed=99)
    assert implementation(resumed.runtime.optimizer) == "for-loop"
    for a, b in zip(full.module.parameters(), resumed.module.parameters()):
        assert torch.equal(a, b)
