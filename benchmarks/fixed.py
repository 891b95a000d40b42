"""What one call costs: `train_on_batch` against a hand-written step, and one-step fits.

Both tables run on the tiny workload's network and one batch of its data, where a call's
fixed cost is largest next to the arithmetic; each timed run makes `calls` calls in a row,
interleaved with the other contenders (`compare`), and figures are per call.

* `train_on_batch`: `model.train_on_batch(x, y)` in a loop against a hand step in a loop
  (`zero_grad`, forward, loss, `backward`, `step` on the same batch, torch's default Adam).
  Also a hand step with the optimizer fitkit built (same class and settings: a fused Adam
  where fitkit picks one), to tell the optimizer's share from the call's, and a second hand
  step as the control. Target: `train_on_batch` / hand step <= 1.15.
* one-step fit: `fit` on one batch of one step (fitkit, Poutyne, and the raw and slicing loops
  on one batch, as the peers table's one-step runs), `calls` fits per run. Target: fitkit's
  one-step fit no dearer than Poutyne's (ratio <= 1.00).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from benchmarks.common import Contender, Env, Workload, compare, data, mlp, ratio, verdict
from benchmarks.peers import builders as peer_builders
from benchmarks.peers import fitkit_model, unavailable

STEP_TARGET = 1.15  # train_on_batch / hand step
FIT_TARGET = 1.00  # fitkit's one-step fit / Poutyne's
ONE_STEP_FITS = ("raw", "slice", "fitkit", "poutyne")


def _inner_optimizer(optimizer):
    """The torch optimizer inside Fabric's wrapper (or the optimizer itself)."""
    for _ in range(4):  # Fabric's wrapper is an Optimizer subclass too; its `.optimizer` is the one inside
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return optimizer


def fitkit_optimizer_like(initial: torch.nn.Module, xb, yb, env: Env) -> tuple[type, dict]:
    """The class and settings of the optimizer fitkit builds for "adam" (one untimed step on a copy)."""
    model = fitkit_model(copy.deepcopy(initial), env)
    model.train_on_batch(xb, yb)
    opt = _inner_optimizer(model.runtime.optimizer)
    return type(opt), dict(opt.defaults)


def hand_step(net, xb, yb, calls: int, env: Env, optimizer: torch.optim.Optimizer | None = None) -> Contender:
    """`calls` hand-written steps on one batch: zero_grad, forward, loss, backward, step."""
    net.to(env.device)
    xb, yb = xb.to(env.device), yb.to(env.device)
    opt = optimizer if optimizer is not None else torch.optim.Adam(net.parameters(), lr=1e-3)

    if env.device == "cpu" and not env.bf16:
        def run() -> float:
            for _ in range(calls):
                opt.zero_grad()
                loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                opt.step()
            return loss.item()
    else:
        def run() -> float:
            for _ in range(calls):
                opt.zero_grad()
                with env.autocast():
                    loss = F.cross_entropy(net(xb), yb)
                loss.backward()
                opt.step()
            return loss.item()

    return Contender(run)


def train_on_batch_loop(net, xb, yb, calls: int, env: Env) -> Contender:
    model = fitkit_model(net, env)
    xb, yb = xb.to(env.device), yb.to(env.device)

    def run() -> float:
        for _ in range(calls):
            loss = model.train_on_batch(xb, yb)
        return loss

    return Contender(run)


def _repeated(build, calls: int):
    """A contender whose run is `calls` runs of the one `build()` makes (one-step fits in a row)."""

    def make() -> Contender:
        c = build()
        inner = c.run

        def run():
            for _ in range(calls):
                out = inner()
            return out

        steps = (lambda: c.last_steps() * calls) if c.last_steps is not None else None
        return dataclasses.replace(c, run=run, last_steps=steps)

    return make


def measure(w: Workload, env: Env, *, calls: int, reps: int, names=ONE_STEP_FITS, clock: str = "wall",
            log=lambda s: None) -> dict:
    torch.manual_seed(0)
    initial = mlp(w.dims)
    x, y = data(w)
    xb, yb = x[: w.batch], y[: w.batch]
    out: dict = {"workload": dataclasses.asdict(w), "env": dataclasses.asdict(env), "calls_per_run": calls,
                 "rows": []}

    # -- train_on_batch against a hand step ---------------------------------------------------------
    opt_class, opt_settings = fitkit_optimizer_like(initial, xb, yb, env)
    out["fitkit_optimizer"] = f"{opt_class.__module__}.{opt_class.__name__}({_settings(opt_settings)})"

    def hand_with_fitkit_optimizer() -> Contender:
        net = copy.deepcopy(initial).to(env.device)
        return hand_step(net, xb, yb, calls, env, opt_class(net.parameters(), **opt_settings))

    table = {
        "hand step": lambda: hand_step(copy.deepcopy(initial), xb, yb, calls, env),
        "train_on_batch": lambda: train_on_batch_loop(copy.deepcopy(initial), xb, yb, calls, env),
        "hand step, fitkit's optimizer": hand_with_fitkit_optimizer,
        "hand step (again)": lambda: hand_step(copy.deepcopy(initial), xb, yb, calls, env),
    }
    r = compare(table, steps=calls, reps=reps, env=env, clock=clock, log=log, baseline="hand step",
                required=("hand step", "train_on_batch"), label=f"train_on_batch ({env.device}, {env.precision})")
    out["train_on_batch"] = r
    per_call = r["s_per_step"]
    out["rows"] += [
        _row("hand step (zero_grad, forward, loss, backward, step; torch's default Adam)", per_call["hand step"],
             r["ratio"]["hand step"]),
        _row("train_on_batch / hand step", per_call["train_on_batch"], r["ratio"]["train_on_batch"], STEP_TARGET),
    ]
    if "hand step, fitkit's optimizer" in per_call:
        out["rows"] += [
            _row("hand step with fitkit's optimizer / hand step", per_call["hand step, fitkit's optimizer"],
                 r["ratio"]["hand step, fitkit's optimizer"]),
            _row("train_on_batch / hand step with fitkit's optimizer (the call's own cost)", per_call["train_on_batch"],
                 ratio(r, "train_on_batch", "hand step, fitkit's optimizer")),
        ]
    out["rows"].append(_row("control: hand step, a second instance / the first", per_call["hand step (again)"],
                            r["ratio"]["hand step (again)"]))

    # -- one-step fits ----------------------------------------------------------------------------------
    one = dataclasses.replace(w, steps=1)
    names = [n for n in names if n in ("raw", "slice", "fitkit") or not unavailable(n)]
    skipped = {n: unavailable(n) for n in ONE_STEP_FITS if n not in names}
    table = {n: _repeated(b, calls) for n, b in peer_builders(names, initial, xb, yb, one, env).items()}
    r = compare(table, steps=calls, reps=reps, env=env, clock=clock, log=log,
                label=f"one-step fit ({env.device}, {env.precision})")
    r["skipped"].update({n: why for n, why in skipped.items() if why})
    out["one_step_fit"] = r
    per_call = r["s_per_step"]  # one step per call: seconds per call
    from benchmarks.peers import TITLES

    for n in r["contenders"]:
        what = f"one-step fit: {TITLES[n]}" + (" / raw loop" if n != "raw" else "")
        out["rows"].append(_row(what, per_call[n], r["ratio"][n]))
    if "slice" in r["contenders"]:
        out["rows"].append(_row("one-step fit: fitkit / slicing loop", per_call["fitkit"], ratio(r, "fitkit", "slice")))
    if "poutyne" in r["contenders"]:
        out["rows"].append(_row("one-step fit: fitkit / Poutyne", per_call["fitkit"], ratio(r, "fitkit", "poutyne"),
                                FIT_TARGET))
    else:
        out["rows"].append({"what": f"one-step fit: fitkit / Poutyne: not measured ({r['skipped'].get('poutyne')})",
                            "per_call": None, "ratio": None, "target": FIT_TARGET, "verdict": "not measured"})
    out["cpu_share"] = min(out["train_on_batch"]["cpu_share"], r["cpu_share"])
    return out


def _row(what: str, per_call: float, r: dict, target: float | None = None) -> dict:
    row = {"what": what, "per_call": per_call, "ratio": r, "target": target}
    if target is not None:
        row["verdict"] = verdict(r, target)
    return row


def _settings(d: dict) -> str:
    keep = ("lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "fused", "capturable", "differentiable")
    return ", ".join(f"{k}={d[k]}" for k in keep if k in d)
