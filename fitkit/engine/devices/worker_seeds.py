"""`DataLoader` workers seeded as Lightning Fabric seeds them, without importing Lightning.

After `seed_everything(seed, workers=True)` (its default) `PL_SEED_WORKERS` is 1, and Fabric's
`setup_dataloaders` gives each loader without a `worker_init_fn` one that seeds the worker's
torch, Python and NumPy generators from the worker's base seed, its id and the process's rank.
`LocalFabric.setup_dataloaders` gives the same one, so a loader's workers draw the same numbers
(noise, augmentations) on a one-device fitkit run as under Fabric::

    add_worker_seeding(loader, rank=0)   # when PL_SEED_WORKERS is set and the loader has none
"""

from __future__ import annotations

import os
import random
from functools import partial
from typing import Any

import torch

_MASK = (1 << 64) - 1
#: The mixing constants of MurmurHash3's 64-bit finalizer, and Knuth's MMIX multiplier.
_MIX = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
_LCG = 6364136223846793005


def add_worker_seeding(loader: Any, rank: int) -> None:
    """Give `loader` Fabric's worker seeding when `PL_SEED_WORKERS` asks for it and it has no
    `worker_init_fn` of its own (as Fabric's `setup_dataloaders` does)."""
    if not hasattr(loader, "worker_init_fn"):
        return
    if int(os.environ.get("PL_SEED_WORKERS", 0)) and loader.worker_init_fn is None:
        loader.worker_init_fn = partial(seed_worker, rank=rank)


def seed_worker(worker_id: int, rank: int | None = None) -> None:
    """Seed this `DataLoader` worker's generators from its base seed (the worker's torch seed
    less its id), its id and `rank`: torch and Python from a hashed sequence, NumPy from a
    `SeedSequence`, with Fabric's numbers."""
    rank = rank or 0
    base_seed = torch.initial_seed() - worker_id
    first, second, third, _ = seed_sequence(base_seed, worker_id, rank, count=4)
    torch.manual_seed(first)
    random.seed((second << 32) | third)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - NumPy is installed with torch's usual extras
        return
    np.random.seed(np.random.SeedSequence([base_seed, worker_id, rank]).generate_state(4))


def seed_sequence(base_seed: int, worker_id: int, rank: int, count: int) -> list[int]:
    """`count` 64-bit seeds: the three numbers packed in one, mixed by MurmurHash3's finalizer,
    then stepped by a linear congruential generator (modulo 2**64)."""
    state = (base_seed << 32) | (worker_id << 16) | rank  # up to 96 bits: the first shift reads them all
    for multiplier in _MIX:
        state = ((state ^ (state >> 33)) * multiplier) & _MASK
    state ^= state >> 33
    seeds = []
    for _ in range(count):
        state = (state * _LCG + 1) & _MASK
        seeds.append(state)
    return seeds
