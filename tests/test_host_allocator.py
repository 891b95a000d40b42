"""On a CPU, `fit` keeps glibc's malloc from returning a step's freed gradients to the kernel
(`host_allocator.keep_freed_memory`): the steps stop faulting their pages in afresh, with the
same bits; `tune_cpu_allocator=False` and the user's own malloc settings leave glibc alone."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fitkit.engine.devices import host_allocator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Four 16 MiB weight matrices: their gradients are freed by each zero_grad and allocated again by
# the next backward, the pattern glibc's moving thresholds turn into page faults.
FIT = textwrap.dedent("""
    import ctypes, json, resource, sys, torch
    from fitkit import Model, TrainerCallback

    if "fixed" in sys.argv:  # glibc's thresholds fixed at their initial values, as MALLOC_TOP_PAD_ fixes them
        ctypes.CDLL(None).mallopt(-2, 128 * 1024)  # M_TOP_PAD, its default value

    class Faults(TrainerCallback):
        def __init__(self):
            self.per_step, self.last = [], None

        def on_step_end(self, args, state, control, **kwargs):
            now = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            if self.last is not None:
                self.per_step.append(now - self.last)
            self.last = now

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(4)])
    x, y = torch.randn(96, 2048), torch.randn(96, 2048)
    faults = Faults()
    Model(net).compile("sgd", "mse").fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[faults],
                                          tune_cpu_allocator="on" in sys.argv)
    steady = sorted(faults.per_step[4:])
    print(json.dumps({"median_faults": steady[len(steady) // 2],
                      "weights": [p.double().sum().item() for p in net.parameters()]}))
""")


def _fit(*options: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.update(env, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", FIT, *options], capture_output=True, text=True, env=environ,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_steps_stop_faulting_in_their_gradients_with_the_same_bits():
    # 4 gradients of 16 MiB are 16,384 pages. With glibc's moving thresholds a step faults in 0, 4,000,
    # 8,000 or 16,000 of them, varying from one run to the next; with the thresholds held at their initial
    # values ("fixed"), all of them, every step: the case the tuning must fix whatever glibc's state.
    untuned, tuned = _fit("off", "fixed"), _fit("on", "fixed")
    assert untuned["median_faults"] >= 16000, untuned
    assert tuned["median_faults"] < 512, tuned
    assert tuned["weights"] == untuned["weights"]
    assert _fit("on")["median_faults"] < 512
    # The user's own malloc settings win: then fitkit leaves glibc alone, and the faults stay.
    assert _fit("on", MALLOC_TOP_PAD_=str(128 * 1024))["median_faults"] >= 16000


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": "100000"}, {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"},
                                 {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}])
def test_user_allocator_settings_are_left_alone(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert host_allocator._apply() is False


def test_applied_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(host_allocator, "_applied", None)
    monkeypatch.setattr(host_allocator, "_apply", lambda: calls.append(1) or True)
    assert host_allocator.keep_freed_memory() and host_allocator.keep_freed_memory()
    assert calls == [1]
