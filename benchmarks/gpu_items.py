"""The items of the GPU check (benchmarks/gpu_check.py) that compare fitkit with a hand loop on
one device: the first fit, mixed precision, asynchronous checkpoints, `jit_compile`. Each takes a
`Ctx` (the device, and `dry`: tiny sizes on the CPU) and returns its record; `Skip` says why an
item does not apply here. The speed and DeepSpeed items are in gpu_speed.py and gpu_deepspeed.py.

    record = amp(Ctx(torch.device("cuda", 0)), "16-mixed")   # {"status": "pass", "bitwise_weights": True, ...}
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F

from fitkit import Model


class Skip(Exception):
    """The item does not apply here; its message is the reason recorded."""


@dataclasses.dataclass
class Ctx:
    device: torch.device
    dry: bool = False
    pytest_timeout: float = 240.0
    suite: str = "devices"  # the pytest item's tests: "devices" (the files that touch devices) or "all"

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def need_cuda(self, what: str) -> None:
        if not self.cuda:
            raise Skip(f"no CUDA: {what} needs a CUDA GPU")


def mlp(width: int, depth: int = 3, classes: int = 10, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def blobs(n: int, width: int, classes: int = 10, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, width, generator=g)
    return centers[y] + torch.randn(n, width, generator=g), y


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Bit-identical or not, and the largest absolute difference (keys must match)."""
    if a.keys() != b.keys():
        return {"same_keys": False, "bitwise": False, "max_abs_diff": None}
    diffs = [(a[k] - b[k]).abs().max().item() if a[k].numel() else 0.0 for k in a]
    return {"bitwise": all(torch.equal(a[k], b[k]) for k in a), "max_abs_diff": max(diffs, default=0.0)}


def inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer under Fabric's wrapper (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def first_fit(ctx: Ctx) -> dict[str, Any]:
    """A first small fit on the device with the defaults (accelerator="auto"): does fitkit run here?"""
    x, y = blobs(256, 16)
    model = Model(mlp(16, 1)).compile("adam", "cross_entropy")
    history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    losses = history.history["loss"]
    return {"device": str(model.fabric.device), "losses": losses, "ok": bool(losses[-1] < losses[0])}


# -- mixed precision ------------------------------------------------------------------------------------
_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def amp(ctx: Ctx, precision: str) -> dict[str, Any]:
    """fitkit under `precision` against a hand-written AMP loop (autocast; a GradScaler for
    "16-mixed") with the same fused AdamW, the same start weights and the same batches."""
    if precision == "16-mixed":
        ctx.need_cuda("precision='16-mixed' (float16 with loss scaling; on the CPU fitkit uses bf16-mixed)")
    width, batch, steps = (32, 16, 4) if ctx.dry else (1024, 256, 30)
    x, y = blobs(batch * steps, width)
    net = mlp(width)
    start = copy.deepcopy(net.state_dict())
    recorded: list[torch.Tensor] = []

    def loss_fn(outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(outputs, target)
        recorded.append(loss.detach())  # a device tensor: no host read per step
        return loss

    # a torch AdamW the user builds is left as given (fitkit's "adamw" name follows Keras' epsilon)
    model = Model(net).compile(lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True),
                               loss_fn, accelerator=ctx.device.type, devices=1, precision=precision)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    fitkit_opt = inner(model.runtime.optimizer)
    hp = {k: fitkit_opt.defaults[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad")}
    hand_losses, hand = _hand_amp(start, x, y, width, batch, steps, precision, hp, ctx.device)
    fk_losses = torch.stack([t.float().cpu() for t in recorded[-steps:]])
    w = compare(weights(model.module), weights(hand))
    losses = compare({"loss": fk_losses}, {"loss": hand_losses})
    close = w["max_abs_diff"] is not None and w["max_abs_diff"] <= 1e-5 and losses["max_abs_diff"] <= 1e-5
    status = "pass" if w["bitwise"] and losses["bitwise"] else ("pass-within-tolerance" if close else "fail")
    return {"status": status, "precision": precision, "steps": steps, "batch": batch, "width": width,
            "optimizer": f"{type(fitkit_opt).__name__}(fused={fitkit_opt.defaults.get('fused')}) {hp}",
            "loss_calls": len(recorded), "weights": w, "losses": losses,
            "first_last_loss": [float(hand_losses[0]), float(hand_losses[-1])],
            "tolerance_note": "pass needs bit-identical losses and weights; pass-within-tolerance: max abs diff "
                              "<= 1e-5 (the same kernels in another order or fusion round differently)"}


def _hand_amp(start: dict, x: torch.Tensor, y: torch.Tensor, width: int, batch: int, steps: int, precision: str,
              hp: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.nn.Module]:
    net = mlp(width)
    net.load_state_dict(start)
    net.to(device)
    opt = torch.optim.AdamW(net.parameters(), fused=True, **hp)
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None
    x, y = x.to(device), y.to(device)
    losses = []
    for i in range(steps):
        xb, yb = x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]
        with torch.autocast(device.type, dtype=_DTYPES[precision]):
            out = net(xb)
        loss = F.cross_entropy(out.float(), yb)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return torch.stack([t.float().cpu() for t in losses]), net


# -- asynchronous checkpoints ---------------------------------------------------------------------------
def async_save(ctx: Ctx) -> dict[str, Any]:
    """`save_async=True` from CUDA memory: the loop's blocked time per save against synchronous
    saves (goal <= 10%), and a resume from an asynchronous checkpoint bit-identical."""
    from benchmarks.async_checkpoint import _BlockedTimer

    width, steps, every = (64, 8, 4) if ctx.dry else (2048, 40, 10)
    batch = 16 if ctx.dry else 64
    x, y = torch.randn(steps * batch, width), torch.randn(steps * batch, width)

    def fit(out: str, save_async: bool, resume: str | None = None) -> tuple[Model, list[float]]:
        torch.manual_seed(0)
        model = Model(torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])).compile(
            "adam", "mse", learning_rate=1e-4, accelerator=ctx.device.type, devices=1)
        with _BlockedTimer() as timer:
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, output_dir=out,
                      save_strategy="steps", save_steps=every, save_async=save_async, save_total_limit=None,
                      resume_from_checkpoint=resume)
        return model, timer.times

    with tempfile.TemporaryDirectory() as tmp:
        fit(os.path.join(tmp, "warm"), True)  # allocator, pinned buffers, imports
        synced, sync_times = fit(os.path.join(tmp, "sync"), False)
        whole, async_times = fit(os.path.join(tmp, "async"), True)
        resumed, _ = fit(os.path.join(tmp, "resumed"), True, os.path.join(tmp, "async", f"checkpoint-{every}"))
        same_as_sync = compare(weights(whole.module), weights(synced.module))
        resume = compare(weights(whole.module), weights(resumed.module))
    sync_ms, async_ms = statistics.median(sync_times) * 1e3, statistics.median(async_times) * 1e3
    fraction = async_ms / sync_ms if sync_ms else None
    # a dry run's saves are too small to time: there only the resume and the weights are held to
    fast = ctx.dry or (fraction is not None and fraction <= 0.10)
    ok = fast and resume["bitwise"] and same_as_sync["bitwise"]
    return {"status": "pass" if ok else "fail", "device": str(ctx.device),
            "checkpoint_mb": round(4 * width * (width + 1) * 4 * 3 / 1e6, 1), "saves": len(async_times),
            "blocked_ms_sync": round(sync_ms, 2), "blocked_ms_async": round(async_ms, 2),
            "blocked_fraction": fraction, "goal": "<= 0.10", "resume": resume, "async_vs_sync_weights": same_as_sync,
            "blocked_ms_each": {"sync": [round(t * 1e3, 2) for t in sync_times],
                                "async": [round(t * 1e3, 2) for t in async_times]}}


# -- torch.compile ---------------------------------------------------------------------------------------
def jit_compile(ctx: Ctx) -> dict[str, Any]:
    """`compile(jit_compile=True)` on CUDA against eager: losses, weights, first-fit time."""
    ctx.need_cuda("torch.compile on CUDA (a CPU compile is tests/test_jit_compile.py's)")
    width, batch, steps = 512, 128, 30
    x, y = blobs(batch * steps, width)
    runs = {}
    for jit in (False, True):
        model = Model(mlp(width)).compile("adamw", "cross_entropy", learning_rate=1e-3, accelerator="cuda",
                                          devices=1, jit_compile=jit)
        start = time.perf_counter()
        history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
        torch.cuda.synchronize()
        runs[jit] = (time.perf_counter() - start, history.history["loss"], weights(model.module))
    w = compare(runs[False][2], runs[True][2])
    eager, compiled = torch.tensor(runs[False][1]), torch.tensor(runs[True][1])
    losses = compare({"l": eager}, {"l": compiled})
    close = bool(torch.allclose(compiled, eager, rtol=1e-3, atol=0))
    return {"status": "pass" if close else "fail", "eager_fit_s": round(runs[False][0], 2),
            "compiled_fit_s_with_compile": round(runs[True][0], 2), "epoch_losses": {"eager": runs[False][1],
            "compiled": runs[True][1]}, "weights": w, "losses": losses,
            "tolerance_note": "compiled kernels fuse and reorder float32 arithmetic: epoch losses within rtol 1e-3; "
                              "the weights' difference is recorded (Adam moves a weight with a near-zero gradient by "
                              "up to its learning rate whichever way that gradient's last bits fall)"}
