"""Hugging Face's `train_sampling_strategy="batch_rebalance"`: micro-batches of varying size whose
padded cost is about even across the processes and the accumulation steps of each optimizer step,
as transformers' `BatchRebalanceSampler` makes them::

    sampler = RebalanceSampler([5, 2, 9, 4], batch_size=1, accumulation=2, seed=42)
    sampler.use_epoch(0)
    list(sampler)        # this process's micro-batches (lists of sample indices), 2 per optimizer step

The rule (read off transformers 5.23, `trainer_pt_utils.BatchRebalanceSampler`):

- an epoch's order is `torch.randperm(n)` from a generator seeded with `seed + epoch` (the Trainer
  always builds its sampler with the default seed, 42, whatever `args.seed` is); nothing is drawn
  from the global generator;
- the order is cut into steps of `E = batch_size * accumulation * processes` samples; the last,
  incomplete one is dropped with `drop_last`, else kept (and, when it has fewer samples than the
  `K = processes * accumulation` micro-batches of a step, completed with the epoch's first samples);
- a step's samples, sorted by length longest first (stable), are cut into `K` contiguous groups,
  first of equal counts (the first `n % K` one larger); the counts are then moved one sample at a
  time from the costliest group to the cheapest (the cost of `c` samples of longest length `L`:
  `c * L + 0.001 * c * L * L`), keeping the counts of the smallest spread seen, until the counts
  repeat, the costs are equal, or `max(30 K, E)` moves were tried. A costliest group down to one
  sample freezes its slot (the `processes` groups ranked with it), after filling the slot's other
  groups from the cheapest unfrozen groups while their cost stays at most the costliest one's;
- the groups ranked by cost, costliest first, are dealt slot by slot: accumulation step `k` of
  process `r` gets the group ranked `k * processes + r`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from fitkit.engine.data.sampling import process_group

#: The weight of attention's quadratic term in a micro-batch's cost.
QUADRATIC_COST = 0.001

#: The seed transformers' Trainer builds its `BatchRebalanceSampler` with (its default).
TRAINER_SEED = 42

Pair = tuple[int, int]  # (sample index, length)


def batch_cost(count: int, longest: int) -> float:
    """The cost of `count` samples padded to `longest` tokens."""
    return count * longest + QUADRATIC_COST * count * longest * longest


def _costs(pairs: Sequence[Pair], counts: Sequence[int]) -> list[float]:
    """Each contiguous group's cost; `pairs` sorted longest first, so a group's first is its longest."""
    costs, start = [], 0
    for count in counts:
        costs.append(batch_cost(count, pairs[start][1]) if count else 0.0)
        start += count
    return costs


class _Balance:
    """The search over group counts of one step (see the module's text)."""

    def __init__(self, pairs: Sequence[Pair], groups: int, slot_width: int, budget: int):
        if len(pairs) < groups:
            raise ValueError(f"`train_sampling_strategy`='batch_rebalance' needs at least {groups} samples a step (one "
                             f"per micro-batch), got {len(pairs)}: lower the batch size or gradient_accumulation_steps")
        base, extra = divmod(len(pairs), groups)
        self.pairs, self.slot_width, self.budget = pairs, slot_width, budget
        self.counts = [base + (k < extra) for k in range(groups)]
        self.frozen: set[int] = set()

    def run(self) -> list[int]:
        """The counts of the smallest spread of costs the search met."""
        counts, tried = self.counts, set()
        best, best_spread = list(counts), math.inf
        for _ in range(self.budget):
            if tuple(counts) in tried:
                break
            tried.add(tuple(counts))
            costs = _costs(self.pairs, counts)
            live = [k for k in range(len(counts)) if k not in self.frozen]
            if len(live) < 2:
                break
            top = max(live, key=costs.__getitem__)
            low = min(live, key=costs.__getitem__)
            spread = costs[top] - costs[low]
            if spread < best_spread:
                best, best_spread = list(counts), spread
            if costs[top] == costs[low]:
                break
            if counts[top] > 1:  # the cheapest live group (the first of equal costs) takes one sample
                counts[top] -= 1
                counts[low] += 1
            else:
                self._freeze_slot(top, costs)
        return best

    def _freeze_slot(self, top: int, costs: list[float]) -> None:
        """Fill the other groups of `top`'s slot from cheaper groups outside it, up to `top`'s cost, then freeze
        the slot."""
        ranked = sorted(range(len(costs)), key=costs.__getitem__, reverse=True)
        first = ranked.index(top) // self.slot_width * self.slot_width
        slot = set(ranked[first : first + self.slot_width])  # a set: its members are visited in a set's order
        counts, ceiling = self.counts, costs[top]
        for member in slot:
            if member in self.frozen or member == top:
                continue
            while True:
                start = sum(counts[:member])
                longest = self.pairs[start][1] if counts[member] else 0
                if batch_cost(counts[member] + 1, longest) > ceiling:
                    break
                donors = [k for k in range(len(counts)) if k not in self.frozen and k not in slot and counts[k] > 1]
                if not donors:
                    break
                now = _costs(self.pairs, counts)
                donor = min(donors, key=now.__getitem__)
                counts[member] += 1
                counts[donor] -= 1
        self.frozen |= slot


def rebalanced_step(indices: Sequence[int], lengths: Sequence[int], processes: int, accumulation: int,
                    budget: int) -> list[list[list[int]]]:
    """One optimizer step's samples `indices` as micro-batches: `[process][accumulation step]` -> sample
    indices. `budget`: the most moves the search tries below `30 * processes * accumulation` (the step size)."""
    groups = processes * accumulation
    pairs = sorted(((i, lengths[i]) for i in indices), key=lambda pair: pair[1], reverse=True)
    counts = _Balance(pairs, groups, processes, max(30 * groups, budget)).run()
    cut, start = [], 0
    for count in counts:
        cut.append([i for i, _ in pairs[start : start + count]])
        start += count
    costs = _costs(pairs, counts)
    ranked = sorted(range(groups), key=costs.__getitem__, reverse=True)
    return [[cut[ranked[k * processes + r]] for k in range(accumulation)] for r in range(processes)]


class RebalanceSampler(torch.utils.data.Sampler):
    """A batch sampler (a DataLoader's `batch_sampler`) yielding this process's micro-batches under
    "batch_rebalance", `accumulation` a step; the processes are read from the process group when
    iterating (none exists when it is built). `use_epoch(epoch, skip)` sets the epoch and the
    micro-batches of it to skip (a resume mid-epoch: counted in micro-batches, not samples)."""

    #: A position in the epoch is counted in this process's micro-batches (`LoaderSource`).
    counts_batches = True

    def __init__(self, lengths: Sequence[int], batch_size: int, accumulation: int, seed: int,
                 shuffle: bool = True, drop_last: bool = False):
        self.lengths = list(lengths)
        self.batch_size, self.accumulation, self.seed = batch_size, accumulation, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.epoch, self.skip = 0, 0

    def use_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def step_samples(self) -> int:
        """The samples of one optimizer step over all processes."""
        return self.batch_size * self.accumulation * process_group()[1]

    def steps(self) -> int:
        """The optimizer steps of an epoch."""
        full, rest = divmod(len(self.lengths), self.step_samples())
        return full + (1 if rest and not self.drop_last else 0)

    def __len__(self) -> int:
        return self.steps() * self.accumulation

    def consumed(self, batches: int) -> int:
        """The samples, over all processes, of an epoch's first `batches` micro-batches of each process."""
        return min(batches // self.accumulation * self.step_samples(), len(self.lengths))

    def __iter__(self) -> Iterator[list[int]]:
        rank, processes = process_group()
        size, total = self.step_samples(), len(self.lengths)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(total, generator=g).tolist()
        else:
            order = list(range(total))
        first_step, first_slot = divmod(self.skip, self.accumulation)
        for step in range(first_step, self.steps()):
            indices = order[step * size : (step + 1) * size]
            short = processes * self.accumulation - len(indices)
            if short > 0:  # a last step smaller than its micro-batches: completed with the epoch's first samples
                indices += (order * math.ceil(short / total))[:short]
            mine = rebalanced_step(indices, self.lengths, processes, self.accumulation, size)[rank]
            yield from mine[first_slot if step == first_step else 0 :]
