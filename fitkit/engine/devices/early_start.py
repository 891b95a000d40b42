"""Start the other processes of a script-launched run before Lightning is imported.

`strategy="ddp"` (or `"fsdp"`) run as `python train.py` has Lightning's script launcher start
the other processes from `fabric.launch()`, once the launching process has imported
`lightning_fabric` (several seconds: it imports `torch._dynamo` and all of `torchmetrics`). Each
started process then imports all of that again, so the two imports run one after the other::

    launching process:  import torch, script | import lightning_fabric | launch ... wait ...
    started process:                                                   | import torch, script, lightning_fabric

`start(args)` starts the processes first, with the environment Lightning's launcher gives them,
so both imports run at once; `adopt(fabric, started)` then hands them to the launcher, which
sets its own process's variables and watches them exactly as it would have had it started them.
Only the plain case is started early (a strategy named "ddp" or "fsdp", a number of devices,
no cluster environment, no Hydra); where Lightning chose differently the processes are stopped
and its launcher starts its own. Only os, socket, subprocess and sys are imported here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import MutableMapping
from typing import Any

from fitkit.common import launch_env

#: Strategies Lightning starts with its script launcher (re-running the script in each process).
SCRIPT_STRATEGIES = ("ddp", "fsdp", "ddp_find_unused_parameters_true")
#: Variables by which Lightning detects a cluster environment (SLURM, torchelastic, Kubeflow, LSF,
#: MPI) or processes started by someone else: any of them, and Lightning decides alone. (`fabric
#: run` and the spawn strategies are left out by the caller, `fabric.build_fabric`.)
_CLUSTER_MARKERS = ("LOCAL_RANK", "SLURM_NTASKS", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "KUBERNETES_PORT",
                    "LSB_JOBID", "JSM_NAMESPACE_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


class Started:
    """The processes `start` started, and the layout they were started for."""

    def __init__(self, procs: list[subprocess.Popen], per_node: int, nodes: int) -> None:
        self.procs, self.per_node, self.nodes = procs, per_node, nodes

    def stop(self) -> None:
        """Kill them (the launching process failed, or Lightning launches otherwise)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []


def _count(devices: Any) -> int | None:
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices
    if isinstance(devices, str) and devices.strip().isdigit():
        return int(devices.strip())
    return None


def _command() -> list[str]:
    """The command line that re-runs this script, as Lightning's launcher builds it."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None:
        return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    return [sys.executable, "-m", spec.name, *sys.argv[1:]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def start(args: Any, accelerator: str, environ: MutableMapping[str, str] = os.environ) -> Started | None:
    """Start processes 1.. of this node for `args` when Lightning's script launcher would
    (see the module's docstring); None when it is not the plain case."""
    per_node, nodes = _count(args.devices), args.num_nodes
    if args.strategy not in SCRIPT_STRATEGIES or per_node is None or not isinstance(nodes, int):
        return None
    if per_node < 2 or accelerator not in ("cpu", "cuda") or "hydra" in sys.modules:
        return None
    if any(name in environ for name in _CLUSTER_MARKERS) or hasattr(sys, "ps1") or sys.flags.interactive:
        return None  # a cluster or an interactive session: Lightning decides (or refuses) alone
    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is None and not (sys.argv and os.path.isfile(sys.argv[0])):
        return None  # no script to re-run (`python -c`, an embedded interpreter)
    environ.setdefault("MASTER_ADDR", "127.0.0.1")
    environ.setdefault("MASTER_PORT", str(_free_port()))  # read by Lightning's environment in this process too
    environ[launch_env.MARKER] = str(per_node)
    child = dict(environ, NODE_RANK=environ.get("NODE_RANK", "0"), WORLD_SIZE=str(per_node * nodes))
    command = _command()
    procs = [subprocess.Popen(command, env={**child, "LOCAL_RANK": str(rank)}) for rank in range(1, per_node)]
    return Started(procs, per_node, nodes)


def adopt(fabric: Any, started: Started) -> bool:
    """Hand `started` to the Fabric's script launcher in place of the processes it would start;
    False (and `started` stopped) when Lightning launches this run otherwise."""
    launcher = getattr(fabric.strategy, "launcher", None)
    environment = getattr(launcher, "cluster_environment", None)
    plain = (launcher is not None and type(launcher).__name__ == "_SubprocessScriptLauncher"
             and environment is not None and type(environment).__name__ == "LightningEnvironment"
             and not environment.creates_processes_externally
             and launcher.num_processes == started.per_node and launcher.num_nodes == started.nodes
             and hasattr(launcher, "_call_children_scripts") and not launcher.procs)
    if not plain:
        started.stop()
        return False
    assert launcher is not None and environment is not None  # both checked by `plain`

    def call_children_scripts() -> None:
        # What the launcher sets in its own process before starting the others; they are started.
        os.environ["MASTER_ADDR"] = environment.main_address
        os.environ["MASTER_PORT"] = str(environment.main_port)
        os.environ["NODE_RANK"] = str(environment.node_rank())
        os.environ["LOCAL_RANK"] = str(environment.local_rank())
        os.environ["WORLD_SIZE"] = str(started.per_node * started.nodes)
        launcher.procs.extend(started.procs)

    launcher._call_children_scripts = call_children_scripts
    return True
