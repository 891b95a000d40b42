"""The shared plumbing of the built-in callbacks (`fitkit.callbacks._run`), driven as a callback is
outside fitkit's engine (a Trainer-like loop that passes only the documented keywords)."""

from __future__ import annotations

import types

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from fitkit import TrainerState
from fitkit.callbacks._run import epoch_steps
from fitkit.callbacks.model_checkpoint import ModelCheckpoint


class _Stream(IterableDataset):
    def __iter__(self):
        yield from range(8)


def test_epoch_steps_falls_back_on_the_loaders_length():
    # no steps_per_epoch keyword and no planned max_steps: the loader decides (it used to be None
    # always: the function called its own None parameter and the TypeError was taken for "no length")
    loader = DataLoader(TensorDataset(torch.zeros(40, 2)), batch_size=4)  # 10 batches
    args = types.SimpleNamespace(max_steps=-1, gradient_accumulation_steps=3)
    assert epoch_steps(args, TrainerState(), loader) == 4  # ceil(10 / 3) optimizer steps
    assert epoch_steps(args, TrainerState(), DataLoader(_Stream(), batch_size=2)) is None  # no length
    assert epoch_steps(args, TrainerState(), None) is None


def test_model_checkpoint_counts_an_epochs_steps_from_the_loader(tmp_path):
    loader = DataLoader(TensorDataset(torch.zeros(24, 2)), batch_size=4)  # 6 steps an epoch
    cb = ModelCheckpoint(str(tmp_path / "m.pt"), save_freq=3)
    args = types.SimpleNamespace(max_steps=-1, gradient_accumulation_steps=1, output_dir=str(tmp_path))
    cb.on_train_begin(args, TrainerState(), None, train_dataloader=loader)
    assert cb._per_epoch == 6
