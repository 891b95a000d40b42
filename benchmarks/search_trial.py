"""A search trial: `hyperparameter_search` against a hand-written Optuna objective doing the same
work, time per trial.

The workload is issue 39's: the digits (1,797 images of 8 x 8 pixels, shuffled once, the last
20% for validation), an MLP 64-hidden-10 whose width the trial samples (16..128), fused Adam
with a sampled learning rate, batch 64, `--epochs` epochs with training and validation loss and
accuracy every epoch, no pruning (both do every epoch). Both searches sample with the same
seeded `RandomSampler`, so trial k gets the same parameters in both. The hand objective is what
a user writes without fitkit: seed, build, per epoch a `randperm` and slices, the step, the
epoch's sums kept on the device and read once, an `inference_mode` validation pass,
`trial.report`, and the final validation accuracy returned.

Each repetition runs one search of `--trials` trials per contender, in an order alternating
from one repetition to the next; the per-repetition ratio of times per trial is what the median
is taken of (the machine's speed drifts; a repetition's two searches drift together). The ratio
of the two minima (each contender's least disturbed repetition) is printed too, as a second view
on a machine shared with other work.

    python -m benchmarks.search_trial                      # 12 trials x 4 epochs, 5 reps
    python -m benchmarks.search_trial --epochs 1 --reps 7  # trials of one epoch
    python -m benchmarks.search_trial --gc-after-trial     # fitkit with Optuna's gc_after_trial=True
    python -m benchmarks.search_trial --fixed-cost 200     # fitkit alone: a trial's fit of one batch, 200 times

`--fixed-cost N` times what a trial's `fit` costs besides its steps: N fits, each of a fresh trial
model (`for_trial`, its own `output_dir` and learning rate) on one training batch and one
validation batch of the digits, then released as the search releases it; the median CPU time per
fit of `--reps` rounds is printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

from benchmarks.common import import_fitkit, quartiles, quiet, single_thread

BATCH = 64


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return x[order], y[order]


def model_init(trial: Any) -> torch.nn.Module:
    hidden = trial.suggest_int("hidden", 16, 128) if trial is not None else 64
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def learning_rate(trial: Any) -> float:
    return trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)


def _study() -> Any:
    import optuna

    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0),
                               pruner=optuna.pruners.NopPruner())


def hand_search(x: torch.Tensor, y: torch.Tensor, trials: int, epochs: int) -> Any:
    """The hand-written objective: what the same search costs without fitkit."""
    import torch.nn.functional as F

    n_train = len(x) - int(0.2 * len(x))
    xt, yt, xv, yv = x[:n_train], y[:n_train], x[n_train:], y[n_train:]

    def objective(trial: Any) -> float:
        torch.manual_seed(42)
        net = model_init(trial)
        optimizer = torch.optim.Adam(net.parameters(), lr=learning_rate(trial), fused=True)
        accuracy = 0.0
        for epoch in range(epochs):
            net.train()
            order = torch.randperm(n_train)
            loss_sum, correct = torch.zeros(()), torch.zeros((), dtype=torch.long)
            for i in range(0, n_train, BATCH):
                idx = order[i:i + BATCH]
                xb, yb = xt[idx], yt[idx]
                out = net(xb)
                loss = F.cross_entropy(out, yb)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                loss_sum += loss.detach() * len(idx)
                correct += (out.detach().argmax(-1) == yb).sum()
            logs = {"loss": float(loss_sum) / n_train, "accuracy": int(correct) / n_train}
            net.eval()
            with torch.inference_mode():
                val_loss, val_correct = torch.zeros(()), torch.zeros((), dtype=torch.long)
                for i in range(0, len(xv), BATCH):
                    out = net(xv[i:i + BATCH])
                    val_loss += F.cross_entropy(out, yv[i:i + BATCH], reduction="sum")
                    val_correct += (out.argmax(-1) == yv[i:i + BATCH]).sum()
            accuracy = int(val_correct) / len(xv)
            logs.update(val_loss=float(val_loss) / len(xv), val_accuracy=accuracy)
            trial.report(accuracy, epoch + 1)
        return accuracy

    study = _study()
    study.optimize(objective, n_trials=trials)
    return study


def fitkit_search(x: torch.Tensor, y: torch.Tensor, trials: int, epochs: int, out: str, **options: Any) -> Any:
    fitkit = import_fitkit()

    def hp_space(trial: Any) -> dict[str, Any]:
        return {"learning_rate": learning_rate(trial)}

    study = _study()
    model = fitkit.Model(model_init=model_init).compile("adam", "cross_entropy", ["accuracy"])
    model.hyperparameter_search(x, y, validation_split=0.2, epochs=epochs, batch_size=BATCH, verbose=0,
                                hp_space=hp_space, n_trials=trials, direction="maximize", study=study,
                                compute_objective=lambda m: m["val_accuracy"], output_dir=out, **options)
    return study


def fixed_cost(x: torch.Tensor, y: torch.Tensor, fits: int, reps: int) -> list[float]:
    """CPU seconds per one-batch fit of a fresh trial model, one value per round of `fits` fits."""
    import optuna

    fitkit = import_fitkit()
    model = fitkit.Model(model_init=model_init).compile("adam", "cross_entropy", ["accuracy"])
    model.launch()
    train, val = (x[:BATCH], y[:BATCH]), (x[-BATCH:], y[-BATCH:])
    rounds = []
    with tempfile.TemporaryDirectory() as out:
        for round_ in range(reps + 1):  # the first round warms up
            start = time.process_time()
            for number in range(fits):
                trial = optuna.trial.FixedTrial({"hidden": 64}, number=number)
                trial_model = model.for_trial(trial)
                # each trial its own output_dir and learning rate, as in a search
                trial_model.fit(*train, validation_data=val, batch_size=BATCH, verbose=0,
                                output_dir=f"{out}/run-{number}", learning_rate=1e-3 * (1 + number % 10))
                trial_model.release()
            if round_:
                rounds.append((time.process_time() - start) / fits)
    return rounds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gc-after-trial", action="store_true", help="fitkit with Optuna's gc_after_trial=True")
    parser.add_argument("--fixed-cost", type=int, default=0, metavar="N",
                        help="time N one-batch fits of fresh trial models instead (fitkit alone)")
    opts = parser.parse_args(argv)
    single_thread()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x, y = digits()
    if opts.fixed_cost:
        with quiet():
            rounds = fixed_cost(x, y, opts.fixed_cost, opts.reps)
        print(f"{opts.fixed_cost} one-batch fits of fresh trial models, {opts.reps} rounds: CPU "
              f"{statistics.median(rounds) * 1e3:.2f} ms per fit (median; rounds: "
              f"{', '.join(f'{r * 1e3:.2f}' for r in rounds)})")
        return {"fixed_cost": rounds}
    options = {"gc_after_trial": True} if opts.gc_after_trial else {}
    times: dict[str, list[float]] = {"hand": [], "fitkit": []}
    cpu: dict[str, list[float]] = {"hand": [], "fitkit": []}
    with quiet(), tempfile.TemporaryDirectory() as out:
        runs = {"hand": lambda: hand_search(x, y, opts.trials, opts.epochs),
                "fitkit": lambda: fitkit_search(x, y, opts.trials, opts.epochs, out, **options)}
        for run in runs.values():  # warm-up: imports, Fabric, first-use costs
            run()
        for rep in range(opts.reps):
            for name in (("hand", "fitkit") if rep % 2 == 0 else ("fitkit", "hand")):
                start, start_cpu = time.perf_counter(), time.process_time()
                runs[name]()
                times[name].append((time.perf_counter() - start) / opts.trials)
                cpu[name].append((time.process_time() - start_cpu) / opts.trials)
    busy = sum(cpu["hand"] + cpu["fitkit"]) / sum(times["hand"] + times["fitkit"])
    print(f"{opts.trials} trials x {opts.epochs} epochs (digits, MLP 64-h-10, batch {BATCH}), {opts.reps} reps"
          f"{', fitkit with gc_after_trial=True' if opts.gc_after_trial else ''}; CPU/wall {busy:.0%} "
          "(under ~95% other processes took the core: read the CPU-time ratio)")
    result: dict[str, Any] = {"cpu_share": busy}
    for clock, table in (("wall", times), ("CPU time", cpu)):
        ratios = [f / h for f, h in zip(table["fitkit"], table["hand"])]
        low, mid, high = quartiles(ratios)
        fastest = min(table["fitkit"]) / min(table["hand"])  # each at its least disturbed repetition
        print(f"  {clock:8}: hand {statistics.median(table['hand']) * 1e3:6.1f} ms per trial, fitkit "
              f"{statistics.median(table['fitkit']) * 1e3:6.1f} ms; fitkit / hand {mid:.3f} [{low:.3f}-{high:.3f}]"
              f", of the minima {fastest:.3f}; per repetition: {', '.join(f'{r:.2f}' for r in ratios)}")
        result[clock] = {"hand": table["hand"], "fitkit": table["fitkit"], "median": mid, "q1": low, "q3": high,
                         "of_minima": fastest}
    return result


if __name__ == "__main__":
    main()
