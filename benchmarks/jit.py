"""`compile(jit_compile=True)` (torch.compile of the module) against eager fitkit; optional
(`python -m benchmarks --jit` or `--only jit`), since compiling takes a while on a CPU.

Per workload (tiny, compute-bound) and device: the raw and slicing hand loops, eager fitkit,
fitkit with `jit_compile=True`, and the slicing loop over `torch.compile(net)` (the same
compilation written by hand). Whole runs, interleaved; the first run of each compiled
contender (the untimed warm-up, where compilation happens) is timed apart and reported as the
compile time. On a CPU the compiled runs are expected to be slower on these small MLPs.
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch

from benchmarks.common import Contender, Env, Skip, Workload, compare, data, mlp, ratio
from benchmarks.peers import build_fitkit, build_raw, slice_loop

TITLES = {
    "raw": "raw loop",
    "slice": "slicing loop",
    "fitkit": "fitkit (eager)",
    "fitkit+jit": "fitkit, jit_compile=True",
    "slice+compile": "slicing loop, torch.compile(net)",
}


def _first_run_timed(build, record: dict, name: str):
    """Wrap `build`'s contender so its first run (the warm-up: compilation) is timed into `record`."""

    def make() -> Contender:
        c = build()
        inner, first = c.run, [True]

        def run():
            if first[0]:
                first[0] = False
                t0 = time.perf_counter()
                out = inner()
                record[name] = time.perf_counter() - t0
                return out
            return inner()

        return dataclasses.replace(c, run=run)

    return make


def _compiled_slice(net, x, y, w: Workload, env: Env) -> Contender:
    if not hasattr(torch, "compile"):
        raise Skip("this torch has no torch.compile")
    net.to(env.device)
    compiled = torch.compile(net)
    c = slice_loop(compiled, x, y, w.batch, env)
    return c


def measure(w: Workload, env: Env, *, clock: str = "wall", log=lambda s: None) -> dict:
    torch.manual_seed(0)
    initial = mlp(w.dims)
    x, y = data(w)
    first: dict[str, float] = {}
    table = {
        "raw": lambda: build_raw(copy.deepcopy(initial), x, y, w, env),
        "slice": lambda: slice_loop(copy.deepcopy(initial), x, y, w.batch, env),
        "fitkit": _first_run_timed(lambda: build_fitkit(copy.deepcopy(initial), x, y, w, env), first, "fitkit"),
        "fitkit+jit": _first_run_timed(
            lambda: build_fitkit(copy.deepcopy(initial), x, y, w, env, compile_options={"jit_compile": True}),
            first, "fitkit+jit"),
        "slice+compile": _first_run_timed(lambda: _compiled_slice(copy.deepcopy(initial), x, y, w, env), first,
                                          "slice+compile"),
    }
    r = compare(table, steps=w.steps, reps=w.reps, env=env, clock=clock, log=log,
                label=f"jit {w.name} ({env.device}, {env.precision})")
    r["workload"] = dataclasses.asdict(w)
    r["first_run_seconds"] = first
    rows = []
    ran = r["contenders"]
    if "fitkit+jit" in ran:
        rows.append(("fitkit jit_compile=True / fitkit eager", ratio(r, "fitkit+jit", "fitkit")))
        rows.append(("fitkit jit_compile=True / slicing loop", ratio(r, "fitkit+jit", "slice")))
        if "slice+compile" in ran:
            rows.append(("fitkit jit_compile=True / slicing loop over torch.compile(net)",
                         ratio(r, "fitkit+jit", "slice+compile")))
    if "slice+compile" in ran:
        rows.append(("slicing loop over torch.compile(net) / slicing loop", ratio(r, "slice+compile", "slice")))
    rows.append(("fitkit eager / slicing loop", ratio(r, "fitkit", "slice")))
    rows.append(("fitkit eager / raw loop", r["ratio"]["fitkit"]))
    r["rows"] = [{"what": what, "ratio": rr} for what, rr in rows]
    return r
