"""Joining what evaluation and prediction gather across batches and processes, padded as Hugging
Face's Trainer pads it. Batches whose tensors differ in their second dimension (a collator that
pads each batch to its own length) are padded to the longest with -100 and concatenated::

    joiner = BatchJoiner(what="predictions", every=args.eval_accumulation_steps)
    for batch in batches:
        joiner.add(logits)                     # (8, 35, 9), then (8, 36, 9), ...
    logits = gather_blocks(fabric, joiner.joined())   # (n, 36, 9): every process's rows, in order

`every` (HF's `eval_accumulation_steps`) moves what was gathered to the CPU every that many
batches, so the device holds at most that many batches of outputs; `gather_blocks` then sends
such CPU tensors between processes in chunks of rows of the same size. `concat=False` (HF's
`eval_do_concat_batches=False`) keeps one item per batch, each its own size: `gather_batches`
joins the lists of every process.
"""

from __future__ import annotations

from typing import Any

import torch

from fitkit.common.tensors import map_tensors, tensors_of

#: What pads across batches and processes (HF's `padding_index`): labels' ignore index, also for predictions.
PAD = -100


def pad_concat(parts: list, pad: int = PAD) -> Any:
    """Per-batch values (tensors, or dicts / tuples / lists of them) joined along the first
    dimension, structure kept; tensors that differ in their second dimension are first padded to
    the longest with `pad`. Other differences are refused by `BatchJoiner.add`."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return _join([p if p.dim() else p.reshape(1) for p in parts], pad)
    if isinstance(first, dict):
        return {k: pad_concat([p[k] for p in parts], pad) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(pad_concat([p[i] for p in parts], pad) for i in range(len(first)))
    return parts


def _join(tensors: list[torch.Tensor], pad: int) -> torch.Tensor:
    if len(tensors) == 1:
        return tensors[0]
    if tensors[0].dim() < 2 or all(t.shape[1] == tensors[0].shape[1] for t in tensors):
        return torch.cat(tensors)
    width = max(t.shape[1] for t in tensors)
    rows = sum(t.shape[0] for t in tensors)
    out = _full(tensors[0], (rows, width, *tensors[0].shape[2:]), pad)
    at = 0
    for t in tensors:
        out[at: at + t.shape[0], : t.shape[1]] = t
        at += t.shape[0]
    return out


def _full(like: torch.Tensor, shape: tuple, pad: int) -> torch.Tensor:
    """A tensor of `shape` filled with `pad` (False for booleans, which cannot hold -100)."""
    return like.new_full(shape, False if like.dtype == torch.bool else pad)


class BatchJoiner:
    """Collects one pass's per-batch values (detached), checks that each batch has the first's
    structure and shapes but for the first two dimensions, and joins them (`joined`). `what`
    names the values in errors; `every` (`eval_accumulation_steps`) moves them to the CPU every
    that many batches."""

    def __init__(self, what: str = "outputs", every: int | None = None, pad: int = PAD, concat: bool = True) -> None:
        self.what, self.every, self.pad, self.concat = what, every, pad, concat
        self.pending: list = []  # on their device, since the last move to the CPU
        self.moved: list = []  # chunks already on the CPU
        self.count = 0
        self._shapes: list[tuple[int, ...]] | None = None

    def __bool__(self) -> bool:
        return self.count > 0

    def add(self, value: Any) -> None:
        if not isinstance(value, torch.Tensor) or value.requires_grad:
            value = map_tensors(torch.Tensor.detach, value)
        if self.concat:
            self._check(value)
        self.pending.append(value)
        self.count += 1
        if self.every and len(self.pending) >= self.every:
            self._move()

    def _move(self) -> None:
        if self.pending and not self.concat:
            self.moved += [map_tensors(lambda t: t.cpu(), p) for p in self.pending]
            self.pending = []
        elif self.pending:
            self.moved.append(map_tensors(lambda t: t.cpu(), pad_concat(self.pending, self.pad)))
            self.pending = []

    def joined(self) -> Any:
        """Everything added, joined in order (None when nothing was); on the CPU with `every`;
        without `concat`, the list of the batches' values."""
        if not self.count:
            return None
        if not self.concat:
            if self.every:
                self._move()
                return list(self.moved)
            return list(self.pending)
        if self.every:
            self._move()
            return pad_concat(self.moved, self.pad)
        return pad_concat(self.pending, self.pad)

    def _check(self, value: Any) -> None:
        first = self._shapes
        if first is not None and len(first) == 1 and isinstance(value, torch.Tensor) \
                and value.dim() == len(first[0]) and value.shape[2:] == first[0][2:]:
            return  # one tensor a batch, as the first (no list of shapes built per batch)
        shapes = [tuple(t.shape) for t in tensors_of(value)]
        if self._shapes is None:
            self._shapes = shapes
            return
        if len(shapes) != len(self._shapes):
            raise ValueError(f"the {self.what} of batch {self.count} hold {len(shapes)} tensors, the first batch's "
                             f"{len(self._shapes)}: every batch must give the same structure of outputs")
        for i, (shape, ref) in enumerate(zip(shapes, self._shapes)):
            if len(shape) != len(ref) or shape[2:] != ref[2:]:
                where = f" (tensor {i})" if len(shapes) > 1 else ""
                raise ValueError(
                    f"the {self.what} of batch {self.count}{where} have shape {list(shape)}, the first batch's "
                    f"{list(ref)}: batches may differ only in their first dimension (the batch) and their second "
                    f"(a sequence length, padded across batches with {self.pad} as Hugging Face's Trainer does); "
                    "pad or crop the other dimensions to one size in your collator or model")


def gather_blocks(fabric: Any, value: Any, pad: int = PAD, chunk_rows: int | None = None,
                  objects: bool = False) -> Any:
    """Every process's contiguous block of `value`, joined in rank order (= input order), each
    tensor's second dimension padded with `pad` to the longest over the processes. A collective
    call: every process calls it with the same structure. With `chunk_rows`, rows travel that
    many at a time through the device and come back to the CPU (for values kept on the CPU).
    `objects` (HF's `eval_use_gather_object`): `value` travels pickled, on the CPU, as
    Accelerate's `gather_object` sends it (`torch.distributed.all_gather_object`): tensors are
    then joined as above, lists of other values (strings, ...) joined into one, in rank order."""
    if objects:
        import torch.distributed as dist

        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, map_tensors(lambda t: t.detach().cpu(), value))
        return _join_objects(everyone, pad)
    return map_tensors(lambda t: _gather_tensor(fabric, t, pad, chunk_rows), value)


def _join_objects(values: list, pad: int) -> Any:
    """The values of every process (one structure each) joined: tensors by rows, lists of
    plain values into one list, None kept."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        return _join([v if v.dim() else v.reshape(1) for v in values], pad)
    if isinstance(first, dict):
        return {k: _join_objects([v[k] for v in values], pad) for k in first}
    nested = isinstance(first, (tuple, list)) and any(isinstance(x, (torch.Tensor, dict, tuple, list)) for x in first)
    if nested:
        return type(first)(_join_objects([v[i] for v in values], pad) for i in range(len(first)))
    if isinstance(first, (tuple, list)):
        return [x for v in values for x in v]
    return None if all(v is None for v in values) else list(values)


def gather_batches(fabric: Any, parts: list, pad: int = PAD, objects: bool = False) -> list:
    """Every process's list of per-batch values (`BatchJoiner(concat=False)`), joined in rank
    order into one list, each batch with its own shape. A collective call."""
    sizes = [[n for t in tensors_of(p) for n in (t.shape[0] if t.dim() else 1, t.shape[1] if t.dim() > 1 else 0)]
             for p in parts]
    every_size = gather_blocks(fabric, torch.tensor(sizes, device=fabric.device), objects=objects).tolist()
    joined = gather_blocks(fabric, pad_concat(parts, pad), pad, objects=objects)
    starts = [0] * len(tensors_of(joined))
    out = []
    for row in every_size:
        out.append(map_tensors(_Cut(row, starts), joined))
    return out


class _Cut:
    """One batch's piece of each joined tensor, in `tensors_of` order: its rows from `starts`
    (moved on past them) and its own width (`row`: rows and width of each tensor)."""

    def __init__(self, row: list[int], starts: list[int]) -> None:
        self.row, self.starts, self.index = row, starts, 0

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        i, self.index = self.index, self.index + 1
        rows, width = self.row[2 * i], self.row[2 * i + 1]
        part = t[self.starts[i]: self.starts[i] + rows]
        self.starts[i] += rows
        return part[:, :width] if t.dim() > 1 else part


def _gather_tensor(fabric: Any, t: torch.Tensor, pad: int, chunk_rows: int | None) -> torch.Tensor:
    device = fabric.device
    t = t if t.dim() else t.reshape(1)
    width = t.shape[1] if t.dim() > 1 else 0
    sizes = fabric.all_gather(torch.tensor([t.shape[0], width], device=device)).reshape(-1, 2).tolist()
    most, widest = max(s[0] for s in sizes), max(s[1] for s in sizes)
    shape = (most, widest, *t.shape[2:]) if t.dim() > 1 else (most,)
    padded = _full(t, shape, pad)
    padded[tuple(slice(0, n) for n in t.shape[:2])] = t
    step = chunk_rows or max(most, 1)
    pieces: list[list[torch.Tensor]] = [[] for _ in sizes]
    for at in range(0, most, step):
        everyone = fabric.all_gather(padded[at: at + step].to(device))
        for r in range(len(sizes)):
            piece = everyone[r]
            pieces[r].append(piece.cpu() if chunk_rows else piece)
    blocks = [torch.cat(p)[: sizes[r][0]] if p else padded[:0] for r, p in enumerate(pieces)]
    return torch.cat(blocks)
