"""HF's `train_sampling_strategy="batch_rebalance"` beside the real Trainer: the same micro-batches of varying
size (recorded at each forward), the same logged losses and final weights with gradient accumulation; the
order equal to transformers' own `BatchRebalanceSampler`'s; a resume mid-epoch; the same refusals."""


import pytest
import torch
from test_hf_sampling import N, hf_args, pad, recorded_bert, rows, two_process_runs

from fitkit import Model, TrainingArguments
from fitkit.engine.data import rebalance
from fitkit.engine.data.rebalance import RebalanceSampler

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

LOGGED = ("loss", "grad_norm", "learning_rate", "epoch")


def rebalance_args(tmp_path, **kw):
    options = dict(train_sampling_strategy="batch_rebalance", per_device_train_batch_size=3,
                   gradient_accumulation_steps=2, eval_strategy="no", logging_steps=1)
    return hf_args(tmp_path, **{**options, **kw})


@pytest.mark.parametrize("remove_unused_columns, drop_last", [(True, False), (False, False), (True, True)],
                         ids=["column-dropped", "column-kept", "drop-last"])
def test_batch_rebalance_gives_the_trainers_micro_batches_losses_and_weights(tmp_path, remove_unused_columns,
                                                                             drop_last):
    # the `length` column dropped (not a forward argument): the lengths are the tokens'; kept: the column's
    args = rebalance_args(tmp_path, remove_unused_columns=remove_unused_columns, dataloader_drop_last=drop_last)
    theirs, their_seen = recorded_bert()
    trainer = transformers.Trainer(model=theirs, args=args, train_dataset=rows(N), data_collator=pad)
    trainer.train()
    ours, our_seen = recorded_bert()
    model = Model(ours).compile()
    model.fit(rows(N), args=args, data_collator=pad)
    assert our_seen["train"] == their_seen["train"]
    # 40 samples, 6 a step: 6 full steps and (unless dropped) a 7th of the last 4 samples, 2 micro-batches each
    steps = 6 if drop_last else 7
    assert len(our_seen["train"]) == 2 * 2 * steps
    assert len({len(batch) for batch in our_seen["train"]}) > 1  # micro-batches of varying size
    epoch = sum(our_seen["train"][: 2 * steps], [])
    assert len(epoch) == len(set(epoch)) == (36 if drop_last else N)  # each sample once an epoch
    assert our_seen["train"][: 2 * steps] != our_seen["train"][2 * steps :]  # each epoch its own order
    their_logs = [r for r in trainer.state.log_history if "loss" in r]
    our_logs = [r for r in model.state.log_history if "loss" in r]
    assert len(our_logs) == len(their_logs) == 2 * steps
    for mine, other in zip(our_logs, their_logs):
        for key in LOGGED:
            assert mine[key] == pytest.approx(other[key], abs=1e-5), key
    for (name, mine), other in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(mine, other, atol=1e-5), name


def lm_rows(n):
    """`n` token sequences of 2 to 10 tokens (unpadded: the collator pads each micro-batch)."""
    ids = [[1 + (i * 5 + k) % 30 for k in range(2 + (i * 7) % 9)] for i in range(n)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})


def pad_lm(samples):
    """Pads with token 0, label -100 and mask 0: the micro-batches of a window hold different numbers of label
    tokens."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    labels = torch.full((len(samples), width), -100)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
        labels[row, : len(sample["labels"])] = torch.tensor(sample["labels"])
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}


def test_a_causal_lm_divides_each_rebalanced_window_by_its_label_tokens_as_the_trainer(tmp_path):
    from test_hf_token_loss import tiny_gpt2  # its forward takes `num_items_in_batch`: the Trainer counts tokens

    args = rebalance_args(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3)
    theirs, ours = tiny_gpt2(), tiny_gpt2()
    trainer = transformers.Trainer(model=theirs, args=args, train_dataset=lm_rows(26), data_collator=pad_lm)
    trainer.train()
    model = Model(ours).compile()
    model.fit(lm_rows(26), args=args, data_collator=pad_lm)
    their_logs = [r for r in trainer.state.log_history if "loss" in r]
    our_logs = [r for r in model.state.log_history if "loss" in r]
    assert len(our_logs) == len(their_logs) == 2 * 5  # 26 samples, 6 a step: 4 full steps and one of 2
    for mine, other in zip(our_logs, their_logs):
        for key in LOGGED:
            assert mine[key] == pytest.approx(other[key], abs=1e-5), key
    for (name, mine), other in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(mine, other, atol=1e-5), name


def spread_lengths(count):
    """Mostly short samples and a few very long ones: the long ones' micro-batches shrink to one sample,
    which freezes their slot."""
    return [400 + i if i % 11 == 3 else 1 + (i * 7) % 13 for i in range(count)]


@pytest.mark.parametrize("count, batch, accum, processes, drop_last", [
    (40, 3, 2, 1, False), (40, 3, 2, 1, True), (57, 4, 3, 2, False), (9, 2, 2, 3, False), (100, 8, 1, 4, False),
    (33, 5, 4, 1, False), (37, 3, 2, 2, False), (2, 1, 3, 2, False)])
def test_the_rebalanced_order_is_transformers_own(monkeypatch, count, batch, accum, processes, drop_last):
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    for lengths in ([(i * 37) % 11 + 1 for i in range(count)], spread_lengths(count)):
        for rank in range(processes):
            monkeypatch.setattr(rebalance, "process_group", lambda rank=rank: (rank, processes))
            ours = RebalanceSampler(lengths, batch, accum, seed=42, drop_last=drop_last)
            theirs = BatchRebalanceSampler(lengths, batch * accum * processes, processes, accum, rank=rank,
                                           drop_last=drop_last)
            for epoch in (0, 1):
                ours.use_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs), (rank, epoch)
            assert len(ours) == len(theirs)
            ours.use_epoch(1, skip=3)  # a resume: the epoch's micro-batches from the 4th on
            assert list(ours) == list(theirs)[3:]


def test_fitkits_own_order_rebalances_without_drawing_from_the_global_generator():
    from fitkit.engine.data.adapt import adapt

    args = TrainingArguments(train_sampling_strategy="batch_rebalance", gradient_accumulation_steps=2, verbose=0)
    source, _ = adapt(rows(N), batch_size=3, shuffle=True, seed=1, args=args, training=True)
    sampler = source.sampler
    state = torch.get_rng_state()
    orders = []
    for epoch in (0, 0, 1):
        sampler.use_epoch(epoch)
        orders.append(list(sampler))
    assert torch.equal(torch.get_rng_state(), state)  # its own generator, seeded with the order's seed + epoch
    assert orders[0] == orders[1] != orders[2]
    expected = RebalanceSampler(rows(N)["length"], 3, 2, seed=1)  # the `length` column: no columns dropped here
    assert orders[0] == list(expected)
    assert source.consumed(0, 4) == 12 and source.consumed(0, 14) == N  # samples: 6 a step, at most the epoch's


def test_a_keras_style_fit_trains_on_the_rebalanced_micro_batches():
    net, seen = recorded_bert()
    history = Model(net).compile(optimizer="adam").fit(
        rows(N), batch_size=3, gradient_accumulation_steps=2, train_sampling_strategy="batch_rebalance",
        data_collator=pad, epochs=2, seed=5, verbose=0)
    expected = RebalanceSampler([len(ids) for ids in rows(N)["input_ids"]], 3, 2, seed=5)  # `length` dropped
    for epoch in (0, 1):
        expected.use_epoch(epoch)
        assert seen["train"][14 * epoch : 14 * (epoch + 1)] == list(expected), epoch
    assert len(history.history["loss"]) == 2


def test_a_resume_mid_epoch_reads_the_rest_of_the_rebalanced_micro_batches(tmp_path):
    whole, seen = recorded_bert()
    Model(whole).compile().fit(rows(N), args=rebalance_args(tmp_path, save_strategy="steps", save_steps=10),
                               data_collator=pad)
    resumed, resumed_seen = recorded_bert()
    Model(resumed).compile().fit(rows(N), args=rebalance_args(tmp_path), data_collator=pad,
                                 resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-10"))  # inside epoch 1
    assert resumed_seen["train"] == seen["train"][20:]  # 2 micro-batches a step
    for (name, mine), other in zip(resumed.named_parameters(), whole.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name


def test_data_without_lengths_is_refused_as_the_trainer_refuses_it(tmp_path):
    unlengthed = [{"x": [1, 2], "labels": 0}] * 8
    net, _ = recorded_bert()
    with pytest.raises(ValueError, match="infer lengths"):
        transformers.Trainer(model=net, args=rebalance_args(tmp_path, remove_unused_columns=False),
                             train_dataset=unlengthed).train()
    with pytest.raises(ValueError, match="`train_sampling_strategy`='batch_rebalance' needs each sample's length.*"
                                         "'input_ids' entry"):
        Model(net).compile().fit(unlengthed, verbose=0, remove_unused_columns=False,
                                 train_sampling_strategy="batch_rebalance")
    with pytest.raises(ValueError, match="'batch_rebalance' batches the samples of a Dataset by length.*arrays"):
        Model(torch.nn.Linear(2, 1)).compile(loss="mse").fit(torch.zeros(4, 2), torch.zeros(4, 1), verbose=0,
                                                             train_sampling_strategy="batch_rebalance")


@pytest.mark.slow
def test_two_processes_read_the_trainers_rebalanced_micro_batches(tmp_path):
    runs = two_process_runs(tmp_path, "batch_rebalance")
    train = [runs["trainer", rank]["batches"] for rank in (0, 1)]  # the training forwards' sample ids
    assert train[0] != train[1] and len({len(b) for b in train[0] + train[1]}) > 1
    assert sorted(sum(train[0][:4] + train[1][:4], [])) == list(range(13))  # an epoch: each sample once
