"""Fine-tuning a small BERT on a tokenized `datasets.Dataset` with a padding collator: fitkit, the
Hugging Face Trainer and a hand-written loop, with the same collator, optimizer (AdamW, fused),
clipping and data, interleaved in one process (each repetition runs the three in turn, the order
rotating).

    python -m benchmarks.hf_finetune                 # 5 repetitions of one epoch (40 steps), 3 fresh processes each
    python -m benchmarks.hf_finetune --reps 9 --cold-reps 5 --json hf.json
    python -m benchmarks.hf_finetune --clock cpu     # on a busy machine: this process's CPU time

Per contender: the median time of a training step (between consecutive step ends, the first
step left out) and the time from the call that trains (`Trainer(...)` + `train()`, `Model(...)`
+ `compile()` + `fit()`, the hand loop's optimizer and DataLoader) to the first step's start,
warm (in the interleaved process, after a warm-up round) and in a fresh process (`--cold-reps`).
Nothing is downloaded: the tokenizer is trained in-process (`examples/text_classification.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The clock of the step times: wall time, or (`--clock cpu`, on a busy machine) this process's
#: CPU time over all its threads, which other processes' load does not inflate.
CLOCK = {"now": time.perf_counter}
STEPS_PER_EPOCH = 40
BATCH = 16


def _setup():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import datasets
    import transformers
    from text_classification import make_texts, make_tokenizer

    texts, labels = make_texts(STEPS_PER_EPOCH * BATCH, seed=1)
    tokenizer = make_tokenizer(texts)
    ds = datasets.Dataset.from_dict({"text": texts, "label": labels, "idx": list(range(len(texts)))})
    ds = ds.map(lambda b: tokenizer(b["text"], truncation=True), batched=True)
    config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=256, max_position_embeddings=64,
                                     num_labels=2)
    collator = transformers.DataCollatorWithPadding(tokenizer)
    return ds, config, collator, tokenizer


class _Clock:
    """Step start and end times, from the callback events (HF's and fitkit's share them)."""

    def __init__(self):
        self.begins, self.ends = [], []

    def on_step_begin(self, *a, **k):
        self.begins.append(CLOCK["now"]())

    def on_step_end(self, *a, **k):
        self.ends.append(CLOCK["now"]())


def _callback(clock: _Clock, base: type):
    class Clocked(base):
        def on_step_begin(self, args, state, control, **kw):
            clock.on_step_begin()

        def on_step_end(self, args, state, control, **kw):
            clock.on_step_end()

    return Clocked()


def _hf_args(out: str):
    import transformers

    return transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, num_train_epochs=1,
                                          learning_rate=1e-4, save_strategy="no", logging_strategy="epoch",
                                          report_to="none", disable_tqdm=True, seed=0, dataloader_pin_memory=False)


def run_hf(ds, config, collator, out: str) -> tuple[float, list[float]]:
    import transformers

    clock = _Clock()
    transformers.set_seed(0)
    net = transformers.BertForSequenceClassification(config)
    t0 = CLOCK["now"]()
    trainer = transformers.Trainer(model=net, args=_hf_args(out), train_dataset=ds, data_collator=collator,
                                   callbacks=[_callback(clock, transformers.TrainerCallback)])
    trainer.train()
    return clock.begins[0] - t0, clock.ends


def run_fitkit(ds, config, collator, out: str) -> tuple[float, list[float]]:
    import transformers

    from fitkit import Model, TrainerCallback

    clock = _Clock()
    transformers.set_seed(0)
    net = transformers.BertForSequenceClassification(config)
    t0 = CLOCK["now"]()
    Model(net).compile().fit(ds, args=_hf_args(out), data_collator=collator, verbose=0,
                             callbacks=[_callback(clock, TrainerCallback)])
    return clock.begins[0] - t0, clock.ends


def run_hand(ds, config, collator, out: str) -> tuple[float, list[float]]:
    import transformers

    transformers.set_seed(0)
    net = transformers.BertForSequenceClassification(config)
    t0 = CLOCK["now"]()
    data = ds.remove_columns(["text", "idx"])
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=collator)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)
    net.train()
    first, ends = None, []
    for batch in loader:
        if first is None:
            first = CLOCK["now"]() - t0
        loss = net(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(CLOCK["now"]())
    return first, ends


CONTENDERS = {"fitkit": run_fitkit, "hf_trainer": run_hf, "hand_loop": run_hand}


def measure(reps: int = 5, log=print) -> dict:
    """Interleaved repetitions; per contender the median step time and time to the first step."""
    import tempfile

    ds, config, collator, _ = _setup()
    steps: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    firsts: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    names = list(CONTENDERS)
    with tempfile.TemporaryDirectory() as out:
        for run in CONTENDERS.values():  # warm-up: imports, allocator, first kernels (fresh-process: `cold`)
            run(ds, config, collator, out)
        for rep in range(reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                first, ends = CONTENDERS[name](ds, config, collator, out)
                gaps = [b - a for a, b in zip(ends, ends[1:])]
                steps[name].append(statistics.median(gaps))
                firsts[name].append(first)
            log(f"rep {rep + 1}/{reps}: " + ", ".join(f"{n} {steps[n][-1] * 1e3:.2f} ms" for n in names))
    result: dict = {n: {"step_ms": statistics.median(steps[n]) * 1e3, "first_step_s": statistics.median(firsts[n])}
                    for n in names}
    # ratios taken within each repetition (the contenders drift together), then their median and quartiles
    result["ratios"] = {f"fitkit/{other}": _spread([a / b for a, b in zip(steps["fitkit"], steps[other])])
                        for other in ("hf_trainer", "hand_loop")}
    result["ratios"]["first step fitkit/hf_trainer"] = _spread(
        [a / b for a, b in zip(firsts["fitkit"], firsts["hf_trainer"])])
    return result


def _spread(values: list[float]) -> list[float]:
    """[median, first quartile, third quartile]."""
    if len(values) < 2:
        return [values[0]] * 3
    q = statistics.quantiles(values, n=4)
    return [statistics.median(values), q[0], q[2]]


def cold(reps: int = 3, log=print, clock: str = "wall") -> dict[str, float]:
    """The time from the training call to the first step in a fresh process (the script's imports
    of transformers, datasets and fitkit done, nothing run yet), the median over `reps` processes
    per contender, interleaved: what a script pays once, imports done inside the call included."""
    import subprocess

    times: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for rep in range(reps):
        for name in CONTENDERS:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.hf_finetune", "--one", name, "--clock", clock],
                                  cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-2000:])
            times[name].append(json.loads(proc.stdout.strip().splitlines()[-1])["first_step_s"])
        log(f"cold {rep + 1}/{reps}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in CONTENDERS))
    return {n: statistics.median(v) for n, v in times.items()}


def _one(name: str) -> None:
    """One contender in this (fresh) process: prints {"first_step_s": ...}."""
    import tempfile

    import transformers  # noqa: F401 - a script's imports, before the call

    import fitkit  # noqa: F401

    ds, config, collator, _ = _setup()
    with tempfile.TemporaryDirectory() as out:
        first, _ = CONTENDERS[name](ds, config, collator, out)
    print(json.dumps({"first_step_s": first}))


def table(r: dict) -> str:
    lines = ["| contender | median step (ms) | call to first step, warm (s) | call to first step, fresh process (s) |",
             "| --- | ---: | ---: | ---: |"]
    for name in CONTENDERS:
        cold_s = f"{r['cold'][name]:.2f}" if "cold" in r else "-"
        lines.append(f"| {name} | {r[name]['step_ms']:.2f} | {r[name]['first_step_s']:.3f} | {cold_s} |")
    lines.append("")
    for key, (med, lo, hi) in r["ratios"].items():
        lines.append(f"- {key}, per repetition: {med:.3f} [{lo:.3f}-{hi:.3f}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cold-reps", type=int, default=3, help="fresh processes per contender (0: none)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    torch.set_num_threads(opts.threads)
    if opts.clock == "cpu":
        CLOCK["now"] = time.process_time
    if opts.one:
        _one(opts.one)
        return 0
    result = measure(opts.reps)
    if opts.cold_reps:
        result["cold"] = cold(opts.cold_reps, clock=opts.clock)
    print(table(result))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
