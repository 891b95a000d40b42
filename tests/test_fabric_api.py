"""`model.fabric` of a one-device run (fitkit's `LocalFabric`, no Lightning import) offers every
public member of the installed `lightning_fabric.Fabric`, each behaving as it does on a real
one-device Fabric: the members are listed from the installed package (a release that adds one
fails here until it is covered), and each is run on both and the results compared (values,
dtypes and devices, the files `save` writes, what the loggers receive, the errors raised)."""

import contextlib
import dataclasses
import functools
import io
import os
import random
import warnings
from collections import namedtuple

import numpy as np
import pytest
import torch

from fitkit import Model
from tests.helpers import blobs, mlp

lightning_fabric = pytest.importorskip("lightning_fabric")

#: The public members of the installed Fabric (properties, methods, the static `seed_everything`).
FABRIC_MEMBERS = sorted(name for name in dir(lightning_fabric.Fabric) if not name.startswith("_"))

Pair = namedtuple("Pair", "first second")


@dataclasses.dataclass
class Box:
    tensor: torch.Tensor
    label: str


class Recorder:
    """A logger: what `log` / `log_dict` hand to each logger."""

    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((metrics, step))


_net = functools.partial(mlp, 3, 2, 4)


def _loss(fabric, module):
    x = fabric.to_device(torch.linspace(-1, 1, 12).reshape(4, 3))
    return module(x).pow(2).mean()


def _grads(module):
    return [p.grad for p in module.parameters()]


def _stepped(fabric):
    """A module and SGD set up separately, one training step: the weights."""
    module = fabric.setup_module(_net())
    optimizer = fabric.setup_optimizers(torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9))
    fabric.backward(_loss(fabric, module))
    optimizer.step()
    return module, optimizer


def _no_argument():  # `launch` refuses a function that cannot take the Fabric
    return None


def _captured(fn):
    """`fn()`'s result, or the error it raised (its type and message)."""
    try:
        return ("returned", fn())
    except Exception as error:  # noqa: BLE001 - the error is the result compared
        return ("raised", type(error).__name__, str(error))


# -- one check a member, `of_<member>`: each takes the Fabric and a fresh directory, returns what to compare ---------
def of_accelerator(f, path):
    from lightning_fabric.accelerators import Accelerator

    return type(f.accelerator).__name__, isinstance(f.accelerator, Accelerator)


def of_all_gather(f, path):
    data = {"t": torch.arange(3), "n": 2, "x": 0.5, "b": True, "a": [np.ones(2)], "s": "kept"}
    return f.all_gather(data), f.all_gather(torch.ones(2, 2))


def of_all_reduce(f, path):
    data = [torch.tensor([1.0, 2.0]), (3, 4.5), {"b": False}]
    return f.all_reduce(data), f.all_reduce(torch.ones(3), reduce_op="sum"), f.all_reduce(7, reduce_op="max")


def of_autocast(f, path):
    with f.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
        return out, torch.is_autocast_enabled("cpu")


def of_backward(f, path):
    module = f.setup_module(_net())
    f.backward(_loss(f, module), model=module)
    return _grads(module)


def of_barrier(f, path):
    return f.barrier(), f.barrier("named")


def of_broadcast(f, path):
    return f.broadcast({"a": [1, 2], "t": torch.ones(2)}), f.broadcast("text", src=0)


def of_call(f, path):
    seen = []

    class Hooks:
        def on_thing(self, value, keep=None):  # `drop` is filtered out: not in the signature
            seen.append((value, keep))

        not_callable = 3

    f._callbacks.append(Hooks())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = f.call("on_thing", 1, keep=2, drop=3), f.call("no_such_hook"), f.call("not_callable")
        return results, seen, [str(w.message) for w in caught]
    finally:
        f._callbacks.pop()


def of_clip_gradients(f, path):
    net = _net()
    module = f.setup_module(net)
    optimizer = f.setup_optimizers(torch.optim.SGD(net[0].parameters(), lr=0.1))  # the first layer only
    f.backward(_loss(f, module) * 100)
    norm = f.clip_gradients(module, optimizer, max_norm=0.5)
    after_norm = _grads(module)
    by_value = f.clip_gradients(module, optimizer, clip_val=0.01)
    return (norm, after_norm, by_value, _grads(module),
            _captured(lambda: f.clip_gradients(module, optimizer)),
            _captured(lambda: f.clip_gradients(module, optimizer, clip_val=1, max_norm=1)))


def of_device(f, path):
    return f.device


def of_global_rank(f, path):
    return f.global_rank


def of_init_module(f, path):
    before = torch.random.get_rng_state()
    with f.init_module(empty_init=True):
        empty = torch.nn.Linear(3, 2)
        default_device = torch.get_default_device()
    skipped_init = torch.equal(before, torch.random.get_rng_state())  # no initializer drew a number
    torch.manual_seed(4)
    with f.init_module():
        built = torch.nn.Linear(3, 2)
    torch.manual_seed(4)
    return skipped_init, empty.weight.device, default_device, built.state_dict(), torch.nn.Linear(3, 2).state_dict()


def of_init_tensor(f, path):
    with f.init_tensor():
        return torch.zeros(2), torch.get_default_device()


def of_is_global_zero(f, path):
    return f.is_global_zero


def of_launch(f, path):
    return (f.launch(lambda fabric, extra, twice=1: (fabric.world_size, extra, twice), 5, twice=2),
            _captured(lambda: f.launch(5)), _captured(lambda: f.launch(_no_argument)))


def of_load(f, path):
    module, optimizer = _stepped(f)
    f.save(path / "state.pt", {"model": module, "optimizer": optimizer, "step": 3, "extra": {"a": 1}})
    fresh = _net(seed=1)
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.5, momentum=0.9)
    state = {"model": fresh, "optimizer": fresh_optimizer, "step": 0}
    rest = f.load(path / "state.pt", state, weights_only=True)
    return (rest, state["step"], fresh.state_dict(), fresh_optimizer.state_dict(),
            f.load(path / "state.pt", weights_only=True),
            _captured(lambda: f.load(path / "state.pt", {"model": fresh, "missing": 1})),
            f.load(path / "state.pt", {"model": fresh, "missing": 1}, strict=False),
            _captured(lambda: f.load(path / "none.pt")))


def of_load_raw(f, path):
    module, optimizer = _stepped(f)
    torch.save(module.state_dict(), path / "module.pt")
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    torch.save({"0.weight": torch.zeros(4, 3)}, path / "part.pt")
    fresh = _net(seed=1)
    fresh_optimizer = f.setup_optimizers(torch.optim.SGD(fresh.parameters(), lr=0.5, momentum=0.9))
    f.load_raw(path / "module.pt", fresh)
    f.load_raw(path / "optimizer.pt", fresh_optimizer)
    loaded = fresh.state_dict(), fresh_optimizer.state_dict()
    f.load_raw(path / "part.pt", fresh, strict=False)
    return loaded, fresh.state_dict(), _captured(lambda: f.load_raw(path / "part.pt", fresh))


def _with_recorder(f, run):
    recorder = Recorder()
    f.loggers.append(recorder)
    try:
        run()
    finally:
        f.loggers.remove(recorder)
    return recorder.calls


def of_log(f, path):
    return _with_recorder(f, lambda: (f.log("loss", torch.tensor(2.5), step=3), f.log("n", 4)))


def of_log_dict(f, path):
    nested = {"a": torch.tensor(1.0), "b": 2, "c": {"d": torch.tensor([3])}, "e": [torch.tensor(True)]}
    calls = _with_recorder(f, lambda: f.log_dict(nested, step=1))
    return calls, _captured(lambda: f.log_dict({"many": torch.ones(2)})), f.log_dict({"nobody": 1})


def of_logger(f, path):
    recorder = Recorder()
    empty = _captured(lambda: f.logger)
    f.loggers.append(recorder)
    try:
        return empty, f.logger is recorder
    finally:
        f.loggers.remove(recorder)


def of_loggers(f, path):
    return f.loggers, f.loggers is f.loggers


def of_local_rank(f, path):
    return f.local_rank


def of_no_backward_sync(f, path):
    module = f.setup_module(_net())
    with f.no_backward_sync(module):
        f.backward(_loss(f, module))
    skipped = [g.clone() for g in _grads(module)]
    with f.no_backward_sync(module, enabled=False):
        f.backward(_loss(f, module))
    return skipped, _grads(module)


def of_node_rank(f, path):
    return f.node_rank


def of_print(f, path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        f.print("a", 1, sep="-", end="!\n")
    return out.getvalue()


def of_rank_zero_first(f, path):
    ran = []
    with f.rank_zero_first():
        ran.append("global")
    with f.rank_zero_first(local=True) as value:
        ran.append(value)
    return ran


def of_run(f, path):
    return f.run(1, key=2)


def of_save(f, path):
    module, optimizer = _stepped(f)
    f.save(path / "state.pt", {"model": module, "optimizer": optimizer, "step": 3, "note": "text"})
    f.save(path / "filtered.pt", {"model": module, "optimizer": optimizer},
           filter={"model": lambda name, value: "bias" not in name, "optimizer": lambda name, value: False})
    return (sorted(os.listdir(path)), torch.load(path / "state.pt", weights_only=True),
            torch.load(path / "filtered.pt", weights_only=True),
            _captured(lambda: f.save(path / "x.pt", {"model": module}, filter=[])),
            _captured(lambda: f.save(path / "x.pt", {"model": module}, filter={"other": len})),
            _captured(lambda: f.save(path / "x.pt", {"model": module}, filter={"model": 1})))


def of_seed_everything(f, path):
    with pytest.MonkeyPatch.context() as env:  # seed_everything sets Lightning's variables; undone on leaving
        env.setenv("PL_GLOBAL_SEED", "")  # records the variable's state, so leaving undoes what the test sets
        env.delenv("PL_GLOBAL_SEED")
        env.setenv("PL_SEED_WORKERS", "")  # records the variable's state, so leaving undoes what the test sets
        env.delenv("PL_SEED_WORKERS")
        first = f.seed_everything(7)
        drawn = torch.rand(2), random.random(), np.random.rand(), dict(os.environ)["PL_SEED_WORKERS"]
        os.environ["PL_GLOBAL_SEED"] = "11"
        from_environment = type(f).seed_everything(workers=False, verbose=False)
        drawn_again = torch.rand(2), os.environ["PL_SEED_WORKERS"]
        del os.environ["PL_GLOBAL_SEED"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            default = f.seed_everything()
        return (first, drawn, from_environment, drawn_again, default, [str(w.message) for w in caught],
                _captured(lambda: f.seed_everything(-1)), _captured(lambda: f.seed_everything("3")))


def of_setup(f, path):
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    module, wrapped, returned_scheduler = f.setup(net, optimizer, scheduler=scheduler)
    f.backward(_loss(f, module))
    wrapped.step()
    alone = f.setup(_net(seed=2))
    return (isinstance(wrapped, torch.optim.SGD), returned_scheduler is scheduler, module.state_dict(),
            isinstance(alone, torch.nn.Module), len(f.setup(_net(), torch.optim.SGD(net.parameters(), lr=1))),
            _captured(lambda: f.setup(_net(), wrapped)))


def _own_init(worker_id):
    return None


def of_setup_dataloaders(f, path):
    data = torch.utils.data.TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
    loader = f.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=2))
    first, second = f.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=3),
                                        torch.utils.data.DataLoader(data, batch_size=4))
    with pytest.MonkeyPatch.context() as env:  # after seed_everything(workers=True): Fabric seeds the workers
        env.setenv("PL_SEED_WORKERS", "1")
        seeded = f.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=2))
        own = f.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=2, worker_init_fn=_own_init))
        env.setenv("PL_SEED_WORKERS", "0")
        unseeded = f.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=2))
    # (what the added function does: tests/test_local_fabric.py and tests/test_fabric_examples.py)
    return (list(loader), list(first), list(second), _captured(lambda: f.setup_dataloaders()),
            _captured(lambda: f.setup_dataloaders([1, 2])), loader.worker_init_fn, seeded.worker_init_fn.keywords,
            own.worker_init_fn is _own_init, unseeded.worker_init_fn)


def of_setup_module(f, path):
    module, _ = _stepped(f)
    unmoved = f.setup_module(_net(), move_to_device=False)
    return isinstance(module, torch.nn.Module), module.state_dict(), module(torch.ones(1, 3)), unmoved.state_dict()


def of_setup_optimizers(f, path):
    net = _net()
    one = f.setup_optimizers(torch.optim.Adam(net.parameters(), lr=0.01))
    two = f.setup_optimizers(torch.optim.SGD(net[0].parameters(), lr=0.1), torch.optim.SGD(net[2].parameters()))
    return (isinstance(one, torch.optim.Adam), one.param_groups[0]["lr"], type(two).__name__, len(two),
            isinstance(one.optimizer, torch.optim.Adam), _captured(lambda: f.setup_optimizers()),
            _captured(lambda: f.setup_optimizers(one)), _after_step_hooks(f))


def _after_step_hooks(f):
    """What a Fabric callback's `on_after_optimizer_step` gets after each step of an optimizer set
    up while the callback was there (one set up before it, with no callback, calls nobody)."""
    seen = []

    class AfterStep:
        def on_after_optimizer_step(self, strategy, optimizer):
            seen.append((type(strategy).__name__, type(optimizer).__name__, strategy is f.strategy))

    before = f.setup_optimizers(torch.optim.SGD(_net().parameters(), lr=0.1))
    f._callbacks.append(AfterStep())
    try:
        optimizer = f.setup_optimizers(torch.optim.SGD(_net().parameters(), lr=0.1))
        optimizer.step()
        optimizer.step(lambda: 1.0)
        before.step()
    finally:
        f._callbacks.pop()
    return seen


def of_sharded_model(f, path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with f.sharded_model():
            built = torch.nn.Linear(2, 2)
    return [(issubclass(w.category, DeprecationWarning), str(w.message)) for w in caught], built.weight.device


def of_strategy(f, path):
    s = f.strategy
    return type(s).__name__, s.root_device, s.is_global_zero, s.world_size, type(s.precision).__name__


def of_to_device(f, path):
    net = _net()
    data = {"t": torch.ones(2), "pair": Pair(torch.zeros(1), [torch.ones(1), "s"]), "box": Box(torch.ones(1), "b"),
            "n": 3, "text": "kept"}
    return f.to_device(net) is net, f.to_device(torch.ones(2)), f.to_device(data), f.to_device(None)


def of_world_size(f, path):
    return f.world_size


CHECKS = {name[len("of_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("of_")}


def _plain(value):
    """What a result is, in comparable terms: tensors by dtype, device and values; collections
    by type and contents; modules and optimizers by their state."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.device.type, value.tolist())
    if isinstance(value, torch.device):
        return ("device", str(value))
    if isinstance(value, torch.nn.Module):
        return ("module", _plain(value.state_dict()))
    if isinstance(value, dict):
        return (type(value).__name__, {key: _plain(v) for key, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, [_plain(v) for v in value])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_plain(v) for v in value])
    if dataclasses.is_dataclass(value):
        return (type(value).__name__, _plain(dataclasses.asdict(value)))
    if isinstance(value, np.ndarray):
        return ("ndarray", value.tolist())
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return ("object", type(value).__name__)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def fabrics(request):
    """`model.fabric` after a one-device fit, and Lightning's Fabric on the same one device
    (the CPU; a CUDA GPU too where there is one)."""
    x, y = blobs(32)
    model = Model(torch.nn.Linear(8, 3)).compile("sgd", "cross_entropy", accelerator=request.param)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    real = lightning_fabric.Fabric(accelerator=request.param, devices=1)
    real.launch()
    return model.fabric, real


@pytest.mark.parametrize("member", FABRIC_MEMBERS)
def test_every_member_of_fabric_behaves_as_on_a_one_device_fabric(member, fabrics, tmp_path):
    local, real = fabrics
    assert type(local).__name__ == "LocalFabric"
    assert member in CHECKS, (f"lightning_fabric.Fabric has a public member `{member}` that tests/test_fabric_api.py does "
                              "not check: offer it on LocalFabric (fitkit/engine/devices/local_members.py) and add "
                              "a check here")
    defined = member in vars(local) or any(member in vars(klass) for klass in type(local).__mro__)
    assert defined, f"LocalFabric does not define `{member}`"  # (not merely reached through __getattr__)
    results = []
    for fabric, name in ((local, "local"), (real, "real")):
        directory = tmp_path / name
        directory.mkdir()
        result = _plain(_captured(lambda: CHECKS[member](fabric, directory)))  # noqa: B023 - called at once
        results.append(repr(result).replace(str(directory), "<directory>"))
    assert results[0] == results[1]


def test_every_check_names_a_member_of_fabric():
    """No check left behind for a member a release removed (it would test nothing of Fabric)."""
    assert sorted(CHECKS) == FABRIC_MEMBERS


def test_a_member_fabric_lacks_is_an_error_naming_the_way_to_real_fabric(fabrics):
    local, _ = fabrics
    with pytest.raises(AttributeError, match=r"no attribute 'setup_everything'.*strategy='single_device'"):
        local.setup_everything  # noqa: B018
    # the way it names: one device on Lightning's own Fabric
    x, y = blobs(32)
    model = Model(torch.nn.Linear(8, 3)).compile("sgd", "cross_entropy", accelerator="cpu", strategy="single_device")
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    assert isinstance(model.fabric, lightning_fabric.Fabric)
    assert type(model.fabric.strategy).__name__ == "SingleDeviceStrategy" and model.fabric.device.type == "cpu"
    with pytest.raises(ValueError, match=r"runs on one device, but `devices`=2: pass devices=1"):
        Model(torch.nn.Linear(8, 3)).compile("sgd", "cross_entropy", accelerator="cpu", strategy="single_device",
                                             devices=2).fit(x, y, verbose=0)
