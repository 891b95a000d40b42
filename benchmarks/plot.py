"""The benchmark figure: one PNG from the results `run` collects (matplotlib, Agg backend).

    python -m benchmarks.plot results.json docs/img/benchmarks.png   # from a saved --json file
"""

from __future__ import annotations

import json
import sys

from benchmarks.peers import TITLES

COLORS = {"fitkit": "#d62728", "raw": "#7f7f7f", "slice": "#4d4d4d"}
WORKLOAD_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")


def _bars_by_framework(ax, tables: list[dict], key: str, title: str) -> None:
    """Grouped horizontal bars: one group per framework, one bar per workload, IQR whiskers."""
    frameworks = [n for n in TITLES if any(n in t.get(key, {}) for t in tables)]
    height = 0.8 / max(len(tables), 1)
    for j, t in enumerate(tables):
        values = t.get(key, {})
        ys, meds, lo, hi = [], [], [], []
        for i, n in enumerate(frameworks):
            if n not in values:
                continue
            r = values[n]
            ys.append(i + (j - (len(tables) - 1) / 2) * height)
            meds.append(r["median"])
            lo.append(r["median"] - r["q1"])
            hi.append(r["q3"] - r["median"])
        ax.barh(ys, meds, height=height * 0.95, xerr=[lo, hi], color=WORKLOAD_COLORS[j % len(WORKLOAD_COLORS)],
                label=t["workload"]["name"], error_kw={"elinewidth": 0.8, "capsize": 2})
        for y, m in zip(ys, meds):
            ax.text(m, y, f" {m:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(frameworks)), [TITLES[n] for n in frameworks])
    for tick, n in zip(ax.get_yticklabels(), frameworks):
        if n == "fitkit":
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    _log_axis(ax)
    right = max((r["q3"] for t in tables for r in t.get(key, {}).values()), default=1.0)
    left = min((r["q1"] for t in tables for r in t.get(key, {}).values()), default=1.0)
    ax.set_xlim(min(left, 1.0) * 0.8, right * 1.4)  # room for the labels
    ax.set_xlabel("time / raw loop's time (log scale; < 1 is faster; the slicing loop is the hand-written floor)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper right", framealpha=1.0)


def _log_axis(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _fixed_cost_bars(ax, tables: list[dict], env: str) -> None:
    """Milliseconds a fit call costs once, whatever its number of steps (from the one-step fits)."""
    frameworks = [n for n in TITLES if any(n in t.get("fixed_seconds", {}) for t in tables)]
    if not frameworks:
        ax.set_visible(False)
        return
    height = 0.8 / max(len(tables), 1)
    for j, t in enumerate(tables):
        values = t.get("fixed_seconds", {})
        ys = [i + (j - (len(tables) - 1) / 2) * height for i, n in enumerate(frameworks) if n in values]
        ms = [max(values[n] * 1e3, 0.01) for n in frameworks if n in values]
        ax.barh(ys, ms, height=height * 0.95, color=[COLORS.get(n, "#1f77b4") for n in frameworks if n in values])
        for y, m in zip(ys, ms):
            ax.text(m, y, f" {m:.3g}", va="center", fontsize=7)
    ax.set_yticks(range(len(frameworks)), [TITLES[n] for n in frameworks])
    ax.invert_yaxis()
    _log_axis(ax)
    ax.set_xlabel("milliseconds per fit call, whatever its length (log scale)")
    names = ", ".join(t["workload"]["name"] for t in tables)
    ax.set_title(f"fixed cost of one fit / train call ({env}, {names} workload)", fontsize=10)


def floor_rows(results: dict) -> list[dict]:
    """Rows with a target from the two-floors table (fitkit / slicing loop, per workload and
    device) and the per-call table (train_on_batch, one-step fit), in the scenarios' row form."""
    from benchmarks.common import verdict

    rows = []
    for env, tables in results.get("peers", {}).items():
        for t in tables:
            vs = t.get("vs_slice", {})
            key = "step_ratio" if "step_ratio" in vs else "whole_fit_ratio"
            target = t["workload"].get("slice_target")
            if target and "fitkit" in vs.get(key, {}):
                r = vs[key]["fitkit"]
                rows.append({"what": f"{t['workload']['name']} ({env}): fitkit / slicing loop", "ratio": r,
                             "target": target, "verdict": verdict(r, target)})
    for env, f in results.get("fixed", {}).items():
        for row in f.get("rows", []):
            if row.get("target") is not None and row.get("ratio"):
                rows.append({**row, "what": f"{row['what']} ({env})"})
    return rows


def _scenario_bars(ax, scenarios: dict, extra: list[dict] | None = None, title: str = "fitkit scenarios (CPU)",
                   left: float | None = None) -> None:
    rows = [row for s in scenarios.values() for row in s.get("rows", [])
            if row.get("target") is not None and row.get("ratio")] + list(extra or [])
    if not rows:
        ax.set_visible(False)
        return
    labels = [row["what"] for row in rows]
    meds = [row["ratio"]["median"] for row in rows]
    err = [[m - row["ratio"]["q1"] for m, row in zip(meds, rows)], [row["ratio"]["q3"] - m for m, row in zip(meds, rows)]]
    shade = {"PASS": "#2ca02c", "borderline": "#ff7f0e", "within noise": "#ff7f0e", "over": "#d62728"}
    colors = [shade.get(row.get("verdict", "PASS" if row.get("pass") else "over"), "#7f7f7f") for row in rows]
    ys = range(len(rows))
    ax.barh(ys, meds, xerr=err, color=colors, error_kw={"elinewidth": 0.8, "capsize": 2})
    for y, row, m in zip(ys, rows, meds):
        ax.plot([row["target"]] * 2, [y - 0.4, y + 0.4], color="black", linewidth=1.2)
        ax.text(max(m + err[1][y], row["target"]), y, f"  {m:.3f}", va="center", fontsize=7)
    ax.set_yticks(list(ys), [_short(s) for s in labels], fontsize=7)
    ax.invert_yaxis()
    lo = min(min(meds), *(r["target"] for r in rows))
    hi = max(max(m + e for m, e in zip(meds, err[1])), *(r["target"] for r in rows))
    ax.set_xlim(min(0.9, lo - 0.02) if left is None else left, hi + 0.08)
    ax.set_xlabel("ratio (black tick: target; green: met, orange: borderline or within noise, red: over)",
                  fontsize=8)
    ax.set_title(title, fontsize=10)


def _short(text: str) -> str:
    text = (text.replace("fitkit verbose=1 + validation / fitkit verbose=0", "verbose=1 + validation / verbose=0")
            .replace(" / raw loop", " / raw").replace("callbacks ", "cb ").replace("num_workers=", "workers=")
            .replace("default options (prefetch=True)", "defaults").replace(", per step", "")
            .replace("fitkit given the ", "fitkit(").replace("Dataset,", "Dataset),").replace("DataLoader,", "DataLoader),")
            .replace("one-step fit: ", "1-step fit: ").replace(", 32-true", ""))
    return text if len(text) <= 60 else text[:57] + "..."


def _startup_bars(ax, startup: dict) -> None:
    first = startup.get("first_step") or {}
    seconds = first.get("seconds") or {}
    if not seconds:
        ax.set_visible(False)
        return
    names = [n for n in TITLES if n in seconds]
    imported = first.get("imported_seconds", {})
    cpu = first.get("cpu_seconds", {})
    ys = range(len(names))
    ax.barh(ys, [imported.get(n, 0) for n in names], color="#c7c7c7", label="imports done")
    ax.barh(ys, [seconds[n] - imported.get(n, 0) for n in names], left=[imported.get(n, 0) for n in names],
            color=[COLORS.get(n, "#1f77b4") for n in names], label="then to the first step")
    for y, n in zip(ys, names):
        extra = f" (CPU {cpu[n]:.2f} s)" if n in cpu else ""
        ax.text(seconds[n], y, f" {seconds[n]:.2f} s{extra}", va="center", fontsize=7)
    ax.set_xlim(right=max(seconds.values()) * 1.35)
    ax.set_yticks(list(ys), [TITLES[n] for n in names])
    ax.invert_yaxis()
    ax.set_xlabel("wall seconds from process start (median of fresh processes)")
    title = "time to the first optimizer step"
    imports = startup.get("imports") or {}
    added = imports.get("added_to_torch_process", {})
    if added:
        title += f"\n`import fitkit` adds {added.get('torch + fitkit', 0):+.3f} s, `from fitkit import Model` " \
                 f"{added.get('from fitkit import Model', 0):+.3f} s to `import torch` ({imports.get('clock', 'wall')} time)"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right", framealpha=1.0)


def figure(results: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = results.get("peers", {})
    envs = list(peers)
    floors = floor_rows(results)
    panels = [("peers", e) for e in envs] + ([("floors", None)] if floors else []) + [("scenarios", None),
                                                                                     ("startup", None)]
    # The fixed cost stands out on the tiny workload (steps of ~0.1 ms); on the compute-bound
    # one it is within the noise of 30 steps of ~40 ms.
    panels += [("fixed", e) for e in envs[:1] if any("fixed_seconds" in t and t["workload"]["key"] == "tiny"
                                                     for t in peers[e])]
    cols = 2
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 4.2 * rows), squeeze=False)
    for ax, (kind, env) in zip(axes.flat, panels):
        if kind == "peers":
            tables = peers[env]
            key = "step_ratio" if all("step_ratio" in t for t in tables) else "whole_fit_ratio"
            what = "per optimizer step" if key == "step_ratio" else "per fit"
            _bars_by_framework(ax, tables, key, f"cost {what} relative to the raw loop ({env})")
        elif kind == "fixed":
            _fixed_cost_bars(ax, [t for t in peers[env] if t["workload"]["key"] == "tiny"], env)
        elif kind == "floors":
            _scenario_bars(ax, {}, floors, "targets: fitkit / the slicing loop (the floor); per-call costs", left=0.0)
        elif kind == "scenarios":
            _scenario_bars(ax, results.get("scenarios", {}))
        else:
            _startup_bars(ax, results.get("startup", {}))
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    m = results.get("meta", {})
    fig.suptitle(f"fitkit benchmarks: {m.get('processor', '?')}, {m.get('cpu_count', '?')} cores, torch {m.get('torch', '?')}, "
                 f"{m.get('torch_threads', '?')} thread; {m.get('date', '')[:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m benchmarks.plot RESULTS.json OUT.png", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        figure(json.load(f), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
