"""HF's `train_sampling_strategy` and `length_column_name` beside the real Trainer: the same batches
in training (recorded at each forward), in each evaluation and in prediction, and, with dropout on,
the same weights (the grouped training order is drawn from torch's global generator, as the Trainer
draws it)."""


import pytest
import torch
from helpers import torchrun

from fitkit import Model, TrainingArguments
from fitkit.engine.data.length_groups import length_grouped_order

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

N, EVAL_N = 40, 10


def rows(n, offset=0):
    """Sample `i` starts with token `5 + i` (a batch tells its samples) and is 2 to 11 tokens long;
    its `length` column holds another length than its tokens (reversed), to tell where a length came from."""
    lengths = [2 + (i * 7 + offset) % 10 for i in range(n)]
    ids = [[5 + i] + [3 + (i + k) % 4 for k in range(length - 1)] for i, length in enumerate(lengths)]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": [i % 2 for i in range(n)],
                                       "length": [13 - length for length in lengths]})


def pad(samples):
    """Pads `input_ids` with 0 (and masks it); the `length` column, when kept, is not given to the model."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros(len(samples), width, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
        mask[row, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([s["labels"] for s in samples])}


def recorded_bert():
    """A one-layer BERT classifier, dropout on, the same weights at each call, and the lists its
    training and its evaluation forwards append their batches' sample ids to."""
    transformers.set_seed(0)
    cfg = transformers.BertConfig(vocab_size=N + 8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                  hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    net = transformers.BertForSequenceClassification(cfg)
    net.accepts_loss_kwargs = False  # the Trainer then divides the loss by the accumulated steps, as fitkit does
    seen = {"train": [], "eval": []}

    def hook(module, args, kwargs):
        seen["train" if module.training else "eval"].append((kwargs["input_ids"][:, 0] - 5).tolist())

    net.register_forward_pre_hook(hook, with_kwargs=True)
    return net, seen


def hf_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, save_strategy="no",
                num_train_epochs=2, per_device_train_batch_size=4,
                per_device_eval_batch_size=3, eval_strategy="epoch", learning_rate=1e-2, seed=3,
                dataloader_pin_memory=False, use_cpu=True)
    return transformers.TrainingArguments(**{**base, **kw})


def both_runs(args):
    """The Trainer's and fitkit's (seen batches, model, predictions) for `args`."""
    theirs, their_seen = recorded_bert()
    trainer = transformers.Trainer(model=theirs, args=args, train_dataset=rows(N), eval_dataset=rows(EVAL_N, 3),
                                   data_collator=pad)
    trainer.train()
    their_predictions = trainer.predict(rows(EVAL_N, 3)).predictions
    ours, our_seen = recorded_bert()
    model = Model(ours).compile()
    model.fit(rows(N), args=args, validation_data=rows(EVAL_N, 3), data_collator=pad)
    our_predictions = model.hf_predict(rows(EVAL_N, 3)).predictions
    return (their_seen, theirs, their_predictions), (our_seen, ours, our_predictions)


def assert_same_runs(theirs, ours):
    (their_seen, their_net, their_predictions), (our_seen, our_net, our_predictions) = theirs, ours
    assert our_seen == their_seen
    assert our_predictions == pytest.approx(their_predictions, abs=1e-5)
    for (name, mine), other in zip(our_net.named_parameters(), their_net.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name


def token_lengths(batch):
    return [len(rows(N)["input_ids"][i]) for i in batch]


@pytest.mark.parametrize("remove_unused_columns", [True, False], ids=["column-dropped", "column-kept"])
def test_group_by_length_gives_the_trainers_batches_in_training_evaluation_and_prediction(tmp_path,
                                                                                            remove_unused_columns):
    # with the `length` column dropped (not a forward argument) the lengths are the tokens'; kept, the column's
    args = hf_args(tmp_path, train_sampling_strategy="group_by_length", length_column_name="length",
                   remove_unused_columns=remove_unused_columns)
    theirs, ours = both_runs(args)
    assert_same_runs(theirs, ours)
    seen = ours[0]
    assert len(seen["train"]) == 2 * N // 4 and seen["train"][:10] != seen["train"][10:]  # each epoch its own order
    # the batches are sorted by the lengths in use, longest first: the tokens', or the column's (13 - tokens), but
    # for the one that gave its first sample for the longest, which starts the epoch
    sign = 1 if remove_unused_columns else -1
    spans = [[sign * n for n in token_lengths(batch)] for batch in seen["train"][:10]]
    assert sum(s != sorted(s, reverse=True) for s in spans) <= 1
    assert spans[0][0] == max(max(s) for s in spans)
    assert seen["eval"][:4] == seen["eval"][4:8]  # every evaluation reads the same grouped order
    assert sorted(sum(seen["eval"][:4], [])) == list(range(EVAL_N)) and seen["eval"][0] != [0, 1, 2]


def test_a_group_spans_the_batches_of_one_optimizer_step(tmp_path):
    args = hf_args(tmp_path, train_sampling_strategy="group_by_length", per_device_train_batch_size=2,
                   gradient_accumulation_steps=2, eval_strategy="no", num_train_epochs=1)
    theirs, their_seen = recorded_bert()
    transformers.Trainer(model=theirs, args=args, train_dataset=rows(N), data_collator=pad).train()
    ours, our_seen = recorded_bert()
    Model(ours).compile().fit(rows(N), args=args, data_collator=pad)
    assert our_seen["train"] == their_seen["train"]
    for (name, mine), other in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name
    steps = [token_lengths(our_seen["train"][k] + our_seen["train"][k + 1]) for k in range(0, 20, 2)]
    assert sum(s != sorted(s, reverse=True) for s in steps) <= 1  # each step's two batches sorted as one group


def test_the_length_column_is_read_by_its_name(tmp_path):
    named = rows(N).rename_column("length", "size")
    options = dict(train_sampling_strategy="group_by_length", remove_unused_columns=False, num_train_epochs=1,
                   eval_strategy="no")
    args = hf_args(tmp_path, length_column_name="size", **options)
    orders = []
    for column in ("size", "length"):  # another name: no such column, the tokens' lengths
        net, seen = recorded_bert()
        Model(net).compile().fit(named, args=hf_args(tmp_path, length_column_name=column, **options),
                                 data_collator=pad)
        orders.append(seen["train"])
    theirs, their_seen = recorded_bert()
    transformers.Trainer(model=theirs, args=args, train_dataset=named, data_collator=pad).train()
    assert orders[0] == their_seen["train"]
    assert orders[0] != orders[1]


def test_sequential_reads_the_data_in_its_order(tmp_path):
    args = hf_args(tmp_path, train_sampling_strategy="sequential")
    theirs, ours = both_runs(args)
    assert_same_runs(theirs, ours)
    assert ours[0]["train"][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ours[0]["train"][:10] == ours[0]["train"][10:]


@pytest.mark.parametrize("count, group", [(40, 4), (9, 2), (300, 3), (7, 8), (64, 1)])
def test_the_grouped_order_is_transformers_own(count, group):
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = [(i * 37) % 11 for i in range(count)]  # many ties: the sort must be stable as theirs
    for seed in range(3):
        expected = get_length_grouped_indices(lengths, group, generator=torch.Generator().manual_seed(seed))
        assert length_grouped_order(lengths, group, torch.Generator().manual_seed(seed)) == expected
    torch.manual_seed(5)
    expected = get_length_grouped_indices(lengths, group)  # no generator: torch's global one
    torch.manual_seed(5)
    assert length_grouped_order(lengths, group, None) == expected


def test_fitkits_own_order_groups_by_length_without_drawing_from_the_global_generator():
    from fitkit.engine.data.adapt import adapt

    args = TrainingArguments(train_sampling_strategy="group_by_length", verbose=0)
    source, _ = adapt(rows(N), batch_size=4, shuffle=True, seed=1, args=args, training=True)
    sampler = source.sampler
    state = torch.get_rng_state()
    orders = []
    for epoch in (0, 0, 1):
        sampler.use_epoch(epoch)
        orders.append(list(sampler))
    assert torch.equal(torch.get_rng_state(), state)  # drawn from its own generator, seeded with seed + epoch
    assert orders[0] == orders[1] != orders[2]
    lengths = rows(N)["length"]  # its `length` column (not a Trainer run: no columns dropped)
    assert orders[0] == length_grouped_order(lengths, 4, torch.Generator().manual_seed(1))


def test_sampling_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="`train_sampling_strategy`='by_length' is invalid"):
        TrainingArguments(train_sampling_strategy="by_length")
    with pytest.raises(ValueError, match="`length_column_name`"):
        TrainingArguments(length_column_name="")
    net, _ = recorded_bert()
    with pytest.raises(ValueError, match="group_by_length.*arrays"):
        Model(torch.nn.Linear(2, 1)).compile(loss="mse").fit(torch.zeros(4, 2), torch.zeros(4, 1), verbose=0,
                                                             train_sampling_strategy="group_by_length")
    with pytest.raises(ValueError, match="'input_ids' entry"):
        Model(net).compile().fit([{"x": [1, 2], "labels": 0}] * 4, verbose=0, remove_unused_columns=False,
                                 train_sampling_strategy="group_by_length")


def test_every_strategy_is_honoured_from_hf_arguments(tmp_path):
    import warnings

    from fitkit.config.hf_arguments import from_hf

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = from_hf(hf_args(tmp_path, train_sampling_strategy="batch_rebalance"))
    assert not [w for w in caught if "train_sampling_strategy" in str(w.message)]
    assert ours.train_sampling_strategy == "batch_rebalance"  # tests/test_hf_batch_rebalance.py
    assert from_hf(hf_args(tmp_path, train_sampling_strategy="sequential")).train_sampling_strategy == "sequential"


def test_evaluation_on_several_processes_splits_the_grouped_order_in_blocks():
    from fitkit.engine.data.adapt import adapt
    from fitkit.engine.data.loader_parts import evaluation_shard

    args = TrainingArguments(train_sampling_strategy="group_by_length", seed=4, verbose=0, data_collator=pad)
    source, _ = adapt(rows(EVAL_N), batch_size=3, shuffle=False, args=args)
    whole = list(source.loader.sampler)
    assert whole == length_grouped_order(rows(EVAL_N)["length"], 3, torch.Generator().manual_seed(4))
    blocks = [list(evaluation_shard(source.loader, rank, 2).sampler) for rank in (0, 1)]
    assert blocks == [whole[:5], whole[5:]]  # each sample once, gathered in the grouped order


def two_process_runs(tmp_path, strategy):
    """tests/scripts/hf_sampling_ddp.py with `strategy` on two processes, the Trainer and fitkit:
    each rank's recorded batches, weights and losses equal; {(form, rank): run}."""
    torchrun("hf_sampling_ddp.py", tmp_path, strategy)
    runs = {(form, rank): torch.load(tmp_path / f"{form}-{rank}.pt", weights_only=True)
            for form in ("trainer", "fitkit") for rank in (0, 1)}
    for rank in (0, 1):
        theirs, ours = runs["trainer", rank], runs["fitkit", rank]
        assert ours["batches"] == theirs["batches"], rank
        for name, value in ours["weights"].items():
            assert torch.allclose(value, theirs["weights"][name], atol=1e-5), (rank, name)
        assert [r.get("loss") for r in ours["log_history"]] == pytest.approx(
            [r.get("loss") for r in theirs["log_history"]], abs=1e-5)
    return runs


@pytest.mark.slow
def test_two_processes_read_the_trainers_grouped_batches(tmp_path):
    runs = two_process_runs(tmp_path, "group_by_length")
    assert runs["trainer", 0]["batches"] != runs["trainer", 1]["batches"]


def test_a_resume_mid_epoch_reads_the_rest_of_the_grouped_order(tmp_path):
    options = dict(train_sampling_strategy="group_by_length", eval_strategy="no")
    whole, seen = recorded_bert()
    Model(whole).compile().fit(rows(N), args=hf_args(tmp_path, save_strategy="steps", save_steps=13, **options),
                               data_collator=pad)
    resumed, resumed_seen = recorded_bert()
    Model(resumed).compile().fit(rows(N), args=hf_args(tmp_path, **options), data_collator=pad,
                                 resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-13"))  # inside epoch 1
    assert resumed_seen["train"] == seen["train"][13:]
    for (name, mine), other in zip(resumed.named_parameters(), whole.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name
