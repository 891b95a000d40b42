"""Small shared pieces for the tests."""

import contextlib
import fcntl
import os
import random
import socket
import tempfile

import pytest
import torch

from fitkit import TrainerCallback
from fitkit.events.handler import EVENTS


def mlp(d_in=8, d_out=3, hidden=16, seed=0, dropout=None):
    """`Linear-ReLU-Linear` initialised from torch's global generator seeded with `seed`; with
    `dropout`, a `Dropout(dropout)` before the last layer (it draws nothing when built)::

        net = mlp(4, 2, hidden=32, seed=1, dropout=0.2)
    """
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(d_in, hidden), torch.nn.ReLU()]
    if dropout is not None:
        layers.append(torch.nn.Dropout(dropout))
    return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, d_out))


def seeded_classes(n, d, classes, seed=0, *, global_rng=False):
    """`n` samples of `d` standard normal features, then `n` labels drawn uniformly from
    `range(classes)`, both from a generator of their own seeded with `seed`::

        x, y = seeded_classes(96, 6, 3, seed=1)

    With `global_rng`, torch's global generator is reseeded and drawn from instead (for tests whose
    later draws continue from it).
    """
    if global_rng:
        torch.manual_seed(seed)
        g = None
    else:
        g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def blobs(n=32, seed=0):
    """`n` samples of a separable 3-class problem with 8 features."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(3, 8, generator=g) * 3
    y = torch.arange(n) % 3
    return centers[y] + torch.randn(n, 8, generator=g), y


class Pairs(torch.utils.data.Dataset):
    """A map-style dataset of `(x[i], y[i])` pairs."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Recorder(TrainerCallback):
    """Records every documented event it receives, with the global step."""

    def __init__(self):
        self.events = []
        self.kwargs = {}

    def _make(name):
        def handler(self, args, state, control, **kwargs):
            self.events.append(name)
            self.kwargs.setdefault(name, sorted(kwargs))

        handler.__name__ = name
        return handler

    for _name in EVENTS:
        locals()[_name] = _make(_name)
    del _name, _make


def training_records(log_history):
    """The log records of training itself: without the run's closing summary (its runtime and
    speed differ from run to run)."""
    return [r for r in log_history if "train_runtime" not in r]


class Crash(Exception):
    """A simulated crash (what a kill would do to a run), raised by `CrashAt`."""


class CrashAt(TrainerCallback):
    """Raise `Crash` at the end of optimizer step `step`."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Crash(f"simulated crash at step {self.step}")


class Script(TrainerCallback):
    """Replaces `key` in each evaluation's metrics by the next scripted value (order 0, so the
    monitors, which run later, see the scripted values)."""

    def __init__(self, key, values):
        self.key, self.values, self.i = key, list(values), 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        metrics[self.key] = self.values[self.i]
        self.i += 1


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


@contextlib.contextmanager
def reserved_port():
    """A TCP port for a launcher's rendezvous (`MASTER_PORT`, torchrun's `--master_port`) that no
    concurrent test takes while the block runs::

        with reserved_port() as port:
            subprocess.run([..., "--master_port", str(port), ...])

    Picking a port with bind(0) and closing it races: the kernel hands that port to the next
    bind(0) or outgoing connection of any process before the launcher binds it. Ports below
    the kernel's ephemeral range are never handed out that way; among them this one is free now
    and held by no other test (an fcntl lock per port, released with the block or when the
    test process dies).
    """
    low = _ephemeral_low()
    candidates = list(range(max(1025, low - 12000), low))
    random.Random().shuffle(candidates)  # its own generator: tests seed the global one
    folder = os.path.join(tempfile.gettempdir(), "fitkit-test-ports")
    os.makedirs(folder, exist_ok=True)
    for port in candidates[:500]:
        fd = os.open(os.path.join(folder, str(port)), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another test holds it
            os.close(fd)
            continue
        if not _bindable(port):  # some other program listens there
            os.close(fd)
            continue
        try:
            yield port
        finally:
            os.close(fd)
        return
    raise RuntimeError(f"no free TCP port below {low} for a rendezvous")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore binds: TIME_WAIT is fine
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


#: `make stress` (FITKIT_STRESS=1): the long repetition loops in full; the default run keeps a short
#: version of each (see the `stress` marker in pyproject.toml).
STRESS = bool(os.environ.get("FITKIT_STRESS"))


def stress_only(*values):
    """Parameters that only `make stress` runs (marked `stress`, skipped in the default run)."""
    mark = [pytest.mark.stress, pytest.mark.skipif(not STRESS, reason="a long case: `make stress` runs it")]
    return pytest.param(*values, marks=mark)


TESTS = os.path.dirname(os.path.abspath(__file__))


def torchrun(script, *args, nproc=2, timeout=300):
    """Run `tests/scripts/<script>` under `torch.distributed.run --standalone` on `nproc` CPU
    processes, this checkout's `fitkit` first on the path; fails the test with the end of the
    output when a process fails::

        torchrun("hf_trainer_ddp.py", str(tmp_path))
    """
    import subprocess
    import sys

    root = os.path.dirname(TESTS)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(nproc), os.path.join(TESTS, "scripts", script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
