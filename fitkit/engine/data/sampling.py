"""Which samples each process reads, in which order: the arithmetic of epochs, shards and resumes.

    order = epoch_permutation(100, seed=42, epoch=3)       # any epoch's order, rebuilt at will
    deal(order, skip=40, rank=1, world_size=2)             # rank 1's share of the rest
    resume_batch(100, samples=40, batch_size=8, world_size=2, batches=7)   # 3: where to go on
    block(10, rank=2, world_size=3)                        # (7, 10): an evaluation block

Nothing here touches the global random generators.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from fitkit.engine.data.length_groups import LengthGroups
from fitkit.engine.data.trainer_order import deal_batches, drawn_permutation, samples_per_process


def epoch_permutation(size: int, seed: int | None, epoch: int) -> torch.Tensor:
    """The shuffled order of epoch `epoch`: a permutation drawn from its own generator seeded
    with `seed + epoch`, so any epoch's order can be rebuilt (a resume) and the global RNG is
    never touched."""
    g = torch.Generator()
    g.manual_seed((seed or 0) + epoch)
    return torch.randperm(size, generator=g)


def deal(order: torch.Tensor, skip: int, rank: int, world_size: int, pad: bool = True) -> torch.Tensor:
    """`rank`'s share of an epoch's `order` from global sample `skip` on: the rest dealt round
    robin, as DistributedSampler deals, and (`pad`) made a multiple of `world_size` with the
    order's first samples, so every process makes as many steps. From `skip=0` this is
    DistributedSampler's share; from a resume point it is the rest of the same order, whatever
    the number of processes now."""
    rest = order[skip:]
    if world_size == 1:
        return rest
    extra = (-len(rest)) % world_size if pad else 0
    if extra:
        rest = torch.cat([rest, order.repeat(math.ceil(extra / len(order)))[:extra]])
    return rest[rank::world_size]


def resume_batch(total: int, samples: int, batch_size: int, world_size: int, batches: int,
                 drop_last: bool = False) -> int:
    """The number, in an epoch of `batches` micro-batches per process, of the batch at which an
    epoch of `total` samples continues after `samples` of them (over all processes): the
    batches left are those the rest makes when dealt to `world_size` processes."""
    left = math.ceil((total - samples) / world_size)
    left_batches = left // batch_size if drop_last else math.ceil(left / batch_size)
    return max(batches - left_batches, 0)


def process_group() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def block(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """The contiguous `[start, end)` of `total` samples that `rank` evaluates (no padding)."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class BlockSampler(torch.utils.data.Sampler):
    """Evaluation under several processes: this rank's contiguous block, nothing repeated; of
    `order` when given (an evaluation grouped by length), else of the samples in their order."""

    def __init__(self, size: int, rank: int, world_size: int, order: list[int] | None = None):
        self.start, self.end = block(size, rank, world_size)
        self.order = order

    def __len__(self) -> int:
        return self.end - self.start

    def __iter__(self) -> Iterator[int]:
        if self.order is not None:
            return iter(self.order[self.start : self.end])
        return iter(range(self.start, self.end))


class EpochSampler(torch.utils.data.DistributedSampler):
    """The sampler fitkit builds for a map-style Dataset: a permutation seeded by `seed + epoch`,
    so any epoch's order can be rebuilt, and `skip` drops its first samples (a resume mid-epoch
    starts at the right sample without loading the ones before it). Under several processes it
    deals the order itself (`deal`), as DistributedSampler does; being one, Fabric keeps it. The
    processes are read from the process group when iterating: none exists when it is built.
    With `per_batch` (a batch size: `data_order="trainer"`), the processes get whole batches in
    turn, as the Hugging Face Trainer's accelerate deals them (`fitkit.engine.data.trainer_order`)."""

    def __init__(self, size: int, shuffle: bool, seed: int | None,
                 per_batch: int | None = None):  # no super().__init__: see above
        self.size, self.shuffle = size, shuffle
        self.seed = seed  # type: ignore[assignment]  # DistributedSampler's is an int; None here seeds 0
        self.per_batch = per_batch
        self.epoch = 0
        self.skip = 0  # samples of the epoch's order, over all processes
        self.drop_last = False
        #: `even_batches` (dealt batches): the last round completed with the epoch's first samples
        self.even = True
        #: `use_seedable_sampler=False`: each epoch's order drawn from torch's global generator
        self.drawn = False
        #: "group_by_length": each epoch's order grouped by the samples' lengths (None: random or sequential)
        self.groups: LengthGroups | None = None

    @property
    def rank(self) -> int:  # type: ignore[override]
        return process_group()[0]

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        return process_group()[1]

    def use_epoch(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        world_size = self.num_replicas
        if self.per_batch is not None and world_size > 1:
            return samples_per_process(self.size, self.per_batch, world_size, self.rank, self.drop_last, self.even)
        return math.ceil(self.size / world_size)

    def __iter__(self) -> Iterator[int]:
        if self.groups is not None:
            order = self.groups.order(self.epoch)
        elif self.shuffle and self.drawn:
            order = drawn_permutation(self.size)
        elif self.shuffle:
            order = epoch_permutation(self.size, self.seed, self.epoch)
        else:
            order = torch.arange(self.size)
        rank, world_size = process_group()
        if self.per_batch is not None:
            return iter(deal_batches(order, self.skip, rank, world_size, self.per_batch, self.drop_last,
                                     self.even).tolist())
        return iter(deal(order, self.skip, rank, world_size).tolist())
