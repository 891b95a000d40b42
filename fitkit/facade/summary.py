"""`Model.summary()`: layers, output shapes (when an example input is known), parameter counts.

The table is drawn with rich and returned as plain text (no colour codes); rich is imported
only when a summary is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Summary(str):
    """The summary text; shown as the table itself when echoed in a REPL or notebook.

    `rich.print(summary)` (or any rich console) draws the coloured table instead of the text.
    """

    _renderable: Any  # the rich table (None: the text is shown)

    def __new__(cls, text: str, renderable: Any = None) -> Summary:
        self = super().__new__(cls, text)
        self._renderable = renderable
        return self

    def __repr__(self) -> str:
        return str(self)

    def __reduce__(self) -> tuple[type[Summary], tuple[str]]:  # pickles and copies as the text
        return (Summary, (str(self),))

    def __rich__(self) -> Any:
        return self._renderable if self._renderable is not None else str(self)


def _shape(out: Any) -> str:
    if isinstance(out, torch.Tensor):
        return str((None, *out.shape[1:])) if out.dim() else "()"
    if isinstance(out, (tuple, list)):
        return ", ".join(_shape(o) for o in out if isinstance(o, torch.Tensor)) or "-"
    if isinstance(out, dict):
        return ", ".join(f"{k}: {_shape(v)}" for k, v in out.items() if isinstance(v, torch.Tensor)) or "-"
    return "-"


def _example_batch(example: Any) -> tuple[Any, ...] | dict[str, Any] | None:
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


def summarize(module: torch.nn.Module, example: Any = None, notes: tuple[str, ...] = ()) -> Summary:
    """Build the summary table of `module`; with `example` (a tensor, tuple or dict of inputs)
    output shapes are recorded by running it once in eval mode under `no_grad`. `notes` are
    lines shown after the totals (the optimizer, for one)."""
    shapes: dict[str, str] = {}
    batch = _example_batch(example)
    if batch is not None:
        def recorder(name: str) -> Callable[[torch.nn.Module, Any, Any], None]:
            # the hook must return None, or it replaces the output
            def hook(mod: torch.nn.Module, inputs: Any, output: Any) -> None:
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

    rows = []
    for name, sub in module.named_modules():
        if name == "":
            continue
        own = list(sub.parameters(recurse=False))
        count = sum(p.numel() for p in own)
        trainable = sum(p.numel() for p in own if p.requires_grad)
        depth = name.count(".")
        layer = "  " * depth + f"{name} ({type(sub).__name__})"
        rows.append((layer, shapes.get(name, "-"), f"{count:,}", f"{trainable:,}"))
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    totals = [f"Total params: {total:,}", f"Trainable params: {trainable:,}",
              f"Non-trainable params: {total - trainable:,}", *notes]
    title = f'Model: "{type(module).__name__}"'
    table = _table(title, rows, totals)
    return Summary(_plain_text(table), renderable=table)


def _table(title: str, rows: list[tuple[str, str, str, str]], totals: list[str]) -> Any:
    """The rich renderable: a title, the layer table, then the totals (rich imported here only)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.HEAVY_HEAD, show_lines=False, header_style="bold", pad_edge=True)
    table.add_column("Layer (type)", style="cyan", no_wrap=True)
    table.add_column("Output shape", style="green", no_wrap=True)
    table.add_column("Params", justify="right", no_wrap=True)
    table.add_column("Trainable", justify="right", no_wrap=True)
    for layer, shape, count, trainable in rows:
        table.add_row(Text(layer), Text(shape), count, trainable)  # Text: no markup in layer names
    return Group(Text(title, style="bold"), table, *(Text(line) for line in totals))


def _plain_text(renderable: Any) -> str:
    """Render to text with no colour or control codes, as wide as the table needs."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=10_000, color_system=None, force_terminal=False,
                      force_jupyter=False, force_interactive=False, no_color=True, highlight=False,
                      emoji=False, markup=False, legacy_windows=False, soft_wrap=False)
    console.print(renderable)
    lines = buffer.getvalue().splitlines()
    return "\n".join(line.rstrip() for line in lines)
