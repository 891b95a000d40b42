"""HF's `accelerator_config` (issue 46): the entries that change what a run computes, followed as
Accelerate's prepared training loader and the Trainer's loop follow them, beside the real Trainer.
On one process `use_seedable_sampler=False` (the epoch's order drawn from torch's global generator
by the Trainer's `RandomSampler`) and `gradient_accumulation_kwargs["num_steps"]` change the run;
`split_batches`, `even_batches` and `sync_each_batch` act between processes (a two-process run
under torchrun, `tests/scripts/hf_accelerator_ddp.py`)."""

import copy

import pytest
import torch
from helpers import torchrun

from fitkit import Model

transformers = pytest.importorskip("transformers")
from hf_tiny import assert_same_logs  # noqa: E402
from test_hf_data_order import BATCH, N, Rows, hf_args, recorded, tiny_bert  # noqa: E402

TIMINGS = ("_runtime", "_per_second")


def both(tmp_path, **fields):
    """The Trainer's run and fitkit's with the same arguments: (batches, net, log history) each."""
    runs = []
    for name in ("hf", "fitkit"):
        # copied: the Trainer writes `num_steps=1` into the `gradient_accumulation_kwargs` dict it is given
        args = hf_args(tmp_path / name, logging_steps=1, **copy.deepcopy(fields))
        net, seen = recorded(tiny_bert())
        if name == "hf":
            trainer = transformers.Trainer(model=net, args=args, train_dataset=Rows())
            trainer.train()
            history = trainer.state.log_history
        else:
            model = Model(net).compile()
            model.fit(Rows(), args=args)
            history = model.state.log_history
        runs.append((seen, net, history))
    return runs


def assert_same_run(theirs, ours):
    assert ours[0] == theirs[0]
    for (name, mine), other in zip(ours[1].named_parameters(), theirs[1].parameters()):
        torch.testing.assert_close(mine, other, atol=1e-6, rtol=0, msg=name)
    assert_same_logs(theirs[2], ours[2])


def test_use_seedable_sampler_false_draws_each_epochs_order_from_the_global_generator(tmp_path):
    theirs, ours = both(tmp_path, accelerator_config={"use_seedable_sampler": False})
    assert_same_run(theirs, ours)
    seeded, _ = both(tmp_path / "seeded")  # the default: Accelerate's sampler seeded with data_seed + epoch
    assert ours[0] != seeded[0]
    assert sorted(sum(ours[0][: N // BATCH], [])) == list(range(N))  # an epoch's order: every sample once


def test_num_steps_is_gradient_accumulation_and_the_other_entries_change_nothing_on_one_process(tmp_path):
    config = {"split_batches": True, "even_batches": False, "dispatch_batches": False,
              "gradient_accumulation_kwargs": {"num_steps": 3, "sync_each_batch": True, "adjust_scheduler": False}}
    theirs, ours = both(tmp_path, accelerator_config=config)
    assert_same_run(theirs, ours)
    assert sum(1 for r in ours[2] if "loss" in r) == 2  # 6 batches over 2 epochs, 3 a step


@pytest.mark.slow
def test_two_processes_split_and_deal_batches_as_accelerate_and_train_to_the_trainers_weights(tmp_path):
    torchrun("hf_accelerator_ddp.py", tmp_path, timeout=400)
    runs = {(form, case, rank): torch.load(tmp_path / f"{form}-{case}-{rank}.pt", weights_only=True)
            for form in ("trainer", "fitkit") for case in ("split", "uneven") for rank in (0, 1)}
    # rank 1's last batch of each epoch: the one sample the short last batch leaves it, not completed
    assert [len(b) for b in runs["trainer", "split", 1]["batches"]] == [2, 2, 2, 1] * 2  # batches of 4, split in 2
    assert [len(b) for b in runs["trainer", "uneven", 1]["batches"]] == [2, 1] * 2
    for form in ("trainer", "fitkit"):  # sync_each_batch: the first micro-batch's gradients synced already
        first, second = runs[form, "split", 0]["substep_grads"], runs[form, "split", 1]["substep_grads"]
        assert len(first) == len(second) == 4 and all(torch.equal(a, b) for a, b in zip(first, second)), form
    for a, b in zip(runs["fitkit", "split", 0]["substep_grads"], runs["trainer", "split", 0]["substep_grads"]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for case in ("split", "uneven"):
        for rank in (0, 1):
            theirs, ours = runs["trainer", case, rank], runs["fitkit", case, rank]
            assert ours["batches"] == theirs["batches"], (case, rank)
            for name, value in ours["weights"].items():
                torch.testing.assert_close(value, theirs["weights"][name], atol=1e-5, rtol=0, msg=(case, rank, name))
            assert [list(r) for r in ours["log_history"]] == [list(r) for r in theirs["log_history"]]
            for mine, other in zip(ours["log_history"], theirs["log_history"]):
                for key, value in mine.items():
                    if not key.endswith(TIMINGS):
                        assert value == pytest.approx(other[key], rel=1e-5, abs=1e-5), (case, rank, key)


def test_split_batches_divides_the_batch_among_the_processes_or_says_why_not():
    from fitkit import TrainingArguments
    from fitkit.engine.trainer import per_process_batch

    split = TrainingArguments(batch_size=6, split_batches=True)
    assert (per_process_batch(split, 1), per_process_batch(split, 2), per_process_batch(split, 3)) == (6, 3, 2)
    assert per_process_batch(TrainingArguments(batch_size=6), 2) == 6
    with pytest.raises(ValueError, match=r"`split_batches=True`: the batch size \(6\) needs to be a round multiple "
                                         r"of the number of processes \(4\)"):
        per_process_batch(split, 4)
