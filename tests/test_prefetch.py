"""Reading batches ahead (`prefetch`, on by default): a map-style Dataset read with
`num_workers=0` has its next batches read by a "fitkit-prefetch" thread while a step runs. The
batches, the losses and the weights are those of `prefetch=False`, bit for bit, also with
dropout drawing on the training thread; a Dataset that draws random numbers itself is read on
the training thread (the rule that keeps runs exact); errors surface from `fit` at their batch;
no thread outlives the run.
"""

import functools
import random
import sys
import threading
import time

import numpy as np
import pytest
import torch
from helpers import Crash, Pairs, blobs, mlp, training_records

from fitkit import Model, TrainerCallback, TrainingArguments
from fitkit.engine.checkpoint import listing
from fitkit.engine.data.prefetch import MIN_READ_S, MIN_STEP_S

assert 8 * 0.0002 > MIN_READ_S  # the batches of `Seen` are worth reading ahead

THREAD = "fitkit-prefetch"


class Seen(torch.utils.data.Dataset):
    """Pairs that record the index and the thread of every read; `draw` names a global generator
    each read draws from (augmentation), `fail_at` an index whose read raises `Boom`. A read
    takes at least 0.2 ms, so a batch of 8 takes longer than `MIN_READ_S`: a batch read
    quicker stays on the training thread."""

    def __init__(self, x, y, draw=None, fail_at=None):
        self.x, self.y, self.draw, self.fail_at = x, y, draw, fail_at
        self.indices, self.threads = [], []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.indices.append(i)
        self.threads.append(threading.current_thread().name)
        time.sleep(0.0002)
        if i == self.fail_at:
            raise Boom(f"bad sample {i}")
        x = self.x[i]
        if self.draw == "torch":
            x = x + 0.1 * torch.randn(x.shape)
        elif self.draw == "random":
            x = x * random.uniform(0.9, 1.1)
        elif self.draw == "numpy":
            x = x * float(np.random.uniform(0.9, 1.1))
        return x, self.y[i]


class Boom(Exception):
    pass


class Batches(TrainerCallback):
    """The batches the loop trained on, in order, and the last step reached."""

    def __init__(self):
        self.seen, self.step = [], 0

    def on_step_end(self, args, state, control, batch=None, **kwargs):
        self.seen.append(batch[0].clone())
        self.step = state.global_step


def _alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == THREAD]


def _fit(data, prefetch, callbacks=(), model=None, **options):
    model = model or Model(mlp(hidden=32, dropout=0.3)).compile("adam", "cross_entropy", ["accuracy"],
                                                                learning_rate=1e-2)
    options = {"epochs": 2, "batch_size": 8, "seed": 3, "verbose": 0, "logging_strategy": "steps",
               "logging_steps": 1, **options}
    model.fit(data, prefetch=prefetch, callbacks=list(callbacks), **options)
    return model


def _same_run(a: Model, b: Model) -> None:
    assert training_records(a.state.log_history) == training_records(b.state.log_history)
    assert a.history.history == b.history.history
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(p, q)


def test_same_batches_losses_and_weights_with_dropout_and_the_reads_move_to_the_thread():
    x, y = blobs(96)
    runs = {}
    for prefetch in (True, False):
        train, val, seen = Seen(x, y), Seen(x[:40], y[:40]), Batches()
        model = _fit(train, prefetch, [seen], validation_data=val)  # shuffled by fitkit's sampler
        runs[prefetch] = model, train, val, seen
    (on, train_on, val_on, seen_on), (off, train_off, val_off, seen_off) = runs[True], runs[False]
    _same_run(on, off)
    assert len(seen_on.seen) == len(seen_off.seen) == 24
    assert all(torch.equal(a, b) for a, b in zip(seen_on.seen, seen_off.seen))  # same batches, same order
    assert train_on.indices == train_off.indices and sorted(train_on.indices[-96:]) == list(range(96))
    assert set(train_off.threads) == set(val_off.threads) == {"MainThread"}
    # the first two batches of each pass are read on the training thread, the rest ahead
    assert train_on.threads.count(THREAD) >= len(train_on.threads) * 2 // 3
    assert val_on.indices == val_off.indices  # (read ahead only after a step of MIN_STEP_S: see below)
    assert _alive() == []


def test_a_shuffling_dataloader_of_yours_is_read_ahead_and_exact():
    # RandomSampler seeds itself from the global generator at the first batch: not a Dataset's draw
    x, y = blobs(96)
    runs = {}
    for prefetch in (True, False):
        data = Seen(x, y)
        torch.manual_seed(11)
        loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
        runs[prefetch] = _fit(loader, prefetch), data
    (on, data_on), (off, data_off) = runs[True], runs[False]
    _same_run(on, off)
    assert data_on.indices == data_off.indices
    assert THREAD in data_on.threads


@pytest.mark.parametrize("draw", ["torch", "random", "numpy"])
def test_a_dataset_drawing_random_numbers_is_read_on_the_training_thread(draw):
    x, y = blobs(96)
    runs = {}
    for prefetch in (True, False):
        random.seed(5)
        np.random.seed(5)
        data = Seen(x, y, draw=draw)
        runs[prefetch] = _fit(data, prefetch), data
    (on, data_on), (off, _) = runs[True], runs[False]
    _same_run(on, off)  # augmentation and dropout drew the same numbers
    assert set(data_on.threads) == {"MainThread"}


class _SlowForward(torch.nn.Module):
    """`net` whose forward takes at least `MIN_STEP_S` (as a large model's does)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        time.sleep(2 * MIN_STEP_S)
        return self.net(x)


@pytest.mark.parametrize("slow", [True, False])
def test_evaluate_and_predict_read_ahead_when_the_step_hides_a_read_and_give_the_same_values(slow, monkeypatch):
    """An evaluation or prediction pass reads ahead only when the step on its second batch took
    `MIN_STEP_S` or more: a quick forward hides less than the handoff costs, as in a hand loop."""
    if not slow:  # however busy the machine, the quick step stays under the bar
        monkeypatch.setattr("fitkit.engine.data.adapt.MIN_STEP_S", 60.0)
    x, y = blobs(64)
    trained = _fit(Pairs(x, y), False, epochs=1).module
    model = Model(_SlowForward(trained) if slow else trained)
    results = {}
    for prefetch in (True, False):
        model.compile("adam", "cross_entropy", ["accuracy"], prefetch=prefetch)
        data = Seen(x, y)
        results[prefetch] = model.evaluate(data, batch_size=8, verbose=0), model.predict(data, batch_size=8), data
    assert results[True][0] == results[False][0]
    assert torch.equal(results[True][1], results[False][1])
    assert set(results[False][2].threads) == {"MainThread"}
    assert (THREAD in results[True][2].threads) is slow
    assert _alive() == []


@pytest.mark.parametrize("prefetch", [True, False])
def test_an_error_in_getitem_surfaces_from_fit_at_its_batch(prefetch):
    x, y = blobs(96)
    data, steps = Seen(x, y, fail_at=53), Batches()  # sample 53 is in batch 7 (samples 48..55)
    with pytest.raises(Boom, match="bad sample 53") as info:
        _fit(data, prefetch, [steps], shuffle=False)
    assert steps.step == 6  # the six batches before it trained, not the seventh
    assert "__getitem__" in [entry.name for entry in info.traceback]  # the reading frames are kept
    assert data.threads[-1] == (THREAD if prefetch else "MainThread")
    if prefetch and sys.version_info >= (3, 11):
        assert THREAD in " ".join(info.value.__notes__)  # the message says where it was raised
    assert _alive() == []


class _StopAt(TrainerCallback):
    def __init__(self, step, crash=False):
        self.step, self.crash = step, crash

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            if self.crash:
                raise Crash(f"crash at step {self.step}")
            control.should_training_stop = True



@pytest.mark.parametrize("stop", [{"max_steps": 3}, {"steps_per_epoch": 3}, {"callbacks": [_StopAt(4)]},
                                  {"validation_steps": 1}])
def test_no_thread_outlives_a_run_stopped_mid_epoch(stop):
    x, y = blobs(96)
    data = Seen(x, y)
    _fit(data, True, validation_data=Seen(x[:40], y[:40]), **stop)
    assert THREAD in data.threads
    assert _alive() == []


def test_no_thread_outlives_an_error_in_a_step_while_its_traceback_is_kept():
    x, y = blobs(96)
    with pytest.raises(Crash) as info:
        _fit(Seen(x, y), True, [_StopAt(3, crash=True)])
    assert info.value.__traceback__ is not None  # the frames that held the batches are alive
    assert _alive() == []


def _resumable(out, seed=0, callbacks=(), **options):
    x, y = blobs(96)
    model = Model(mlp(hidden=32, seed=seed, dropout=0.3)).compile("adam", "cross_entropy", ["accuracy"],
                                                                  learning_rate=1e-2, gradient_accumulation_steps=2)
    return _fit(Seen(x, y), True, callbacks, model=model, epochs=3, output_dir=str(out), save_strategy="steps",
                save_steps=4, seed=7, validation_data=Seen(x[:20], y[:20]), **options)


def test_a_mid_epoch_resume_with_prefetch_equals_the_uninterrupted_run(tmp_path):
    full = _resumable(tmp_path / "full")
    with pytest.raises(Crash):
        _resumable(tmp_path / "cut", callbacks=[_StopAt(10, crash=True)])
    assert listing.list_checkpoints(str(tmp_path / "cut"))[-1].endswith("-8")  # step 8: inside epoch 2
    resumed = _resumable(tmp_path / "cut", seed=99, resume_from_checkpoint=True)
    assert resumed.state.global_step == full.state.global_step == 18
    _same_run(resumed, full)
    assert _alive() == []


def test_prefetch_must_be_a_bool():
    with pytest.raises(ValueError, match="`prefetch`='yes' is invalid"):
        TrainingArguments(prefetch="yes")
    x, y = blobs(16)
    with pytest.raises(ValueError, match="prefetch"):
        Model(mlp(hidden=32, dropout=0.3)).compile("adam", "cross_entropy").fit(Pairs(x, y), prefetch="yes", verbose=0)
    assert TrainingArguments().prefetch is True and TrainingArguments(prefetch=False).prefetch is False


def test_hugging_face_collators_are_read_on_the_training_thread():
    # their padding is GIL-bound Python: a reading thread slows the step (docs/benchmarks.md)
    transformers = pytest.importorskip("transformers")
    from torch.utils.data import DataLoader

    from fitkit.engine.data.prefetch import can_prefetch

    data = [{"input_ids": [1, 2, 3], "labels": 0}] * 4
    hf = transformers.DataCollatorWithPadding.__new__(transformers.DataCollatorWithPadding)
    assert not can_prefetch(DataLoader(data, batch_size=2, collate_fn=hf))
    # HF's collating functions too, and fitkit's own collation of dict samples, which does what theirs does
    from fitkit.engine.data.collate import default_data_collator

    for function in (transformers.default_data_collator, default_data_collator,
                     functools.partial(transformers.default_data_collator, return_tensors="pt")):
        assert not can_prefetch(DataLoader(data, batch_size=2, collate_fn=function))
    assert can_prefetch(DataLoader(data, batch_size=2))  # torch's default collation still reads ahead
    assert can_prefetch(DataLoader(data, batch_size=2, collate_fn=lambda items: items))
