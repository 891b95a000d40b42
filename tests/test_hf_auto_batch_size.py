"""HF's `auto_find_batch_size`: an out-of-memory error in training starts the run again with 0.9 x
the batch size, as the Trainer does through accelerate's `find_executable_batch_size`; beside the
real Trainer on a module whose forward runs out of memory above a batch size (on a CPU)."""

import logging

import pytest
import torch

from fitkit import Model
from fitkit.common.memory_errors import out_of_memory
from fitkit.engine.batch_size_search import with_smaller_batches

transformers = pytest.importorskip("transformers")
from hf_tiny import VOCAB, assert_same_logs, token_data  # noqa: E402

TRAIN = token_data(40, seed=0)


class Picky(torch.nn.Module):
    """A classifier whose forward raises CUDA's out-of-memory error for batches above `limit`."""

    def __init__(self, limit=5):
        super().__init__()
        torch.manual_seed(0)
        self.limit, self.sizes = limit, []
        self.embed = torch.nn.EmbeddingBag(VOCAB, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, labels=None):
        self.sizes.append(input_ids.shape[0])
        if input_ids.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        logits = self.head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def hf_args(tmp_path, name, **fields):
    fields = {"save_strategy": "no", **fields}
    return transformers.TrainingArguments(output_dir=str(tmp_path / name), report_to="none", disable_tqdm=True,
                                          num_train_epochs=2, per_device_train_batch_size=8, logging_steps=2,
                                          seed=0, learning_rate=0.05, **fields)


def test_the_batch_size_shrinks_as_the_trainers_and_the_run_is_its_run(tmp_path):
    theirs = Picky()
    trainer = transformers.Trainer(model=theirs, args=hf_args(tmp_path, "hf", auto_find_batch_size=True),
                                   train_dataset=TRAIN)
    trainer.train()
    ours = Picky()
    model = Model(ours).compile()
    model.fit(TRAIN, args=hf_args(tmp_path, "fitkit", auto_find_batch_size=True))
    assert trainer.state.train_batch_size == model.state.train_batch_size == 5  # 8, 7 (int(8 * 0.9)), 6, 5
    assert [s for s in ours.sizes if s > 5] == [s for s in theirs.sizes if s > 5] == [8, 7, 6]
    hf_logs = trainer.state.log_history
    assert hf_logs[-1].pop("total_flos") == 0  # a plain module: the Trainer counts no FLOPs, fitkit logs none
    assert_same_logs(hf_logs, model.state.log_history)
    for a, b in zip(theirs.parameters(), ours.parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_without_it_the_error_stops_the_run_as_the_trainers(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        transformers.Trainer(model=Picky(), args=hf_args(tmp_path, "hf"), train_dataset=TRAIN).train()
    with pytest.raises(torch.OutOfMemoryError):
        Model(Picky()).compile().fit(TRAIN, args=hf_args(tmp_path, "fitkit"))


def test_out_of_memory_is_accelerates_rule_and_other_errors_pass_through(caplog):
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB"))
    assert out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate "
                                      "memory: you tried to allocate 123 bytes"))
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError(" out of memory."))
    tried = []

    def attempt(size):
        tried.append(size)
        if size > 3:
            raise torch.OutOfMemoryError("CUDA out of memory.")

    with caplog.at_level(logging.WARNING, logger="fitkit"):
        assert with_smaller_batches(attempt, 5, enabled=True) == 3
    assert tried == [5, 4, 3] and "training starts again with 4" in caplog.text
    with pytest.raises(RuntimeError, match="no batch size fits"):
        with_smaller_batches(lambda size: attempt(size + 10), 2, enabled=True)
    with pytest.raises(ValueError):
        with_smaller_batches(lambda size: (_ for _ in ()).throw(ValueError("no")), 8, enabled=True)


def test_a_resume_keeps_the_size_the_search_shrank_to_as_the_trainers(tmp_path):
    """Shrunk 8 -> 5 and saved at step 4; resumed where batches of 8 would now fit, both train on at 5."""
    runs = {}
    for name in ("hf", "fitkit"):
        args = hf_args(tmp_path, name, auto_find_batch_size=True, save_strategy="steps", save_steps=4)
        if name == "hf":
            transformers.Trainer(model=Picky(), args=args, train_dataset=TRAIN).train()
        else:
            Model(Picky()).compile().fit(TRAIN, args=args)
        again = Picky(limit=8)
        args = hf_args(tmp_path, name, auto_find_batch_size=True, resume_from_checkpoint=str(tmp_path / name / "checkpoint-4"))
        if name == "hf":
            trainer = transformers.Trainer(model=again, args=args, train_dataset=TRAIN)
            trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
            runs[name] = again, trainer.state
        else:
            model = Model(again).compile()
            model.fit(TRAIN, args=args)
            runs[name] = again, model.state
    (theirs, hf_state), (ours, state) = runs["hf"], runs["fitkit"]
    assert hf_state.train_batch_size == state.train_batch_size == 5
    assert set(theirs.sizes) == set(ours.sizes) == {5} and len(ours.sizes) == len(theirs.sizes) == 12  # steps 5-16
    hf_logs = hf_state.log_history
    assert hf_logs[-1].pop("total_flos") == 0
    # the closing `train_loss` of a resumed run is left out: the Trainer's counts the resumed steps' losses
    # only, over all steps (tests/test_hf_trainer_resume.py compares the step records alone, too)
    assert list(hf_logs[-1]) == list(state.log_history[-1])
    assert_same_logs(hf_logs[:-1], state.log_history[:-1])
    for a, b in zip(theirs.parameters(), ours.parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
