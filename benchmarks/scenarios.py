"""Scenarios beyond the bare loop, each timed in-process by interleaved repetitions (`compare`).

* `display` (compute-bound workload): `fit(verbose=1, validation_data=...)` against
  `fit(verbose=0)`, with `verbose=0` plus validation and a raw loop with the same hand-written
  validation pass in between, so the progress bar's cost and validation's cost show apart.
  The bar draws into a stand-in terminal (`FakeTTY`: `isatty()` is true, output dropped), so
  rich renders and refreshes as it would in a terminal, whatever the harness's stdout is.
* `callbacks` (tiny workload): ten callbacks against none. Three kinds of "no-op": plain
  `TrainerCallback` subclasses that override nothing (Keras' and HF's idea of an empty
  callback), ten that override `on_step_end` with an empty body, and ten that override every
  event with an empty body (each called at every step).
* `dataloader` (DataLoader-bound): a map-style Dataset whose items cost real work (an
  augmentation: shift, blur, normalise), `num_workers` 0 and 2; fitkit gets the same
  DataLoader as the raw loop, and at 0 workers also the Dataset itself (fitkit builds the loader).
  A second, identical raw loop runs as a control: its ratio to the first is the noise floor.
  As in the peers table, every contender also runs one-step fits, so the rows give the cost
  per step with a call's fixed cost taken out (the target applies there), and whole runs.
* `prefetch` (DataLoader-bound, `num_workers=0`, 3 x 32 x 32 images and a larger step, so
  loading and the step can overlap on two cores): fitkit with its default options (the next
  batch fetched in a background thread) against the hand-written DataLoader loop over the
  same Dataset, and against fitkit with `prefetch=False`. Target: measurably faster than the
  hand loop (the per-step ratio's interquartile range under 1.00).
"""

from __future__ import annotations

import contextlib
import copy
import io

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from benchmarks.common import (
    Contender,
    Env,
    Workload,
    compare,
    data,
    import_fitkit,
    marginal_ratios,
    mlp,
    ratio,
    verdict,
    verdict_below,
    workload,
)
from benchmarks.peers import build_fitkit, build_raw, check_fit_options, fabric_loop, fitkit_model, raw_loop

# -- progress bar and validation ---------------------------------------------------------------------


class FakeTTY(io.TextIOBase):
    """A terminal that shows nothing: rich sees a TTY and draws its live display into it."""

    def isatty(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        return len(s)


def _raw_with_validation(net, x, y, xv, yv, w: Workload, env: Env) -> Contender:
    train = build_raw(net, x, y, w, env)
    val_loader = DataLoader(TensorDataset(xv, yv), batch_size=w.batch)

    def run() -> float:
        train.run()
        net.eval()
        total, count = torch.zeros(()), 0
        with torch.no_grad():
            for xb, yb in val_loader:
                total += F.cross_entropy(net(xb), yb, reduction="sum")
                count += len(yb)
        net.train()
        return float(total) / count

    return Contender(run)


def display(w: Workload, *, val_batches: int = 2, clock: str = "wall", log=lambda s: None) -> dict:
    env = Env()
    torch.manual_seed(0)
    initial = mlp(w.dims)
    x, y = data(w)
    g = torch.Generator().manual_seed(1)
    xv = torch.randn(val_batches * w.batch, w.dims[0], generator=g)
    yv = torch.randint(0, w.dims[-1], (val_batches * w.batch,), generator=g)

    def fitkit_with(**options):
        def build() -> Contender:
            c = build_fitkit(copy.deepcopy(initial), x, y, w, env, **options)
            if options.get("verbose", 0) == 0:
                return c
            inner = c.run

            def run():
                with contextlib.redirect_stdout(FakeTTY()):
                    return inner()

            c.run = run
            return c

        return build

    builders = {
        "raw": lambda: build_raw(copy.deepcopy(initial), x, y, w, env),
        "raw+val": lambda: _raw_with_validation(copy.deepcopy(initial), x, y, xv, yv, w, env),
        "fitkit": fitkit_with(),
        "fitkit (again)": fitkit_with(),  # the control: its ratio to "fitkit" is the noise floor
        "fitkit+val": fitkit_with(validation_data=(xv, yv)),
        "fitkit+val+bar": fitkit_with(verbose=1, validation_data=(xv, yv)),
    }
    r = compare(builders, steps=w.steps, reps=w.reps, clock=clock, log=log, label=f"display ({w.name})")
    r["scenario"] = "display"
    r["workload"] = w.label
    r["rows"] = [
        _row("fitkit verbose=1 + validation / fitkit verbose=0", ratio(r, "fitkit+val+bar", "fitkit"), 1.03),
        _row("  of which: validation (verbose=0 + validation / verbose=0)", ratio(r, "fitkit+val", "fitkit")),
        _row("  of which: progress bar (verbose=1 / verbose=0, both with validation)",
             ratio(r, "fitkit+val+bar", "fitkit+val")),
        _row("fitkit verbose=1 + validation / raw loop + the same validation", ratio(r, "fitkit+val+bar", "raw+val")),
        _row("raw loop + validation / raw loop", ratio(r, "raw+val", "raw")),
        _row("control: fitkit verbose=0, a second instance / the first", ratio(r, "fitkit (again)", "fitkit")),
    ]
    return r


# -- callbacks ----------------------------------------------------------------------------------------


def _noop_callbacks(kind: str, n: int = 10) -> list:
    """`n` callbacks of distinct classes (fitkit warns about two of one class)."""
    from fitkit import TrainerCallback
    from fitkit.events.handler import EVENTS

    def empty(self, args, state, control, **kwargs):
        return None

    if kind == "bare":
        methods = {}
    elif kind == "step_end":
        methods = {"on_step_end": empty}
    else:  # every event
        methods = {event: empty for event in EVENTS}
    return [type(f"NoOp{kind.title()}{i}", (TrainerCallback,), dict(methods))() for i in range(n)]


def callbacks(w: Workload, *, clock: str = "wall", log=lambda s: None) -> dict:
    env = Env()
    import_fitkit()
    torch.manual_seed(0)
    initial = mlp(w.dims)
    x, y = data(w)

    def fitkit_with(kind: str | None):
        return lambda: build_fitkit(copy.deepcopy(initial), x, y, w, env,
                                    callbacks=_noop_callbacks(kind) if kind else None)

    builders = {
        "raw": lambda: build_raw(copy.deepcopy(initial), x, y, w, env),
        "fitkit": fitkit_with(None),
        "fitkit (again)": fitkit_with(None),  # the control
        "fitkit+10 bare": fitkit_with("bare"),
        "fitkit+10 on_step_end": fitkit_with("step_end"),
        "fitkit+10 every event": fitkit_with("all"),
    }
    r = compare(builders, steps=w.steps, reps=w.reps, clock=clock, log=log, label=f"callbacks ({w.name})")
    r["scenario"] = "callbacks"
    r["workload"] = w.label
    r["rows"] = [
        _row("10 callbacks overriding nothing / none", ratio(r, "fitkit+10 bare", "fitkit"), 1.02),
        _row("10 callbacks with an empty on_step_end / none", ratio(r, "fitkit+10 on_step_end", "fitkit"), 1.02),
        _row("10 callbacks with every event empty / none", ratio(r, "fitkit+10 every event", "fitkit"), 1.02),
        _row("fitkit + 10 callbacks with every event empty / raw loop", ratio(r, "fitkit+10 every event", "raw")),
        _row("control: fitkit, a second instance / the first", ratio(r, "fitkit (again)", "fitkit")),
    ]
    return r


# -- DataLoader-bound ------------------------------------------------------------------------------------


class AugmentedImages(Dataset):
    """`channels` x `size` x `size` uint8 images (default 1 x 28 x 28); each item is shifted,
    blurred and normalised on the fly (about as much work per item as light image
    augmentation), so loading dominates the step."""

    def __init__(self, n: int, seed: int = 0, *, channels: int = 1, size: int = 28):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (n, channels, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = self.images[i].float().div_(255.0)
        img = torch.roll(img, shifts=(i % 5 - 2, (i // 5) % 5 - 2), dims=(1, 2))
        img = F.avg_pool2d(img[None], 3, stride=1, padding=1)[0]
        img = (img - 0.1307) / 0.3081
        return img.flatten(), self.labels[i]


LOADER_WORKLOAD = Workload("dataloader", "DataLoader-bound", (784, 256, 10), batch=64, steps=40, reps=12, target=1.0)


def _loader_contender(kind: str, net, ds: Dataset, w: Workload, workers: int, **fit_options) -> Contender:
    loader = DataLoader(ds, batch_size=w.batch, shuffle=True, num_workers=workers)
    if kind == "raw":
        return raw_loop(net, loader, Env())
    if kind == "fabric":
        return fabric_loop(net, loader, Env())
    model = fitkit_model(net, Env())
    check_fit_options(model, fit_options)  # `prefetch` before it lands: skipped, with the reason
    source = ds if kind.startswith("fitkit(Dataset)") else loader

    def run() -> float:
        return model.fit(source, batch_size=w.batch, epochs=1, verbose=0, shuffle=True,
                         **fit_options).history["loss"][-1]

    return Contender(run, last_steps=lambda: model.state.global_step)


def dataloader(w: Workload = LOADER_WORKLOAD, *, workers: tuple[int, ...] = (0, 2), clock: str = "wall",
               log=lambda s: None) -> dict:
    if clock == "cpu" and any(workers):
        log("  dataloader: worker processes' time is not this process's CPU time; timing by the wall clock")
        clock = "wall"
    torch.manual_seed(0)
    initial = mlp(w.dims)
    ds = AugmentedImages(w.steps * w.batch)
    one = AugmentedImages(w.batch, seed=1)  # one batch: the one-step runs that measure a call's fixed cost
    out = {"scenario": "dataloader", "workload": w.label, "by_workers": {}, "rows": []}
    for n in workers:
        # "raw (again)": a second raw loop, the control: its ratio to the first shows the noise floor
        kinds = ["raw", "fitkit(DataLoader)"] + (["fitkit(Dataset)"] if n == 0 else []) + ["fabric", "raw (again)"]
        builders, expected = {}, {}
        for k in kinds:
            kind = "raw" if k == "raw (again)" else k
            builders[k] = lambda kind=kind, n=n: _loader_contender(kind, copy.deepcopy(initial), ds, w, n)
            builders[f"{k}@1"] = lambda kind=kind, n=n: _loader_contender(kind, copy.deepcopy(initial), one, w, n)
            expected[f"{k}@1"] = 1
        r = compare(builders, steps=w.steps, reps=w.reps, clock=clock, log=log, expected=expected,
                    label=f"dataloader (num_workers={n})")
        r.update(marginal_ratios(r, kinds, w.steps))
        out["by_workers"][str(n)] = r
        for k in kinds[1:]:
            target = w.target if k.startswith("fitkit") else None
            what = (f"num_workers={n}: control: raw loop, a second instance / the first" if k == "raw (again)"
                    else f"num_workers={n}: {k} / raw loop")
            out["rows"].append(_row(f"{what}, per step", r["step_ratio"][k], target,
                                    s_per_step=r["marginal_s_per_step"][k],
                                    raw_s_per_step=r["marginal_s_per_step"]["raw"],
                                    fixed_seconds=r["fixed_seconds"][k]))
            out["rows"].append(_row(f"{what}, whole runs", r["ratio"][k], s_per_step=r["s_per_step"][k],
                                    raw_s_per_step=r["s_per_step"]["raw"]))
    return out


# -- DataLoader-bound with prefetching -----------------------------------------------------------------

#: 3 x 32 x 32 images (58 us of augmentation per item on one core, 3.7 ms per batch of 64),
#: MLP 3072-256-10 (about 5.7 ms a step): loading about 40% of a step. The item's torch ops and
#: the step's matmuls release the GIL, so with a second core a background thread can load the
#: next batch while the step runs (the 1 x 28 x 28 images of `dataloader` are too small: their
#: per-item work is mostly interpreter time, which holds the GIL).
PREFETCH_WORKLOAD = Workload("prefetch", "DataLoader-bound, prefetching", (3072, 256, 10), batch=64, steps=40,
                             reps=20, target=1.0)
PREFETCH_IMAGES = dict(channels=3, size=32)


def prefetch_default() -> object:
    """fitkit's default for the `prefetch` fit option, or None when this fitkit has no such option."""
    from fitkit.config.arguments import TrainingArguments

    return getattr(TrainingArguments(), "prefetch", None)


def prefetch(w: Workload = PREFETCH_WORKLOAD, *, clock: str = "wall", log=lambda s: None) -> dict:
    """`num_workers=0`: fitkit with its default options (prefetching the next batch in a background
    thread, once the option exists) against the hand-written loop over a DataLoader of the same
    Dataset, and against fitkit with `prefetch=False`. Per step (a call's fixed cost taken out,
    from one-step runs) and whole runs; target: measurably faster than the hand loop (the
    interquartile range of the per-step ratio under 1.00)."""
    if clock == "cpu":
        log("  prefetch: a background thread's time is this process's CPU time too; timing by the wall clock")
        clock = "wall"
    torch.manual_seed(0)
    initial = mlp(w.dims)
    ds = AugmentedImages(w.steps * w.batch, **PREFETCH_IMAGES)
    one = AugmentedImages(w.batch, seed=1, **PREFETCH_IMAGES)
    default = prefetch_default()
    kinds = {  # name -> (kind, fit options)
        "raw": ("raw", {}),
        "fitkit(Dataset)": ("fitkit(Dataset)", {}),
        "fitkit(DataLoader)": ("fitkit(DataLoader)", {}),
        "fitkit(Dataset) prefetch=False": ("fitkit(Dataset)", {"prefetch": False}),
        "raw (again)": ("raw", {}),
    }
    builders, expected = {}, {}
    for name, (kind, options) in kinds.items():
        builders[name] = lambda kind=kind, options=options: _loader_contender(
            kind, copy.deepcopy(initial), ds, w, 0, **options)
        builders[f"{name}@1"] = lambda kind=kind, options=options: _loader_contender(
            kind, copy.deepcopy(initial), one, w, 0, **options)
        expected[f"{name}@1"] = 1
    r = compare(builders, steps=w.steps, reps=w.reps, clock=clock, log=log, expected=expected,
                label="prefetch (num_workers=0)")
    ran = [n for n in kinds if n in r["contenders"] and f"{n}@1" in r["contenders"]]
    r.update(marginal_ratios(r, ran, w.steps))
    r["scenario"] = "prefetch"
    r["workload"] = (f"{w.name}: {PREFETCH_IMAGES['channels']}x{PREFETCH_IMAGES['size']}x{PREFETCH_IMAGES['size']} "
                     f"images shifted, blurred and normalised per item, MLP {'-'.join(map(str, w.dims))}, "
                     f"batch {w.batch}, num_workers=0")
    r["prefetch_default"] = default
    fk = "fitkit(Dataset)"
    label = ("default options (prefetch=True)" if default is True else
             f"default options (prefetch={default!r})" if default is not None else
             "default options (no prefetch option in this tree)")
    rows = [
        _row(f"fitkit given the Dataset, {label} / raw loop, per step", r["step_ratio"][fk], w.target, strict=True,
             s_per_step=r["marginal_s_per_step"][fk], raw_s_per_step=r["marginal_s_per_step"]["raw"],
             fixed_seconds=r["fixed_seconds"][fk]),
        _row("  the same, whole runs", r["ratio"][fk]),
        _row(f"fitkit given the DataLoader, {label} / raw loop, per step", r["step_ratio"]["fitkit(DataLoader)"],
             w.target, strict=True, s_per_step=r["marginal_s_per_step"]["fitkit(DataLoader)"]),
    ]
    off = "fitkit(Dataset) prefetch=False"
    if off in ran:
        vs_off = marginal_ratios(r, [fk], w.steps, baseline=off)["step_ratio"][fk]
        rows += [
            _row("fitkit given the Dataset, prefetch=False / raw loop, per step", r["step_ratio"][off],
                 s_per_step=r["marginal_s_per_step"][off]),
            _row(f"fitkit {label} / fitkit prefetch=False, per step", vs_off),
            _row("  the same, whole runs", ratio(r, fk, off)),
        ]
    else:
        rows.append({"what": f"fitkit prefetch=False: not measured ({r['skipped'].get(off, 'skipped')})",
                     "ratio": None, "target": None})
    rows.append(_row("control: raw loop, a second instance / the first, per step", r["step_ratio"]["raw (again)"]))
    r["rows"] = rows
    return r


def _row(what: str, r: dict, target: float | None = None, strict: bool = False, **extra) -> dict:
    """A table row; with `strict` the target is "measurably under" (`verdict_below`)."""
    row = {"what": what, "ratio": r, "target": target, **extra}
    if target is not None:
        row["strict"] = strict
        row["pass"] = (r["q3"] < target) if strict else (r["median"] <= target)
        row["verdict"] = verdict_below(r, target) if strict else verdict(r, target)
    return row


SCENARIOS = ("display", "callbacks", "dataloader", "prefetch")


def _sized(w: Workload, quick: bool, reps: int | None, quick_steps: int) -> Workload:
    """`w` shortened for `--quick`, with `reps` repetitions when given."""
    import dataclasses

    if quick:
        w = dataclasses.replace(w, steps=quick_steps, reps=3)
    return w if reps is None else dataclasses.replace(w, reps=reps)


def run_scenario(name: str, *, quick: bool, clock: str, log, reps: int | None = None) -> dict:
    if name == "display":
        return display(workload("compute", quick, reps=reps), clock=clock, log=log)
    if name == "callbacks":
        return callbacks(workload("tiny", quick, reps=reps), clock=clock, log=log)
    if name == "dataloader":
        return dataloader(_sized(LOADER_WORKLOAD, quick, reps, quick_steps=10), clock=clock, log=log)
    if name == "prefetch":
        return prefetch(_sized(PREFETCH_WORKLOAD, quick, reps, quick_steps=6), clock=clock, log=log)
    raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
