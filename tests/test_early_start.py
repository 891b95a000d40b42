"""`early_start`: which runs start their other processes before Lightning is imported, and that
those processes never outlive a launch that fails. (The overlap itself is checked on a real
2-process run: tests/test_distributed.py::test_ddp_through_the_fabric_launcher.)"""

import subprocess
import sys

import pytest

from fitkit import TrainingArguments
from fitkit.engine.devices import early_start
from fitkit.engine.devices import fabric as fabric_module


@pytest.fixture(autouse=True)
def _a_script(monkeypatch):
    """As in a `python train.py` run: a script to re-run (a pytest-xdist worker's `__main__` is
    none), and no Hydra (a run under Hydra is left to Lightning; another test may import it)."""
    monkeypatch.setattr(sys, "argv", [__file__])
    monkeypatch.delitem(sys.modules, "hydra", raising=False)


def _args(**options):
    return TrainingArguments(output_dir="unused", **{"strategy": "ddp", "devices": 2, **options})


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


@pytest.mark.parametrize("options, environ, why", [
    ({"strategy": "ddp_spawn"}, {}, "a spawn strategy starts its processes itself"),
    ({"strategy": "auto"}, {}, "Lightning chooses the strategy"),
    ({"devices": 1}, {}, "one process"),
    ({"devices": "auto"}, {}, "a count Lightning decides"),
    ({}, {"LOCAL_RANK": "1"}, "a process someone else started"),
    ({}, {"SLURM_NTASKS": "2"}, "a cluster environment"),
    ({}, {"TORCHELASTIC_RUN_ID": "x"}, "torchrun"),
])
def test_only_the_plain_script_launch_starts_early(monkeypatch, options, environ, why):
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    environment = {"PATH": "/usr/bin", **environ}
    assert early_start.start(_args(**options), "cpu", environment) is None, why
    assert started == [] and early_start.launch_env.MARKER not in environment


def test_the_plain_case_starts_each_other_process_with_lightnings_variables(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "Popen", lambda command, env: calls.append((command, env)) or "proc")
    environment = {"PATH": "/usr/bin"}
    started = early_start.start(_args(devices=3), "cpu", environment)
    assert started is not None and started.procs == ["proc", "proc"]
    assert [env["LOCAL_RANK"] for _, env in calls] == ["1", "2"]
    for command, env in calls:
        assert command[0] == sys.executable
        assert env["WORLD_SIZE"] == "3" and env["NODE_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == environment["MASTER_PORT"]  # the port this process's Fabric reads too
        assert env[early_start.launch_env.MARKER] == "3"
    assert "LOCAL_RANK" not in environment  # this process's own are set by the launcher, at launch


def test_a_fabric_that_fails_to_build_stops_the_processes_started_early(monkeypatch):
    procs = [_sleeper(), _sleeper()]
    monkeypatch.setattr(early_start, "start", lambda args, accelerator: early_start.Started(procs, 3, 1))

    def refuse(args, accelerator):
        raise ValueError("precision 'x' is not supported")

    monkeypatch.setattr(fabric_module, "_fabric", refuse)
    with pytest.raises(ValueError, match="precision"):
        fabric_module.build_fabric(_args(devices=3, accelerator="cpu"))
    assert [p.poll() is not None for p in procs] == [True, True]


def test_a_launcher_other_than_the_plain_one_gets_no_processes(monkeypatch):
    class Launcher:  # what a strategy other than Lightning's script launcher has
        procs = []

    class Strategy:
        launcher = Launcher()

    class Fabric:
        strategy = Strategy()

    started = early_start.Started([_sleeper()], 2, 1)
    proc = started.procs[0]
    assert early_start.adopt(Fabric(), started) is False
    assert proc.poll() is not None and started.procs == []
