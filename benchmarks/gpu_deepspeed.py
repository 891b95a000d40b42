"""The GPU check's DeepSpeed items (ZeRO stages 1, 2 and 3 on one GPU): a fit, a checkpoint at
the end of the first epoch, a resume from it that must end on the first run's weights bit for bit;
and `model_init` under `zero.Init` (Fabric's `init_module(empty_init=True)` under stage 3), so no
process holds the whole module. Skipped, with the reason, where deepspeed does not import.

    record = deepspeed_stage(Ctx(torch.device("cuda", 0)), 3)
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from benchmarks.gpu_items import Ctx, Skip, blobs, compare, mlp
from fitkit import Model

WIDTH, BATCH, STEPS_PER_EPOCH = 256, 32, 8


def _deepspeed(ctx: Ctx) -> Any:
    ctx.need_cuda("DeepSpeed")
    try:
        import deepspeed
    except Exception as err:  # any import failure (missing, or its ops' set-up) is a skip reason
        raise Skip(f"deepspeed is not importable here ({type(err).__name__}: {err}); carry its wheel "
                   "(benchmarks/gpu_wheels.sh)") from err
    return deepspeed


def full_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, gathered first where ZeRO-3 partitioned them."""
    params = list(module.parameters())
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            return {n: p.detach().float().cpu().clone() for n, p in module.named_parameters()}
    return {n: p.detach().float().cpu().clone() for n, p in module.named_parameters()}


def _compiled(stage: int, model: Model) -> Model:
    return model.compile("adamw", "cross_entropy", learning_rate=1e-3, accelerator="cuda", devices=1,
                         strategy=f"deepspeed_stage_{stage}", precision="bf16-mixed")


def deepspeed_stage(ctx: Ctx, stage: int) -> dict[str, Any]:
    ds = _deepspeed(ctx)
    x, y = blobs(BATCH * STEPS_PER_EPOCH, WIDTH)

    def fit(out: str, resume: str | None = None) -> tuple[Model, list[float]]:
        model = _compiled(stage, Model(mlp(WIDTH)))
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, output_dir=out,
                            save_strategy="epoch", resume_from_checkpoint=resume)
        return model, history.history["loss"]

    with tempfile.TemporaryDirectory() as tmp:
        whole, losses = fit(os.path.join(tmp, "whole"))
        checkpoint = os.path.join(tmp, "whole", f"checkpoint-{STEPS_PER_EPOCH}")
        files = sorted(os.listdir(checkpoint))
        first = full_weights(whole.module)
        resumed, resumed_losses = fit(os.path.join(tmp, "resumed"), resume=checkpoint)
        same = compare(first, full_weights(resumed.module))
    learned = losses[-1] < losses[0]
    return {"status": "pass" if same["bitwise"] and learned else "fail", "deepspeed": ds.__version__,
            "strategy": f"deepspeed_stage_{stage}", "epoch_losses": losses, "resumed_losses": resumed_losses,
            "checkpoint_files": files[:20], "resume_vs_uninterrupted": same, "learned": learned}


def zero3_model_init(ctx: Ctx) -> dict[str, Any]:
    """Whether `model_init` runs under `zero.Init` (each parameter partitioned as it is built):
    through Fabric's own `init_module(empty_init=True)`, and through fitkit's `Model(model_init=...)`."""
    _deepspeed(ctx)
    import lightning_fabric

    seen: dict[str, Any] = {}

    def make() -> torch.nn.Module:
        net = mlp(WIDTH)
        seen["under_zero_init"] = all(hasattr(p, "ds_id") for p in net.parameters())
        seen["local_numel"] = sum(p.numel() for p in net.parameters())
        return net

    fabric = lightning_fabric.Fabric(accelerator="cuda", devices=1, strategy="deepspeed_stage_3",
                                     precision="bf16-mixed")
    fabric.launch()
    with fabric.init_module(empty_init=True):
        make()
    through_fabric = dict(seen)
    seen.clear()
    x, y = blobs(BATCH * 4, WIDTH)
    model = _compiled(3, Model(model_init=make))
    losses = model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0).history["loss"]
    through_fitkit = dict(seen)
    full = sum(p.numel() for p in mlp(WIDTH).parameters())
    return {"status": "pass" if through_fitkit.get("under_zero_init") else "fail", "parameters": full,
            "fabric_init_module": through_fabric, "fitkit_model_init": through_fitkit, "fitkit_losses": losses,
            "note": "under zero.Init each parameter holds only its partition as it is built (local_numel 0 on "
                    "the meta placeholders); fitkit defers model_init to the strategy for strategy='fsdp' "
                    "(fitkit/facade/model_init.py deferred_module)"}
