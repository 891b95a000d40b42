"""The real `transformers.Trainer` under DDP (two processes, gloo on CPU, started by torchrun)
against fitkit with the same `transformers.TrainingArguments` and `devices=2, strategy="ddp"`
(issue 35): each rank reads the same samples at each step, dropout draws the same masks, and
both end with the same weights and log the same losses."""


import pytest
import torch
from helpers import torchrun

pytest.importorskip("transformers")

#: Values of the log history that are timings (they differ run to run).
TIMINGS = ("_runtime", "_per_second")
#: The token-count loss cases of the script (`average_tokens_across_devices` True or False).
CASES = ("gpt2-across", "gpt2-local", "bert-local")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer_ddp")
    torchrun("hf_trainer_ddp.py", out)
    found = {(form, rank): torch.load(out / f"{form}-{rank}.pt", weights_only=True)
             for form in ("trainer", "fitkit") for rank in (0, 1)}
    found.update({(form, case, rank): torch.load(out / f"{form}-{case}-{rank}.pt", weights_only=True)
                  for form in ("trainer", "fitkit") for case in CASES for rank in (0, 1)})
    return found


@pytest.mark.slow
def test_each_rank_reads_the_trainers_samples_step_by_step(runs):
    for rank in (0, 1):
        theirs, ours = runs["trainer", rank]["batches"], runs["fitkit", rank]["batches"]
        assert len(theirs) == 2 * 3  # 13 samples by 3: 5 batches, 3 a rank (the last round completed), 2 epochs
        assert ours == theirs, rank
    assert runs["trainer", 0]["batches"] != runs["trainer", 1]["batches"]  # the ranks read different samples


def assert_same(theirs, ours, rank):
    for name, value in ours["weights"].items():
        assert torch.allclose(value, theirs["weights"][name], atol=1e-5), (rank, name)
    assert len(ours["log_history"]) == len(theirs["log_history"])
    for mine, other in zip(ours["log_history"], theirs["log_history"]):
        assert list(mine) == list(other), (mine, other)
        for key, value in mine.items():
            if not key.endswith(TIMINGS):
                assert value == pytest.approx(other[key], rel=1e-5, abs=1e-5), (rank, key, mine, other)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_the_token_count_loss_of_every_rank_is_the_trainers(runs, case):
    """`num_items_in_batch` over both processes' label tokens (or each one's) and the loss times
    the number of processes, as the Trainer: the same weights and log history on every rank."""
    for rank in (0, 1):
        assert_same(runs["trainer", case, rank], runs["fitkit", case, rank], rank)
    across, local = runs["fitkit", "gpt2-across", 0]["log_history"], runs["fitkit", "gpt2-local", 0]["log_history"]
    assert [r["grad_norm"] for r in across[:-1]] != pytest.approx([r["grad_norm"] for r in local[:-1]], abs=1e-4)


@pytest.mark.slow
def test_the_same_weights_and_log_history_on_every_rank(runs):
    for rank in (0, 1):
        assert_same(runs["trainer", rank], runs["fitkit", rank], rank)
    trained, other = runs["trainer", 0]["weights"], runs["trainer", 1]["weights"]
    assert all(torch.equal(value, other[name]) for name, value in trained.items())  # DDP keeps the ranks in sync
