"""Run the benchmarks and print the tables: `python -m benchmarks [options]` (`make bench`).

Parts (`--only`, comma-separated; default all):

* peers      - fitkit, the two hand-written loops (the raw loop over a DataLoader, and the
               slicing loop: randperm + `x[idx[i:i+b]]`, the floor for in-memory tensors), a
               raw Fabric loop and every installed peer (Lightning Trainer, HF Trainer, Keras 3
               on torch, Poutyne, pytorch-accelerated) on the tiny and the compute-bound
               workload, interleaved in this process. On CPU always; on CUDA too, in
               bf16-mixed, when `torch.cuda.is_available()`.
* fixed      - per call: train_on_batch in a loop against a hand-written step; one-step fits
               of fitkit, Poutyne and the two hand loops (tiny).
* display    - verbose=1 and validation against verbose=0 (compute-bound).
* callbacks  - ten no-op callbacks against none (tiny).
* dataloader - a DataLoader-bound workload, num_workers 0 and 2.
* prefetch   - DataLoader-bound at num_workers=0: fitkit's defaults (prefetching) against the
               hand loop and against prefetch=False.
* startup    - import time and time to the first optimizer step, in fresh processes.
* jit        - only when asked (`--jit` or `--only jit`): fitkit with jit_compile=True against
               eager fitkit and the hand loops (tiny, compute-bound; compiling takes minutes).

    python -m benchmarks                     # everything, about 8 minutes on 2 cores
    python -m benchmarks --quick             # a smoke run of everything, about a minute
    python -m benchmarks --only peers --workload tiny --peers raw,fitkit,fabric
    python -m benchmarks --only fixed,prefetch
    python -m benchmarks --only peers --jit  # adds the jit_compile table
    python -m benchmarks --plot docs/img/benchmarks.png --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks import common, peers, scenarios, startup
from benchmarks.common import fmt_ratio, fmt_seconds, markdown_table

PARTS = ("peers", "fixed", "display", "callbacks", "dataloader", "prefetch", "startup")
OPTIONAL = ("jit",)  # only when asked: --jit or --only jit


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs and few repetitions (a smoke check)")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"parts to run, comma-separated: {', '.join(PARTS + OPTIONAL)} (default: all but jit)")
    parser.add_argument("--jit", action="store_true",
                        help="also time fitkit with jit_compile=True against eager (tiny and compute-bound; "
                             "slow on CPU)")
    parser.add_argument("--workload", choices=("tiny", "compute", "all"), default="all", help="peers: which workloads")
    parser.add_argument("--peers", default=",".join(peers.ALL),
                        help=f"peers: contenders, comma-separated (the raw and slicing loops always run): "
                             f"{', '.join(peers.ALL)}")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="peers: auto = CPU, plus CUDA when available (default)")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default=None,
                        help="peers: override the precision (default: 32-true on CPU, bf16-mixed on CUDA)")
    parser.add_argument("--reps", type=int, default=None, help="peers: interleaved repetitions")
    parser.add_argument("--steps", type=int, default=None, help="peers: optimizer steps per run")
    parser.add_argument("--no-fixed-cost", action="store_true",
                        help="peers: skip the one-step fits that separate a fit call's fixed cost from the per-step cost")
    parser.add_argument("--scenario-reps", type=int, default=None,
                        help="display, callbacks, dataloader, prefetch: repetitions")
    parser.add_argument("--fixed-reps", type=int, default=None, help="fixed: repetitions (default 25; --quick 3)")
    parser.add_argument("--fixed-calls", type=int, default=None,
                        help="fixed: calls per timed run (default 100; --quick 5)")
    parser.add_argument("--startup-reps", type=int, default=None, help="startup: fresh processes per contender")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="time in-process runs by the wall clock (default) or by this process's CPU time")
    parser.add_argument("--no-trim", action="store_true", help="turn glibc's heap trimming off (mallopt)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    parser.add_argument("--plot", metavar="PNG", help="also draw the figure (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no per-repetition log on stderr")
    opts = parser.parse_args(argv)
    opts.parts = [p.strip() for p in opts.only.split(",") if p.strip()]
    if opts.jit and "jit" not in opts.parts:
        opts.parts.append("jit")
    unknown = set(opts.parts) - set(PARTS + OPTIONAL)
    if unknown:
        parser.error(f"--only: unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(PARTS + OPTIONAL)}")
    opts.contenders = list(peers.HAND) + [p.strip() for p in opts.peers.split(",")
                                          if p.strip() and p.strip() not in peers.HAND]
    unknown = set(opts.contenders) - set(peers.ALL)
    if unknown:
        parser.error(f"--peers: unknown name(s) {', '.join(sorted(unknown))}; choose from {', '.join(peers.ALL)}")
    return opts


def envs(opts) -> list[common.Env]:
    import torch

    devices = {"auto": ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), "cpu": ["cpu"], "cuda": ["cuda"]}
    out = []
    for d in devices[opts.device]:
        if d == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch.cuda.is_available() is False here")
        out.append(common.Env(d, opts.precision or ("32-true" if d == "cpu" else "bf16-mixed")))
    return out


# -- the tables ------------------------------------------------------------------------------------------


def _workload_label(w: dict) -> str:
    dims = "-".join(map(str, w["dims"]))
    return f"{w['name']} ({dims}, batch {w['batch']}, {w['steps']} steps/fit, {w['reps']} reps)"


def floors_table(env_label: str, results: list[dict]) -> str:
    """fitkit against both hand-written loops, per workload, with the slicing-floor target."""
    key = "step_ratio" if all("step_ratio" in r and "step_ratio" in r.get("vs_slice", {}) for r in results) \
        else "whole_fit_ratio"
    head = ["workload", "fitkit / raw loop (DataLoader) [IQR]", "fitkit / slicing loop (the floor) [IQR]",
            "slicing loop / raw loop", "target (vs the floor)", "result"]
    rows = []
    for r in results:
        w = r["workload"]
        if "fitkit" not in r[key] or "vs_slice" not in r:
            continue
        floor = r["vs_slice"][key]["fitkit"]
        target = w.get("slice_target")
        rows.append([
            _workload_label(w),
            fmt_ratio(r[key]["fitkit"], iqr=True), fmt_ratio(floor, iqr=True), fmt_ratio(r[key]["slice"], iqr=True),
            f"<= {target:.2f}" if target else "", common.verdict(floor, target) if target else "",
        ])
    if not rows:
        return ""
    what = "per optimizer step (fixed cost of a fit call taken out)" if key == "step_ratio" else "per fit"
    return "\n".join([f"### {env_label}: fitkit against the two hand-written loops, cost {what}", "",
                      markdown_table(head, rows), "",
                      "- raw loop: DataLoader(TensorDataset, shuffle=True); slicing loop: per epoch torch.randperm, "
                      "then x[idx[i:i+b]]; both torch's default Adam(lr=1e-3), zero_grad/forward/loss/backward/step. "
                      "fitkit: compile(\"adam\"), whatever optimizer fitkit builds for that name.", ""])


def peers_tables(env_label: str, results: list[dict]) -> str:
    """The floors table, the issue's table (per-step ratio to the raw loop), then one detail table per workload."""
    names = [n for n in peers.TITLES if any(n in r["frameworks"] for r in results)]
    key = "step_ratio" if all("step_ratio" in r for r in results) else "whole_fit_ratio"
    head = ["workload", *(peers.TITLES[n] for n in names), "fitkit target (raw loop)", "result"]
    rows = []
    for r in results:
        w = r["workload"]
        cells = [f"{w['name']} ({'-'.join(map(str, w['dims']))}, batch {w['batch']}, {w['steps']} steps/fit)"]
        cells += [fmt_ratio(r[key][n]) if n in r[key] else "-" for n in names]
        cells += [f"<= {w['target']:.2f}" if w.get("target") else "", verdict(r, key)]
        rows.append(cells)
    what = "per optimizer step (fixed cost of a fit call taken out)" if key == "step_ratio" else "per fit"
    floors = floors_table(env_label, results)
    out = ([floors] if floors else []) + [f"### {env_label}: cost {what}, relative to the raw loop", "",
                                          markdown_table(head, rows), ""]
    for r in results:
        w = r["workload"]
        vs_slice = r.get("vs_slice", {})
        slice_key = "step_ratio" if "step_ratio" in vs_slice else "whole_fit_ratio"
        head = ["framework", "s/step", "per-step ratio [IQR]", "whole-fit ratio [IQR]",
                f"{'per-step' if slice_key == 'step_ratio' else 'whole-fit'} ratio to the slicing loop [IQR]",
                "fixed cost per fit call", "CPU/wall"]
        rows = []
        for n in r["frameworks"]:
            rows.append([
                peers.TITLES[n],
                fmt_seconds(r["marginal_s_per_step"][n] if "marginal_s_per_step" in r else r["s_per_step"][n]),
                fmt_ratio(r["step_ratio"][n], iqr=True) if "step_ratio" in r and n in r["step_ratio"] else "-",
                fmt_ratio(r["whole_fit_ratio"][n], iqr=True),
                fmt_ratio(vs_slice[slice_key][n], iqr=True) if n in vs_slice.get(slice_key, {}) else "-",
                _fixed(r, n),
                f"{_cpu_share(r, n):.0%}",
            ])
        out += [f"{w['name']}: MLP {'-'.join(map(str, w['dims']))}, batch {w['batch']}, {w['steps']} steps per fit, "
                f"{w['reps']} interleaved repetitions ({r['clock']} clock)", "", markdown_table(head, rows), ""]
        for n, why in r["skipped"].items():
            out.append(f"- skipped {peers.TITLES.get(n, n)}: {why}")
        for n, note in r.get("notes", {}).items():
            if "@" not in n:
                out.append(f"- {peers.TITLES.get(n, n)}: {note}")
        if r["skipped"] or r.get("notes"):
            out.append("")
    return "\n".join(out)


def _fixed(r: dict, n: str) -> str:
    if n not in r.get("fixed_seconds", {}):
        return "-"
    s = r["fixed_seconds"][n]
    return fmt_seconds(s) if s > 0 else "~0 (within noise)"


def verdict(r: dict, key: str) -> str:
    w = r["workload"]
    if "fitkit" not in r[key]:
        return "fitkit did not run"
    fk = r[key]["fitkit"]["median"]
    parts = []
    if w.get("target"):
        verdicts = {common.verdict(r[key]["fitkit"], w["target"]), common.verdict(r["whole_fit_ratio"]["fitkit"], w["target"])}
        parts.append("over" if "over" in verdicts else "borderline" if "borderline" in verdicts else "PASS")
    others = [r[key][n]["median"] for n in r[key] if n not in ("fitkit", *peers.HAND)]
    peer_set = [n for n in r[key] if n not in ("fitkit", "fabric", *peers.HAND)]
    if peer_set:
        best = min(r[key][n]["median"] for n in peer_set)
        parts.append("ahead of every peer" if fk < best else "a peer is as fast or faster")
    elif others:
        parts.append("")
    return "; ".join(p for p in parts if p)


def _cpu_share(r: dict, n: str) -> float:
    pairs = [c / t for c, t in zip(r["run_cpu_seconds"][n], r["run_seconds"][n]) if t > 0]
    return sorted(pairs)[len(pairs) // 2] if pairs else float("nan")


def scenario_table(results: dict) -> str:
    head = ["scenario", "comparison", "ratio [IQR]", "target", "result"]
    rows = []
    for name, r in results.items():
        for row in r["rows"]:
            target = ""
            if row.get("target"):
                target = (f"< {row['target']:.2f} (IQR under)" if row.get("strict") else f"<= {row['target']:.2f}")
            rows.append([name, row["what"], fmt_ratio(row["ratio"], iqr=True, digits=3) if row.get("ratio") else "-",
                         target, row.get("verdict", "")])
    notes = []
    for name, r in results.items():
        w = r.get("workload", "")
        notes.append(f"- {name}: {w}" + (f", {r['steps_per_run']} steps per fit, {r['reps']} interleaved repetitions"
                                         if "steps_per_run" in r else ""))
        if name == "prefetch" and "marginal_s_per_step" in r:
            notes.append(f"  - raw loop {fmt_seconds(r['marginal_s_per_step']['raw'])}/step; fitkit's default "
                         f"prefetch: {r.get('prefetch_default')!r}; CPU/wall {r['cpu_share']:.0%}")
            for n, why in r.get("skipped", {}).items():
                if not n.endswith("@1"):
                    notes.append(f"  - skipped {n}: {why}")
        for n, sub in r.get("by_workers", {}).items():
            notes.append(f"  - num_workers={n}: raw loop {fmt_seconds(sub['s_per_step']['raw'])}/step, "
                         f"{sub['steps_per_run']} steps per fit, {sub['reps']} repetitions")
    return "\n".join(["### fitkit scenarios (CPU, 1 thread): ratios of run times", "", markdown_table(head, rows), "",
                      *notes, ""])


def fixed_table(env_label: str, r: dict) -> str:
    w = r["workload"]
    head = ["comparison", "per call", "ratio [IQR]", "target", "result"]
    rows = []
    for row in r["rows"]:
        rows.append([row["what"], fmt_seconds(row["per_call"]) if row.get("per_call") else "",
                     fmt_ratio(row["ratio"], iqr=True, digits=3) if row.get("ratio") else "-",
                     f"<= {row['target']:.2f}" if row.get("target") else "", row.get("verdict", "")])
    out = [f"### {env_label}: what one call costs (tiny: MLP {'-'.join(map(str, w['dims']))}, batch {w['batch']}; "
           f"{r['calls_per_run']} calls per timed run, {r['train_on_batch']['reps']} interleaved repetitions)", "",
           markdown_table(head, rows), "",
           f"- fitkit's optimizer for \"adam\": {r['fitkit_optimizer']}"]
    for part in ("train_on_batch", "one_step_fit"):
        for n, why in r[part]["skipped"].items():
            out.append(f"- skipped {n}: {why}")
    return "\n".join(out + [""])


def jit_table(env_label: str, results: list[dict]) -> str:
    from benchmarks import jit

    out = [f"### {env_label}: fitkit with jit_compile=True (torch.compile) against eager, whole runs", ""]
    head = ["workload", "comparison", "ratio [IQR]"]
    rows = []
    for r in results:
        w = r["workload"]
        label = _workload_label(w)
        for i, row in enumerate(r["rows"]):
            rows.append([label if i == 0 else "", row["what"], fmt_ratio(row["ratio"], iqr=True, digits=3)])
    out += [markdown_table(head, rows), ""]
    for r in results:
        w = r["workload"]
        per_step = ", ".join(f"{jit.TITLES[n]} {fmt_seconds(s)}" for n, s in r["s_per_step"].items())
        out.append(f"- {w['name']}: per step {per_step}")
        first = ", ".join(f"{jit.TITLES[n]} {fmt_seconds(s)}" for n, s in r.get("first_run_seconds", {}).items())
        if first:
            out.append(f"  - first fit (compiling where compiled): {first}")
        for n, why in r["skipped"].items():
            out.append(f"  - skipped {jit.TITLES.get(n, n)}: {why}")
    return "\n".join(out + [""])


def startup_table(r: dict) -> str:
    out = ["### start-up (fresh processes)", ""]
    imp = r.get("imports")
    if imp:
        clock = imp.get("clock", "wall")
        head = ["command", "process wall time", "process CPU time", f"added to `import torch` ({clock})",
                "the import statement alone"]
        rows = []
        for name, secs in imp["process_seconds"].items():
            added = imp["added_to_torch_process"].get(name)
            rows.append([f"`python -c \"{startup.IMPORTS[name]}\"`", fmt_seconds(secs),
                         fmt_seconds(imp["process_cpu_seconds"][name]),
                         "" if added is None else f"{added:+.3f} s",
                         fmt_seconds(imp["import_statement_seconds"][name]) if name in imp["import_statement_seconds"] else ""])
        added = imp["added_to_torch_process"]["torch + fitkit"]
        cpu = imp["process_cpu_seconds"]
        out += [markdown_table(head, rows), "",
                f"`import fitkit` adds {added:+.3f} s to `import torch` ({clock} time; target < 0.1 s: "
                f"{'PASS' if added < imp['target_added_seconds'] else 'over'}); by CPU time "
                f"{cpu['torch + fitkit'] - cpu['torch']:+.3f} s, and `from fitkit import Model` "
                f"{cpu['from fitkit import Model'] - cpu['torch']:+.3f} s; medians of {imp['reps']} processes each "
                "(differences below ~0.05 s are within the spread of process start-up).", ""]
    first = r.get("first_step")
    if first:
        clock = first.get("clock", "wall")
        head = ["framework", "imports done (wall)", "first optimizer step (wall)", "CPU time to the first step",
                f"relative to the Fabric loop ({clock})"]
        chosen = first["seconds"] if clock == "wall" else first["cpu_seconds"]
        fab = chosen.get("fabric")
        rows = [[peers.TITLES[n], fmt_seconds(first["imported_seconds"][n]), fmt_seconds(s),
                 fmt_seconds(first["cpu_seconds"][n]), f"{chosen[n] / fab:.2f}" if fab else ""]
                for n, s in first["seconds"].items()]
        rows.sort(key=lambda row: list(peers.TITLES.values()).index(row[0]))
        ratio = first.get("fitkit_over_fabric")
        out += [markdown_table(head, rows), ""]
        per_rep = first.get("fitkit_over_fabric_per_rep")
        if per_rep:
            out += [f"fitkit / Fabric loop, time to the first step, per repetition: {fmt_ratio(per_rep, iqr=True, digits=3)} "
                    f"({clock} time; target <= 1.00: {common.verdict(per_rep, 1.0)}); medians of {first['reps']} "
                    "processes each.", ""]
        elif ratio is not None:
            out += [f"fitkit / Fabric loop, time to the first step: {ratio:.2f} ({clock} time; target <= 1.00: "
                    f"{'PASS' if ratio <= 1.0 else 'over'}); medians of {first['reps']} processes each.", ""]
        for n, why in first.get("skipped", {}).items():
            out.append(f"- skipped {peers.TITLES.get(n, n)}: {why}")
    return "\n".join(out)


def header(info: dict) -> str:
    versions = ", ".join(f"{k} {info[k]}" for k in ("torch", "lightning-fabric", "lightning", "transformers",
                                                      "accelerate", "keras", "poutyne", "pytorch-accelerated")
                         if info.get(k))
    return (f"## fitkit benchmarks, {info['date'][:10]}\n\n{info['processor']}, {info['cpu_count']} cores, "
            f"{info['torch_threads']} torch thread; Python {info['python']}; {versions}."
            + (f" GPU: {info['cuda']}." if info.get("cuda") else "") + "\n")


def warnings_for(results: dict, clock: str) -> list[str]:
    out = []
    if clock != "wall":
        return out
    for env_label, tables in results.get("peers", {}).items():
        for r in tables:
            if r["cpu_share"] < 0.95:
                out.append(f"warning: {env_label} {r['workload']['name']}: this process got {r['cpu_share']:.0%} of a "
                           "core (the machine was busy); wall-clock figures are unreliable: rerun when it is idle, "
                           "or with --clock cpu")
    for env_label, r in results.get("fixed", {}).items():
        if r["cpu_share"] < 0.95:
            out.append(f"warning: fixed ({env_label}): {r['cpu_share']:.0%} of a core; rerun when the machine is idle")
    for name, r in results.get("scenarios", {}).items():
        if name == "prefetch":  # two threads: CPU time / wall time is meant to exceed 100% here
            continue
        if r.get("cpu_share", 1.0) < 0.95:
            out.append(f"warning: scenario {name}: {r['cpu_share']:.0%} of a core; rerun when the machine is idle")
    return out


# -- main -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    with common.quiet():
        return _main(opts)


def _main(opts) -> int:
    trim_off = common.no_trim() if opts.no_trim else False
    common.single_thread()
    log = (lambda s: None) if opts.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    started = time.perf_counter()
    info = common.meta()
    info.update(quick=opts.quick, clock=opts.clock, no_trim=trim_off)
    results: dict = {"meta": info}
    print(header(info))

    if "peers" in opts.parts:
        keys = ("tiny", "compute") if opts.workload == "all" else (opts.workload,)
        results["peers"] = {}
        for env in envs(opts):
            tables = []
            for key in keys:
                w = common.workload(key, opts.quick, opts.steps, opts.reps)
                log(f"peers: {w.label}, {w.reps} reps x {w.steps} steps, {env.label}")
                tables.append(peers.measure(w, env, opts.contenders, clock=opts.clock, log=log,
                                            fixed_cost=not opts.no_fixed_cost))
            results["peers"][env.label] = tables
            peers.reset_between_tables()
            print(peers_tables(env.label, tables))
    if "fixed" in opts.parts:
        from benchmarks import fixed

        results["fixed"] = {}
        calls = opts.fixed_calls or (5 if opts.quick else 100)
        reps = opts.fixed_reps or (3 if opts.quick else 25)
        for env in envs(opts):
            w = common.workload("tiny", opts.quick)
            log(f"fixed: {w.label}, {reps} reps x {calls} calls, {env.label}")
            results["fixed"][env.label] = fixed.measure(w, env, calls=calls, reps=reps, clock=opts.clock, log=log,
                                                        names=[n for n in fixed.ONE_STEP_FITS if n in opts.contenders
                                                               or n in ("fitkit", "poutyne")])
            peers.reset_between_tables()
            print(fixed_table(env.label, results["fixed"][env.label]))
    chosen = [s for s in scenarios.SCENARIOS if s in opts.parts]
    if chosen:
        results["scenarios"] = {}
        for name in chosen:
            log(f"scenario: {name}")
            results["scenarios"][name] = scenarios.run_scenario(name, quick=opts.quick, clock=opts.clock, log=log,
                                                                    reps=opts.scenario_reps)
        print(scenario_table(results["scenarios"]))
    if "startup" in opts.parts:
        first_reps = opts.startup_reps or (1 if opts.quick else 5)
        import_reps = opts.startup_reps or (1 if opts.quick else 7)
        names = [n for n in (peers.CORE if opts.quick else startup.FIRST_STEP) if n in opts.contenders or n == "fitkit"]
        log(f"startup: {import_reps} fresh processes per import, {first_reps} per framework to the first step")
        results["startup"] = {"imports": startup.import_times(import_reps, log, opts.clock),
                              "first_step": startup.first_step_times(names, first_reps, log, clock=opts.clock)}
        print(startup_table(results["startup"]))

    if "jit" in opts.parts:
        from benchmarks import jit

        results["jit"] = {}
        keys = ("tiny", "compute") if opts.workload == "all" else (opts.workload,)
        for env in envs(opts):
            tables = []
            for key in keys:
                w = common.workload(key, opts.quick, opts.steps, opts.reps)
                log(f"jit: {w.label}, {w.reps} reps x {w.steps} steps, {env.label} (compiling first: minutes on a CPU)")
                tables.append(jit.measure(w, env, clock=opts.clock, log=log))
            results["jit"][env.label] = tables
            print(jit_table(env.label, tables))

    info["seconds"] = time.perf_counter() - started
    for line in warnings_for(results, opts.clock):
        print(line)
    print(f"(medians of interleaved repetitions; ratio < 1 is faster than the baseline; {opts.clock} clock; "
          f"glibc heap trimming {'off' if trim_off else 'on'}; {info['seconds']:.0f} s in all)")
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, default=str)
            f.write("\n")
    if opts.plot:
        try:
            from benchmarks.plot import figure

            os.makedirs(os.path.dirname(os.path.abspath(opts.plot)), exist_ok=True)
            print(f"figure: {figure(results, opts.plot)}")
        except ImportError as err:
            print(f"no figure: {err} (pip install -c constraints.txt -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
