"""The Hugging Face Trainer's data order (`data_order="trainer"`): the batches each process reads and the numbers
its data loading draws from torch's global generator.

`fit(args=transformers.TrainingArguments(...))` turns it on. Rebuilt here without importing transformers or
accelerate (read off transformers 5.23 and accelerate 1.15)::

    deal_batches(order, skip=0, rank=1, world_size=2, batch_size=4)   # rank 1's samples, batch after batch
    batches_per_process(10, batch_size=4, world_size=2)               # 2
    draw_as_a_loader()                                                 # the draw a new DataLoader iterator makes

What the Trainer does, and fitkit under `data_order="trainer"` with it:

- the order of epoch `e` is `torch.randperm(n)` from a generator seeded with `data_seed + e` (`seed + e`
  without `data_seed`): accelerate's `SeedableRandomSampler`, which draws nothing from the global generator
  (fitkit's `epoch_permutation` is the same permutation);
- each new iterator of a `DataLoader` without a generator of its own (the Trainer's training loader, and the
  loader of each evaluation and prediction) draws one number from torch's global generator (the base seed of
  its workers), before the first batch: fitkit builds its loaders without a generator of their own too, and
  in-memory data draws the same number (`draw_as_a_loader`), so dropout draws the same masks after;
- on several processes, accelerate's `BatchSamplerShard` deals whole batches round robin (rank `r` takes
  batches `r`, `r + W`, ...) and completes the last round with the epoch's first samples (`deal_batches`),
  where fitkit's own way deals samples as `DistributedSampler` does; HF's `accelerator_config` changes
  it as Accelerate does: `split_batches` (each process's batch the batch size over the processes, the
  same per-process batches), `even_batches=False` (the last round left incomplete), and
  `use_seedable_sampler=False` (each epoch's order from a seed drawn from the global generator,
  `drawn_permutation`);
- worker processes are seeded by `seed_worker` (the Trainer's rule).
"""

from __future__ import annotations

import math

import torch


def draw_as_a_loader() -> None:
    """Draw the one number from torch's global generator that creating an iterator of a `DataLoader`
    without a generator of its own draws (torch's `_BaseDataLoaderIter`: its workers' base seed)."""
    torch.empty((), dtype=torch.int64).random_()


def batches_per_process(total: int, batch_size: int, world_size: int, drop_last: bool = False) -> int:
    """The batches each process reads from `total` samples dealt batch by batch (`BatchSamplerShard`)."""
    batches = total // batch_size if drop_last else math.ceil(total / batch_size)
    return batches // world_size if drop_last else math.ceil(batches / world_size)


def samples_per_process(total: int, batch_size: int, world_size: int, rank: int, drop_last: bool = False,
                        even: bool = True) -> int:
    """The samples `rank` reads of `total` dealt batch by batch (`deal_batches`)."""
    if even or drop_last:
        return batches_per_process(total, batch_size, world_size, drop_last) * batch_size
    rounds = total // batch_size // world_size
    first = (rounds * world_size + rank) * batch_size  # its batch of the incomplete last round, if any
    return rounds * batch_size + max(min(batch_size, total - first), 0)


def deal_batches(order: torch.Tensor, skip: int, rank: int, world_size: int, batch_size: int,
                 drop_last: bool = False, even: bool = True) -> torch.Tensor:
    """`rank`'s samples of an epoch's `order` from global sample `skip` on, batch after batch, as
    accelerate's `BatchSamplerShard` deals the batches of `order` to `world_size` processes: batch
    `i` goes to rank `i % world_size`; the last round of batches is completed with the first
    samples of the epoch, so every rank reads as many full batches (`drop_last`: the incomplete
    round is dropped instead; not `even` (`even_batches=False`): each rank reads what the round
    holds for it, an incomplete batch or none). With `split_batches=True` Accelerate splits each
    batch of `world_size * batch_size` samples into these same per-rank batches."""
    rest = order[skip:]
    if world_size == 1:
        return rest
    ids = rest.tolist()
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    rounds = sum(len(b) == batch_size for b in batches) // world_size  # rounds whose batches are all full
    mine = [batches[k * world_size + rank] for k in range(rounds)]
    leftover = batches[rounds * world_size :]
    if leftover and not drop_last and not even:
        mine += leftover[rank : rank + 1]
    elif leftover and not drop_last:
        # the epoch's first `world_size` batches, repeated while shorter than one round
        first = order[: world_size * batch_size].tolist()
        while len(first) < world_size * batch_size:
            first += first
        cycle = 0
        for index in range(world_size):
            batch = list(leftover[index]) if index < len(leftover) else []
            end = cycle + batch_size - len(batch)
            if index == rank:
                mine.append(batch + first[cycle:end])
            cycle = end
    return torch.tensor([i for batch in mine for i in batch], dtype=torch.long)


def drawn_permutation(size: int) -> torch.Tensor:
    """An epoch's order as a `RandomSampler` without a generator draws it (`use_seedable_sampler=False`):
    its seed drawn from torch's global generator, then a permutation from a generator of that seed."""
    generator = torch.Generator()
    generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return torch.randperm(size, generator=generator)


def seed_worker(worker_id: int, num_workers: int, rank: int) -> None:
    """A `DataLoader` worker's seeds as the Trainer sets them (its `worker_init_fn`): Python's,
    NumPy's and torch's generators seeded with the worker's torch seed plus `num_workers * rank`."""
    from fitkit.engine.data.rng import seed_everything

    seed_everything(torch.initial_seed() % 2**32 + num_workers * rank)
