"""Hugging Face's `train_sampling_strategy="group_by_length"`: an order in which each batch holds samples
of about one length, random between groups, as transformers' `LengthGroupedSampler` makes it::

    lengths = sample_lengths(dataset, column="length", input_name="input_ids")
    order = length_grouped_order(lengths, group=8, generator=None)   # None: torch's global generator

The rule (read off transformers 5.23, `trainer_pt_utils.get_length_grouped_indices`): one
`torch.randperm` of the samples from `generator`; the permutation cut into runs of `mult * group`
samples (`mult`: a quarter of the samples' batches, at most 50, at least 1); each run sorted by
length, longest first (a stable sort: equal lengths keep the permutation's order); then the
longest sample of all is swapped with the first sample of the first run, so that the batch which
would run out of memory comes first. The Trainer draws the training order from torch's global
generator (its sampler has none of its own) and each evaluation's from a new generator seeded with
`data_seed` (else `seed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

#: The most batches one run of sorted samples spans.
MAX_RUN_BATCHES = 50


def length_grouped_order(lengths: Sequence[int], group: int, generator: torch.Generator | None) -> list[int]:
    """The samples' order under "group_by_length", `group` samples a batch (the Trainer's training
    batch size times `gradient_accumulation_steps`, or its evaluation batch size)."""
    count = len(lengths)
    mult = max(min(count // (group * 4), MAX_RUN_BATCHES), 1)
    permutation = torch.randperm(count, generator=generator).tolist()
    run = mult * group
    runs = [sorted(permutation[start : start + run], key=lambda i: -lengths[i]) for start in range(0, count, run)]
    heads = [lengths[r[0]] for r in runs]
    longest = heads.index(max(heads))  # the first of equal maxima, as torch.argmax picks it
    runs[0][0], runs[longest][0] = runs[longest][0], runs[0][0]
    return [i for r in runs for i in r]


@dataclass(frozen=True)
class LengthGroups:
    """Each epoch's order of a sampler under "group_by_length": `length_grouped_order` of `lengths`
    in groups of `group`, drawn from a generator seeded with `seed` (plus the epoch with
    `per_epoch`: fitkit's own training order; without: an evaluation, the same order each pass),
    or, with `seed` None, from torch's global generator (the Trainer's training order)::

        LengthGroups([5, 2, 9], group=2, seed=7, per_epoch=False).order(0)
    """

    lengths: Sequence[int]
    group: int
    seed: int | None
    per_epoch: bool = False

    def order(self, epoch: int) -> torch.Tensor:
        generator = None
        if self.seed is not None:
            generator = torch.Generator()
            generator.manual_seed(self.seed + (epoch if self.per_epoch else 0))
        return torch.tensor(length_grouped_order(self.lengths, self.group, generator), dtype=torch.long)


def sample_lengths(dataset: Any, column: str, input_name: str | None, strategy: str = "group_by_length") -> list[int]:
    """Each sample's length, as the Trainer reads it: the `column` of a `datasets.Dataset` that
    has one (`length_column_name`), else the length of every sample's `input_name` entry (the
    processing class's first model input, `"input_ids"` without one); `strategy` names the
    strategy that asks, in the error for samples without one."""
    rows = getattr(dataset, "samples", dataset)  # a SampleList: the rows it reads
    if type(rows).__module__.startswith("datasets.") and column in getattr(rows, "column_names", ()):
        lengths = rows[column]
        return lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
    name = input_name or "input_ids"
    first = dataset[0]
    if not isinstance(first, Mapping) or name not in first:
        raise ValueError(
            f"`train_sampling_strategy`={strategy!r} needs each sample's length: the samples are not dicts "
            f"with an {name!r} entry; give a `datasets.Dataset` a {column!r} column (`length_column_name`), or "
            "pass train_sampling_strategy='random'")
    return [len(dataset[i][name]) for i in range(len(dataset))]
