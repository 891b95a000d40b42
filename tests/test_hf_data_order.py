"""The Hugging Face Trainer's data order under `args=` (issue 35): the same batches in the same
order for the same `seed` and `data_seed`, and the same draws from torch's global generator, so a
model with dropout trains to the Trainer's weights; on two processes, each rank gets the batches
transformers' sampler and accelerate's sharding give it. Keras-style runs keep fitkit's own order."""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

from fitkit import Model, TrainingArguments
from fitkit.engine.data.adapt import adapt

transformers = pytest.importorskip("transformers")

N, BATCH = 12, 4


class Rows(torch.utils.data.Dataset):
    """Sample `i` holds token `5 + i` first, so a batch tells which samples it holds."""

    def __init__(self, n=N):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([5 + i, 3, 4, 7, 2]), "labels": torch.tensor(i % 2)}


def tiny_bert():
    """A one-layer BERT classifier with dropout on, the same weights at each call."""
    transformers.set_seed(0)
    return bert_init()


def bert_init():
    """A one-layer BERT classifier with dropout on, its weights drawn from the global generator."""
    cfg = transformers.BertConfig(vocab_size=N + 8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=8, num_labels=2,
                                  hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    return transformers.BertForSequenceClassification(cfg)


def recorded(net):
    """`net` and the list its training forwards append their batches' sample ids to."""
    seen = []

    def hook(module, args, kwargs):
        if module.training and torch.is_grad_enabled():
            seen.append((kwargs["input_ids"][:, 0] - 5).tolist())

    net.register_forward_pre_hook(hook, with_kwargs=True)
    return net, seen


def hf_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, save_strategy="no",
                num_train_epochs=2, per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
                learning_rate=1e-2, seed=3, dataloader_pin_memory=False, use_cpu=True)
    return transformers.TrainingArguments(**{**base, **kw})


@pytest.mark.parametrize("options", [
    {},  # seed alone
    {"data_seed": 11, "eval_strategy": "steps", "eval_steps": 2},  # the order's own seed; evaluations between steps
], ids=["seed", "data_seed-and-evaluations"])
def test_the_trainers_batches_and_weights_with_dropout(tmp_path, options):
    args = hf_args(tmp_path, **options)
    evaluating = "eval_strategy" in options
    theirs, their_batches = recorded(tiny_bert())
    transformers.Trainer(model=theirs, args=args, train_dataset=Rows(),
                         eval_dataset=Rows(6) if evaluating else None).train()
    ours, our_batches = recorded(tiny_bert())
    Model(ours).compile().fit(Rows(), args=args, validation_data=Rows(6) if evaluating else None)
    assert len(our_batches) == 2 * N // BATCH
    assert our_batches == their_batches
    assert our_batches[:3] != our_batches[3:]  # each epoch has its own order
    for (name, mine), other in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name


def test_a_model_init_is_built_under_the_seed_and_trains_on_as_the_trainers(tmp_path):
    args = hf_args(tmp_path)
    torch.manual_seed(99)  # whatever the state before: both seed before building
    trainer = transformers.Trainer(model_init=bert_init, args=args, train_dataset=Rows())
    trainer.train()
    torch.manual_seed(98)
    model = Model(model_init=bert_init).compile()
    model.fit(Rows(), args=args)
    for (name, mine), other in zip(model.module.named_parameters(), trainer.model.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name


def test_a_resume_mid_epoch_ends_with_the_uninterrupted_runs_weights(tmp_path):
    saving = hf_args(tmp_path, data_seed=11, save_strategy="steps", save_steps=2)
    whole = tiny_bert()
    Model(whole).compile().fit(Rows(), args=saving)
    resumed = tiny_bert()
    Model(resumed).compile().fit(Rows(), args=hf_args(tmp_path, data_seed=11),
                                 resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))  # inside epoch 1
    for (name, mine), other in zip(resumed.named_parameters(), whole.parameters()):
        assert torch.allclose(mine, other, atol=1e-6), name


def test_data_seed_alone_changes_the_order_and_nothing_else(tmp_path):
    orders = {}
    for data_seed in (None, 11):
        net, seen = recorded(tiny_bert())
        Model(net).compile().fit(Rows(), args=hf_args(tmp_path, data_seed=data_seed))
        orders[data_seed] = seen
    assert orders[None] != orders[11]
    assert sorted(sum(orders[None][:3], [])) == sorted(sum(orders[11][:3], [])) == list(range(N))


def draws_of(source, passes=2):
    """How many numbers `passes` passes over `source` draw from torch's global generator."""
    torch.manual_seed(0)
    for _ in range(passes):
        for _ in source.batches(0):
            pass
    after = torch.get_rng_state()
    for count in range(10):
        torch.manual_seed(0)
        for _ in range(count):
            torch.empty((), dtype=torch.int64).random_()
        if torch.equal(torch.get_rng_state(), after):
            return count
    raise AssertionError("the passes drew something else than whole int64 numbers")


@pytest.mark.parametrize("data", ["dataset", "tensors"])
def test_each_pass_draws_one_number_only_under_the_trainers_order(data):
    x = Rows() if data == "dataset" else torch.arange(N).float()[:, None]
    y = None if data == "dataset" else torch.zeros(N)
    keras, _ = adapt(x, y, batch_size=BATCH, shuffle=True, seed=1, args=TrainingArguments(verbose=0))
    trainer, _ = adapt(x, y, batch_size=BATCH, shuffle=True, seed=1,
                       args=TrainingArguments(verbose=0, data_order="trainer"))
    assert draws_of(keras) == 0  # fitkit's own: the order has a generator of its own, the global one is left alone
    assert draws_of(trainer) == 2  # a DataLoader without its own generator draws its workers' base seed


def test_hf_arguments_turn_the_trainers_order_on_and_data_order_is_checked(tmp_path):
    from fitkit.config.hf_arguments import from_hf

    ours = from_hf(hf_args(tmp_path, data_seed=5))
    assert (ours.data_order, ours.data_seed) == ("trainer", 5)
    assert TrainingArguments().data_order == "fitkit"
    with pytest.raises(ValueError, match="`data_order`='hf' is invalid.*'trainer'"):
        TrainingArguments(data_order="hf")
    with pytest.raises(ValueError, match="`data_seed`='x' is invalid"):
        TrainingArguments(data_seed="x")


def accelerate_batches(n, batch_size, seed, data_seed, rank, world_size=2, epochs=2):
    """The sample ids of each batch `rank` reads, from transformers' own training sampler made
    ready by accelerate as the Trainer makes it (seedable sampler, batches sharded by rank)."""
    from accelerate.data_loader import prepare_data_loader

    trainer = transformers.Trainer(model=torch.nn.Linear(1, 1), args=transformers.TrainingArguments(
        output_dir="unused", report_to="none", seed=seed, data_seed=data_seed, use_cpu=True),
        train_dataset=Rows(n))
    transformers.set_seed(seed)  # the Trainer seeds before it builds its loader
    loader = torch.utils.data.DataLoader(Rows(n), batch_size=batch_size, sampler=trainer._get_train_sampler())
    loader = prepare_data_loader(loader, num_processes=world_size, process_index=rank, put_on_device=False,
                                 use_seedable_sampler=True, data_seed=data_seed)
    batches = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches += [(batch["input_ids"][:, 0] - 5).tolist() for batch in loader]
    return batches


@pytest.mark.slow
def test_two_processes_read_the_batches_accelerate_gives_each_rank(tmp_path):
    # 13 samples by 3: 5 batches, the last one short, so rank 1's last batch is made of the epoch's first samples
    n, batch_size, data_seed = 13, 3, 7
    script = os.path.join(os.path.dirname(__file__), "scripts", "hf_order_ddp.py")
    proc = subprocess.run([sys.executable, script, str(tmp_path), str(n), str(batch_size), "3", str(data_seed).lower()],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        ours = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert ours == accelerate_batches(n, batch_size, 3, data_seed, rank), rank


def test_workers_are_seeded_by_the_trainers_rule():
    from transformers.trainer_utils import seed_worker as their_seed_worker

    from fitkit.engine.data.trainer_order import seed_worker

    states = []
    for seed_worker_fn in (their_seed_worker, seed_worker):
        torch.manual_seed(1234)  # a worker's torch seed: its base seed plus its id
        seed_worker_fn(0, num_workers=2, rank=1)
        states.append((torch.get_rng_state(), random.getstate(), np.random.get_state()[1].tolist()))
    assert torch.equal(states[0][0], states[1][0]) and states[0][1:] == states[1][1:]
