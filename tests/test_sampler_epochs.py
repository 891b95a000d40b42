"""A user's sampler sees exactly the `set_epoch` calls a hand loop makes: one per epoch, with the
epoch's number, on fitkit's own one-device path and through Lightning Fabric's loader wrapper
(which a one-device run uses on a GPU, and whose every pass calls `set_epoch`): fitkit's check of
the first batch before training calls none."""

import lightning_fabric
import pytest
import torch
from helpers import Pairs, blobs, mlp

from fitkit import Model, TrainerCallback


class EpochLog(torch.utils.data.Sampler):
    """A shuffling sampler whose order depends on the epoch it was told; logs each `set_epoch`."""

    def __init__(self, n):
        self.n, self.epoch, self.calls = n, 0, []

    def set_epoch(self, epoch):
        self.calls.append(epoch)
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist())

    def __len__(self):
        return self.n


def _wrapped_loader():
    """A DataLoader over an `EpochLog`, set up by a real one-device Fabric (its loader wrapper)."""
    x, y = blobs(24)
    sampler = EpochLog(24)
    fabric = lightning_fabric.Fabric(accelerator="cpu", devices=1)
    loader = fabric.setup_dataloaders(torch.utils.data.DataLoader(Pairs(x, y), batch_size=8, sampler=sampler))
    assert hasattr(loader, "_num_iter_calls")  # Fabric's wrapper, as a one-device run on a GPU gets
    return loader, sampler


def test_through_fabrics_loader_wrapper_the_sampler_sees_one_set_epoch_per_epoch():
    hand_loader, hand = _wrapped_loader()
    hand_targets = [[b[1].tolist() for b in hand_loader] for _ in range(3)]

    loader, sampler = _wrapped_loader()
    seen = []

    class Targets(TrainerCallback):
        def on_step_end(self, args, state, control, batch=None, **kwargs):
            seen.append(batch[1].tolist())

    # fitkit's first-batch checks read nothing of their own: each epoch opens the wrapper once, as a hand loop does
    Model(mlp()).compile("sgd", "cross_entropy").fit(loader, epochs=3, verbose=0, callbacks=[Targets()])
    assert hand.calls == [0, 1, 2]
    assert sampler.calls == hand.calls
    assert seen == [t for epoch in hand_targets for t in epoch]


def test_a_fit_on_a_dataloader_calls_set_epoch_once_per_epoch():
    x, y = blobs(24)
    sampler = EpochLog(24)
    loader = torch.utils.data.DataLoader(Pairs(x, y), batch_size=8, sampler=sampler)
    Model(mlp()).compile("sgd", "cross_entropy").fit(loader, epochs=3, verbose=0)
    assert sampler.calls == [0, 1, 2]


@pytest.mark.cuda
def test_a_fit_on_a_gpu_calls_set_epoch_once_per_epoch():
    """The case seen on a GPU: a one-device run reads its DataLoader through Fabric's wrapper."""
    x, y = blobs(24)
    sampler = EpochLog(24)
    loader = torch.utils.data.DataLoader(Pairs(x, y), batch_size=8, sampler=sampler)
    model = Model(mlp()).compile("sgd", "cross_entropy", accelerator="cuda", devices=1)
    model.fit(loader, epochs=3, verbose=0)
    assert sampler.calls == [0, 1, 2]
