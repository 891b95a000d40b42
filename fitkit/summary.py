"""`Model.summary()`: layers, output shapes (when an example input is known), parameter counts."""

from __future__ import annotations

from typing import Any

import torch


class Summary(str):
    """The summary text; shown as the table itself when echoed in a REPL or notebook."""

    def __repr__(self) -> str:
        return str(self)


def _shape(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return str((None, *out.shape[1:])) if out.dim() else "()"
    if isinstance(out, (tuple, list)):
        return ", ".join(_shape(o) for o in out if isinstance(o, torch.Tensor)) or "-"
    if isinstance(out, dict):
        return ", ".join(f"{k}: {_shape(v)}" for k, v in out.items() if isinstance(v, torch.Tensor)) or "-"
    return "-"


def _example_batch(example: Any) -> tuple | dict | None:
    take = lambda t: t[:2] if isinstance(t, torch.Tensor) and t.dim() else t  # noqa: E731
    if example is None:
        return None
    if isinstance(example, torch.Tensor):
        return (take(example),)
    if isinstance(example, dict):
        return {k: take(v) for k, v in example.items()}
    if isinstance(example, (tuple, list)):
        return tuple(take(t) for t in example)
    return None


def summarize(module: torch.nn.Module, example: Any = None) -> Summary:
    """Build the summary table of `module`; with `example` (a tensor, tuple or dict of inputs)
    output shapes are recorded by running it once in eval mode under `no_grad`."""
    shapes: dict[str, str] = {}
    batch = _example_batch(example)
    if batch is not None:
        def recorder(name: str):
            def hook(mod, inputs, output) -> None:  # must return None, or it replaces the output
                shapes.setdefault(name, _shape(output))

            return hook

        hooks = [sub.register_forward_hook(recorder(name)) for name, sub in module.named_modules()]
        was_training = module.training
        try:
            device = next((p.device for p in module.parameters()), torch.device("cpu"))
            move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
            module.eval()
            with torch.no_grad():
                if isinstance(batch, dict):
                    module(**{k: move(v) for k, v in batch.items()})
                else:
                    module(*(move(t) for t in batch))
        except Exception:  # noqa: BLE001 - shapes are best effort; the counts never depend on them
            shapes.clear()
        finally:
            module.train(was_training)
            for h in hooks:
                h.remove()

    rows = [("Layer (type)", "Output shape", "Params", "Trainable")]
    for name, sub in module.named_modules():
        if name == "":
            continue
        own = list(sub.parameters(recurse=False))
        count = sum(p.numel() for p in own)
        trainable = sum(p.numel() for p in own if p.requires_grad)
        depth = name.count(".")
        rows.append(("  " * depth + f"{name} ({type(sub).__name__})", shapes.get(name, "-"), f"{count:,}", f"{trainable:,}"))
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    line = "-" * (sum(widths) + 6)
    fmt = lambda r: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    body = [f'Model: "{type(module).__name__}"', line, fmt(rows[0]), line, *(fmt(r) for r in rows[1:]), line,
            f"Total params: {total:,}", f"Trainable params: {trainable:,}", f"Non-trainable params: {total - trainable:,}"]
    return Summary("\n".join(body))
