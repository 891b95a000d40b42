"""Step time on the task shapes of Hugging Face's example scripts: fitkit against
`transformers.Trainer` and a hand-written loop with the same collator, and evaluation with
generation against `Seq2SeqTrainer.evaluate` and a hand `generate` loop.

    python -m benchmarks.hf_tasks                    # 5 repetitions, every task
    python -m benchmarks.hf_tasks --reps 9 --tasks seq2seq --json hf_tasks.json
    python -m benchmarks.hf_tasks --clock cpu        # on a busy machine: this process's CPU time

The task shapes are those of `examples/hf/` (data and tokenizer from `examples/hf/offline.py`):
token classification (BERT, `DataCollatorForTokenClassification`, each batch padded to its own
length), causal LM (Llama on `group_texts` blocks, `default_data_collator`) and seq2seq (T5,
`DataCollatorForSeq2Seq`). Every contender trains its own copy of the same initial weights
for one epoch with fused AdamW, the linear schedule and clipping at 1.0 (the Trainer's
defaults), no logging, evaluation or checkpoints. A training step's time is the median gap
between consecutive step ends (the first step left out); the hand loop is `for batch in
DataLoader(ds, shuffle=True, collate_fn=collator)`: forward, backward, clip, step, schedule.

Method as in `benchmarks/README.md`: one process, one thread, a warm-up round, then each
repetition runs every contender once in an order rotated from one repetition to the next; the
ratios are taken within a repetition and the table gives their median and quartiles. Targets:
fitkit's step at most the Trainer's (1.00) and at most 1.05x the hand loop's.

Evaluation with generation (seq2seq): the whole `evaluate` call over the evaluation set, greedy
`generate` to `generation_max_length` and the loss per batch, generated ids padded across
batches, a corpus token accuracy; the hand loop does the same under `inference_mode` (what a
user writes) and under `no_grad` (what fitkit's `evaluate` and the Trainer run in).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.common import quartiles, quiet, single_thread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("token_classification", "causal_lm", "seq2seq")
CONTENDERS = ("fitkit", "hf_trainer", "hand_loop")
EVAL_CONTENDERS = ("fitkit", "seq2seq_trainer", "hand_generate", "hand_generate_no_grad")
TARGETS = {"fitkit/hf_trainer": 1.00, "fitkit/hand_loop": 1.05}
#: The clock of the step times: wall time, or (`--clock cpu`) this process's CPU time.
CLOCK: dict[str, Callable[[], float]] = {"now": time.perf_counter}
LR = 1e-3


@dataclass
class Size:
    """Model width and depth, batch size, and the data's `scale` (`offline.load_dataset`)."""

    width: int
    layers: int
    batch: int
    scale: int
    gen_length: int


SIZES = {"bench": Size(width=128, layers=2, batch=16, scale=5, gen_length=16),  # 30, 22 and 30 steps an epoch
         "smoke": Size(width=16, layers=1, batch=16, scale=1, gen_length=4)}  # 6, 4 and 6 steps


@dataclass
class Task:
    name: str
    train: Any  # a tokenized datasets.Dataset, model columns only
    evaluation: Any
    collator: Callable[[list], Any]
    make_net: Callable[[], torch.nn.Module]  # the same initial weights on every call


def build(name: str, size: Size) -> Task:
    """One task shape with its data, collator and tiny model."""
    sys.path.insert(0, os.path.join(ROOT, "examples", "hf"))
    try:
        import offline
    finally:
        sys.path.pop(0)
    import transformers as tf

    w, n = size.width, size.layers
    if name == "token_classification":
        tokenizer = offline.make_tokenizer("bert")

        def tag(batch: dict) -> Any:
            enc = tokenizer(batch["tokens"], is_split_into_words=True)
            enc["labels"] = [[-100 if word is None else tags[word] for word in enc.word_ids(i)]
                             for i, tags in enumerate(batch["ner_tags"])]
            return enc

        raw = offline.load_dataset("ner", size.scale)
        data = raw.map(tag, batched=True, remove_columns=raw["train"].column_names)
        config: Any = tf.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=w, num_hidden_layers=n,
                                    num_attention_heads=2, intermediate_size=2 * w, max_position_embeddings=64,
                                    num_labels=len(offline.NER_TAGS), hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)
        collator, cls = tf.DataCollatorForTokenClassification(tokenizer), tf.BertForTokenClassification
    elif name == "causal_lm":
        tokenizer, block = offline.make_tokenizer("gpt2"), 8
        raw = offline.load_dataset("text", size.scale)
        tokens = raw.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=["text"])

        def group(batch: dict) -> dict:
            joined = {k: sum(batch[k], []) for k in batch}
            total = len(joined["input_ids"]) // block * block
            out = {k: [v[i:i + block] for i in range(0, total, block)] for k, v in joined.items()}
            out["labels"] = [list(ids) for ids in out["input_ids"]]
            return out

        data = tokens.map(group, batched=True)
        config = tf.LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=w, intermediate_size=2 * w,
                                num_hidden_layers=n, num_attention_heads=2, num_key_value_heads=2,
                                max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                                eos_token_id=tokenizer.eos_token_id)
        collator, cls = tf.default_data_collator, tf.LlamaForCausalLM
    elif name == "seq2seq":
        tokenizer = offline.make_tokenizer("t5")

        def pairs(batch: dict) -> Any:
            enc = tokenizer([t["src"] for t in batch["translation"]])
            enc["labels"] = tokenizer(text_target=[t["tgt"] for t in batch["translation"]])["input_ids"]
            return enc

        raw = offline.load_dataset("translation", size.scale)
        data = raw.map(pairs, batched=True, remove_columns=["translation"])
        config = tf.T5Config(vocab_size=tokenizer.vocab_size, d_model=w, d_ff=2 * w, d_kv=w // 2, num_layers=n,
                             num_heads=2, dropout_rate=0.0, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id)
        collator, cls = tf.DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100), tf.T5ForConditionalGeneration
    else:
        raise ValueError(f"task={name!r}: use one of {', '.join(TASKS)}")
    train = data["train"].select(range(len(data["train"]) // size.batch * size.batch))  # whole batches
    if len(train) < 3 * size.batch:
        raise ValueError(f"{name}: {len(train)} samples make fewer than 3 batches of {size.batch}: raise `scale`")

    def make_net() -> torch.nn.Module:
        tf.set_seed(0)
        return cls(config)

    return Task(name, train, data["validation"], collator, make_net)


def _hf_args(out: str, size: Size, cls: Any = None, **kw: Any) -> Any:
    import transformers

    return (cls or transformers.TrainingArguments)(
        output_dir=out, per_device_train_batch_size=size.batch, per_device_eval_batch_size=size.batch,
        num_train_epochs=1, learning_rate=LR, save_strategy="no", logging_strategy="no", eval_strategy="no",
        report_to="none", disable_tqdm=True, seed=0, dataloader_pin_memory=False, **kw)


def _clocked(ends: list[float], base: type) -> Any:
    class Clocked(base):  # type: ignore[misc, valid-type]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            ends.append(CLOCK["now"]())

    return Clocked()


def run_fitkit(task: Task, size: Size, out: str) -> list[float]:
    from fitkit import Model, TrainerCallback

    ends: list[float] = []
    Model(task.make_net()).compile().fit(task.train, args=_hf_args(out, size), data_collator=task.collator, verbose=0,
                                         callbacks=[_clocked(ends, TrainerCallback)])
    return ends


def run_hf(task: Task, size: Size, out: str) -> list[float]:
    import transformers

    ends: list[float] = []
    trainer = transformers.Trainer(model=task.make_net(), args=_hf_args(out, size), train_dataset=task.train,
                                   data_collator=task.collator, callbacks=[_clocked(ends, transformers.TrainerCallback)])
    trainer.remove_callback(transformers.PrinterCallback)  # disable_tqdm's printer: no output, as fitkit's verbose=0
    trainer.train()
    return ends


def run_hand(task: Task, size: Size, out: str) -> list[float]:
    net = task.make_net()
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(task.train, batch_size=size.batch, shuffle=True, collate_fn=task.collator)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0, fused=True)
    total = len(loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, (total - step) / total))
    net.train()
    ends = []
    for batch in loader:
        net(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        ends.append(CLOCK["now"]())
    return ends


TRAINERS = {"fitkit": run_fitkit, "hf_trainer": run_hf, "hand_loop": run_hand}


def _spread(values: list[float]) -> list[float]:
    """[median, first quartile, third quartile]."""
    q1, med, q3 = quartiles(values)
    return [med, q1, q3]


def measure_training(task: Task, size: Size, reps: int, log: Callable[[str], None] = print) -> dict:
    """Interleaved repetitions of one epoch per contender: median step times and paired ratios."""
    steps: dict[str, list[float]] = {k: [] for k in CONTENDERS}
    with tempfile.TemporaryDirectory() as out:
        for name in CONTENDERS:  # warm-up: imports, allocator, first kernels
            ends = TRAINERS[name](task, size, out)
            if len(ends) != len(task.train) // size.batch:
                raise RuntimeError(f"{name} ran {len(ends)} steps, {len(task.train) // size.batch} expected")
        for rep in range(reps):
            order = CONTENDERS[rep % 3:] + CONTENDERS[:rep % 3]
            for name in order:
                ends = TRAINERS[name](task, size, out)
                steps[name].append(statistics.median(b - a for a, b in zip(ends, ends[1:])))
            log(f"{task.name} rep {rep + 1}/{reps}: " + ", ".join(f"{n} {steps[n][-1] * 1e3:.2f} ms"
                                                                   for n in CONTENDERS))
    return {"step_ms": {n: statistics.median(v) * 1e3 for n, v in steps.items()},
            "ratios": {f"fitkit/{o}": _spread([a / b for a, b in zip(steps["fitkit"], steps[o])])
                       for o in ("hf_trainer", "hand_loop")}}


# -- evaluation with generation ------------------------------------------------------------------------
def token_accuracy(eval_pred: Any) -> dict[str, float]:
    """A corpus-level value over every sample: generated tokens equal to the label at their position."""
    ids, labels = eval_pred
    width = min(ids.shape[1], labels.shape[1])
    keep = labels[:, :width] != -100
    return {"token_accuracy": float((ids[:, :width][keep] == labels[:, :width][keep]).sum() / max(keep.sum(), 1))}


def hand_generate(net: Any, task: Task, size: Size, no_grad: bool = False) -> dict[str, float]:
    """What a user writes: `inference_mode` (or, `no_grad`, what fitkit and the Trainer run
    evaluation in), per batch the loss and `generate`, the ids padded across batches with -100
    (as the Trainer pads them), then the metric."""
    import numpy as np

    net.eval()
    loader = torch.utils.data.DataLoader(task.evaluation, batch_size=size.batch, collate_fn=task.collator)
    losses, ids, labels = [], [], []
    with torch.no_grad() if no_grad else torch.inference_mode():
        for batch in loader:
            losses.append(net(**batch).loss * len(batch["input_ids"]))
            ids.append(net.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    max_length=size.gen_length, num_beams=1))
            labels.append(batch["labels"])
    width, label_width = max(t.shape[1] for t in ids), max(t.shape[1] for t in labels)
    pad = lambda ts, w: np.concatenate([torch.nn.functional.pad(t, (0, w - t.shape[1]), value=-100).numpy()  # noqa: E731
                                        for t in ts])
    metrics = token_accuracy((pad(ids, width), pad(labels, label_width)))
    metrics["loss"] = float(sum(losses) / len(task.evaluation))
    return metrics


def measure_generation(task: Task, size: Size, reps: int, log: Callable[[str], None] = print) -> dict:
    """The whole evaluation call with generation: fitkit, `Seq2SeqTrainer.evaluate`, a hand loop
    (each built untimed once; the same weights, data, collator and metric)."""
    import transformers

    from fitkit import Model

    net = task.make_net()
    with tempfile.TemporaryDirectory() as out:
        options = dict(predict_with_generate=True, generation_max_length=size.gen_length, generation_num_beams=1)
        trainer = transformers.Seq2SeqTrainer(
            model=net, args=_hf_args(out, size, transformers.Seq2SeqTrainingArguments, **options),
            data_collator=task.collator, compute_metrics=token_accuracy)
        trainer.remove_callback(transformers.PrinterCallback)
        model = Model(net).compile()
        calls = {
            "fitkit": lambda: model.evaluate(task.evaluation, batch_size=size.batch, verbose=0, return_dict=True,
                                             data_collator=task.collator, compute_metrics=token_accuracy, **options),
            "seq2seq_trainer": lambda: trainer.evaluate(task.evaluation),
            "hand_generate": lambda: hand_generate(net, task, size),
            "hand_generate_no_grad": lambda: hand_generate(net, task, size, no_grad=True),
        }
        values = {name: call() for name, call in calls.items()}  # warm-up, and the values agree
        ours, hand, theirs = values["fitkit"], values["hand_generate"], values["seq2seq_trainer"]
        # the accuracy over the Trainer's padded ids (labels padded to the generation length with the pad id)
        if abs(ours["token_accuracy"] - theirs["eval_token_accuracy"]) > 1e-6 or abs(ours["loss"] - hand["loss"]) > 1e-4:
            raise RuntimeError(f"fitkit's evaluation {ours} differs from the Trainer's {theirs} or the hand loop's {hand}")
        times: dict[str, list[float]] = {k: [] for k in EVAL_CONTENDERS}
        for rep in range(reps):
            for name in EVAL_CONTENDERS[rep % 4:] + EVAL_CONTENDERS[:rep % 4]:
                start = CLOCK["now"]()
                calls[name]()
                times[name].append(CLOCK["now"]() - start)
            log(f"generation rep {rep + 1}/{reps}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.1f} ms"
                                                                 for n in EVAL_CONTENDERS))
    return {"call_ms": {n: statistics.median(v) * 1e3 for n, v in times.items()},
            "ratios": {f"fitkit/{o}": _spread([a / b for a, b in zip(times["fitkit"], times[o])])
                       for o in EVAL_CONTENDERS[1:]}}


def measure(tasks: tuple[str, ...] = TASKS, reps: int = 5, size: str = "bench", generation: bool = True,
            log: Callable[[str], None] = print) -> dict:
    """Every task's training table, and (with `generation`) seq2seq evaluation with generation."""
    chosen, result = SIZES[size], {"size": size, "reps": reps, "training": {}}
    with quiet():
        for name in tasks:
            result["training"][name] = measure_training(build(name, chosen), chosen, reps, log)
        if generation:
            result["generation"] = measure_generation(build("seq2seq", chosen), chosen, reps, log)
    return result


def _verdict(spread: list[float], target: float) -> str:
    med, _, q3 = spread
    return "PASS" if med <= target else ("borderline" if spread[1] <= target else "over")


def table(result: dict) -> str:
    lines = ["| task | fitkit step (ms) | Trainer step (ms) | hand loop step (ms) | fitkit / Trainer [IQR] | "
             "fitkit / hand loop [IQR] | result (<= 1.00, <= 1.05) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in result["training"].items():
        ms, ratios = r["step_ms"], r["ratios"]
        cells = [f"{m:.2f} [{lo:.2f}-{hi:.2f}]" for m, lo, hi in (ratios["fitkit/hf_trainer"],
                                                                 ratios["fitkit/hand_loop"])]
        verdicts = [_verdict(ratios[k], TARGETS[k]) for k in ("fitkit/hf_trainer", "fitkit/hand_loop")]
        lines.append(f"| {name} | {ms['fitkit']:.2f} | {ms['hf_trainer']:.2f} | {ms['hand_loop']:.2f} | "
                     f"{cells[0]} | {cells[1]} | {', '.join(verdicts)} |")
    if "generation" in result:
        g = result["generation"]
        lines += ["", "| evaluation with generation (seq2seq) | fitkit (ms) | Seq2SeqTrainer (ms) | hand loop (ms) | "
                      "hand loop, no_grad (ms) | fitkit / Seq2SeqTrainer [IQR] | fitkit / hand loop [IQR] | "
                      "fitkit / hand loop, no_grad [IQR] |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        ms = g["call_ms"]
        cells = [f"{m:.2f} [{lo:.2f}-{hi:.2f}]" for m, lo, hi in (g["ratios"][f"fitkit/{o}"]
                                                                 for o in EVAL_CONTENDERS[1:])]
        lines.append("| whole `evaluate` call | " + " | ".join(f"{ms[n]:.1f}" for n in EVAL_CONTENDERS)
                     + " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(TASKS))
    parser.add_argument("--size", choices=list(SIZES), default="bench")
    parser.add_argument("--no-generation", action="store_true")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    single_thread()
    if opts.clock == "cpu":
        CLOCK["now"] = time.process_time
    tasks = tuple(t for t in opts.tasks.split(",") if t)
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"--tasks: unknown {unknown}; use {', '.join(TASKS)}")
    result = measure(tasks, opts.reps, opts.size, not opts.no_generation)
    print(table(result))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
