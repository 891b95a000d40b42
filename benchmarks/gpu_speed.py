"""The GPU check's speed item: a GPT-2-small-shaped model built from its config (124M parameters),
bf16 mixed precision, batch 8 x 512 tokens, the same fused AdamW everywhere: fitkit's step time
against a hand loop (goal <= 1.02x), a Lightning Fabric loop and the HF Trainer, and the achieved
TFLOP/s beside the chip's bf16 peak.

Each contender trains a fresh model from the same seed on the same in-memory token batches, read
through a DataLoader (the hand and Fabric loops copy each batch to the GPU as fitkit does). The
time of `steps` steps after `warmup` steps is taken between two `torch.cuda.synchronize()` calls
made at those two step ends only (a callback for fitkit and the Trainer, inline for the loops):
no host sync per step. Contenders alternate over `reps` repetitions; medians are reported.

    record = speed_gpt2(Ctx(torch.device("cuda", 0)))   # {"ms_per_step": {...}, "ratio_vs_hand": ...}
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu_items import Ctx, Skip

#: bf16 dense peak of one H200 (SXM), NVIDIA's datasheet figure (1979 TFLOP/s is with sparsity).
PEAK_DATASHEET_TFLOPS = 989.0
#: an 8192^3 bf16 matrix product through PyTorch on this workplace's H200s (KINDS.md: 769-798).
PEAK_MEASURED_TFLOPS = 790.0


class Clock:
    """The wall time between the end of step `warmup` and the end of step `warmup + steps`,
    synchronizing the GPU at those two points only."""

    def __init__(self, warmup: int, steps: int, device: torch.device):
        self.warmup, self.steps, self.device = warmup, steps, device
        self.start = self.seconds = None  # type: float | None

    def tick(self, step: int) -> None:
        if step == self.warmup:
            self._sync()
            self.start = time.perf_counter()
        elif step == self.warmup + self.steps:
            self._sync()
            self.seconds = time.perf_counter() - self.start

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def _config(dry: bool) -> Any:
    from transformers import GPT2Config

    if dry:
        return GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=64)
    return GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)  # GPT-2 small


def _net(config: Any, device: torch.device) -> torch.nn.Module:
    """A fresh model, initialized on `device` from the same seed (on a GPU in a fraction of the
    CPU's time; every contender gets the same start)."""
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    with device:
        return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, fused=True)


def _run_fitkit(net, data, clock, ctx, batch, total) -> None:
    from fitkit import Model, TrainerCallback

    class Tick(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick(state.global_step)

    model = Model(net).compile(_optimizer, None, accelerator=ctx.device.type, devices=1, precision="bf16-mixed",
                               max_grad_norm=None)
    model.fit(data, batch_size=batch, epochs=1, max_steps=total, shuffle=False, verbose=0, callbacks=[Tick()],
              logging_steps=10**6)


def _loader(data, batch, ctx):
    return torch.utils.data.DataLoader(data, batch_size=batch, shuffle=False, pin_memory=ctx.cuda)


def _run_hand(net, data, clock, ctx, batch, total) -> None:
    net.to(ctx.device).train()
    opt = _optimizer(net.parameters())
    for step, b in enumerate(_loader(data, batch, ctx), start=1):
        b = {k: v.to(ctx.device, non_blocking=True) for k, v in b.items()}
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            loss = net(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick(step)
        if step == total:
            break


def _run_fabric(net, data, clock, ctx, batch, total) -> None:
    import lightning_fabric

    fabric = lightning_fabric.Fabric(accelerator=ctx.device.type, devices=1, precision="bf16-mixed")
    fabric.launch()
    model, opt = fabric.setup(net, _optimizer(net.parameters()))
    for step, b in enumerate(fabric.setup_dataloaders(_loader(data, batch, ctx)), start=1):
        loss = model(**b).loss
        fabric.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick(step)
        if step == total:
            break


def _run_trainer(net, data, clock, ctx, batch, total) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Tick(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.tick(state.global_step)

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(out, per_device_train_batch_size=batch, max_steps=total, bf16=True,
                                 optim="adamw_torch_fused", learning_rate=1e-4, weight_decay=0.0, max_grad_norm=0.0,
                                 lr_scheduler_type="constant", logging_strategy="no", save_strategy="no",
                                 report_to=[], use_cpu=not ctx.cuda, dataloader_pin_memory=ctx.cuda,
                                 disable_tqdm=True, seed=0)
        Trainer(model=net, args=args, train_dataset=data, callbacks=[Tick()]).train()


CONTENDERS: dict[str, Callable[..., None]] = {"hand": _run_hand, "fitkit": _run_fitkit, "fabric": _run_fabric,
                                              "hf_trainer": _run_trainer}


def _flops_per_step(params: int, config: Any, batch: int, seq: int) -> float:
    """6 x parameters per token (forward and backward matrix products; the tied LM head counted
    once, position embeddings left out: a lookup) plus attention's 12 x layers x seq x width."""
    matmul_params = params - config.n_positions * config.n_embd
    return batch * seq * (6 * matmul_params + 12 * config.n_layer * seq * config.n_embd)


def speed_gpt2(ctx: Ctx) -> dict[str, Any]:
    if not ctx.cuda and not ctx.dry:
        raise Skip("no CUDA: the speed figures are for a GPU")
    batch, seq, warmup, steps, reps = (2, 32, 1, 2, 1) if ctx.dry else (8, 512, 10, 40, 3)
    config = _config(ctx.dry)
    total = warmup + steps
    ids = torch.randint(0, config.vocab_size, (batch * total, seq), generator=torch.Generator().manual_seed(0))
    data = Tokens(ids)
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    errors: dict[str, str] = {}
    for rep in range(reps):
        names = list(CONTENDERS)[rep % len(CONTENDERS):] + list(CONTENDERS)[:rep % len(CONTENDERS)]
        for name in names:
            if name in errors:
                continue
            clock = Clock(warmup, steps, ctx.device)
            try:
                CONTENDERS[name](_net(config, ctx.device), data, clock, ctx, batch, total)
                if clock.seconds is None:
                    raise RuntimeError(f"{name} stopped before step {total}")
                times[name].append(clock.seconds / steps)
            except Exception as err:  # noqa: BLE001 - one contender's failure leaves the others' figures
                errors[name] = f"{type(err).__name__}: {err}"
            if ctx.cuda:
                torch.cuda.empty_cache()
    ms = {name: round(statistics.median(t) * 1e3, 3) for name, t in times.items() if t}
    params = sum(p.numel() for p in _net(config, torch.device("meta")).parameters())
    flops = _flops_per_step(params, config, batch, seq)
    tflops = {name: round(flops / (m / 1e3) / 1e12, 1) for name, m in ms.items()}
    ratio = {name: round(m / ms["hand"], 4) for name, m in ms.items()} if "hand" in ms else {}
    ok = "fitkit" in ratio and ratio["fitkit"] <= 1.02 and not errors
    return {"status": "pass" if ok or (ctx.dry and "fitkit" in ratio and not errors) else "fail",
            "shape": {"params_m": round(params / 1e6, 1), "batch": batch,
                      "seq": seq, "warmup": warmup, "steps": steps, "reps": reps, "precision": "bf16-mixed",
                      "optimizer": "torch.optim.AdamW(fused=True), no clipping, constant lr"},
            "ms_per_step": ms, "ratio_vs_hand": ratio, "goal": "fitkit <= 1.02 x hand", "errors": errors,
            "tflops_per_s": tflops, "flops_per_step": flops,
            "peak_tflops": {"datasheet_dense_bf16": PEAK_DATASHEET_TFLOPS, "measured_matmul": PEAK_MEASURED_TFLOPS},
            "mfu_fitkit": {k: round(tflops["fitkit"] / v, 3) for k, v in
                           (("datasheet", PEAK_DATASHEET_TFLOPS), ("measured", PEAK_MEASURED_TFLOPS))}
            if "fitkit" in tflops else None,
            "not_measured": "Keras 3 on torch: no GPT-2 port of the same model here"}

