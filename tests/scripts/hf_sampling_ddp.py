"""The real `transformers.Trainer` and fitkit on two processes (torchrun, gloo on CPU), one after the
other, under `train_sampling_strategy="group_by_length"` (or the strategy STRATEGY names; "batch_rebalance"
with 2 accumulation steps): samples of 1 to 7 tokens, a one-layer BERT with dropout on. Each process writes, per form, the sample ids of its training batches, the final
weights and the log history to `RESULT_DIR/<form>-<rank>.pt` (tests/test_hf_sampling.py compares them).

usage: python -m torch.distributed.run --standalone --nproc_per_node 2 hf_sampling_ddp.py RESULT_DIR [STRATEGY]
"""

import os
import sys

import torch
import transformers
from hf_trainer_ddp import N, recorded_bert

from fitkit import Model


class Varied(torch.utils.data.Dataset):
    """Sample `i` starts with token `5 + i` and is 1 to 7 tokens long."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        if i >= N:  # the Trainer reads the lengths by iterating the dataset
            raise IndexError(i)
        return {"input_ids": torch.tensor([5 + i] + [3] * (i * 5 % 7)), "labels": torch.tensor(i % 2)}


def pad(samples):
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros(len(samples), width, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = sample["input_ids"]
        mask[row, : len(sample["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([s["labels"] for s in samples])}


def main() -> None:
    out = sys.argv[1]
    strategy = sys.argv[2] if len(sys.argv) > 2 else "group_by_length"
    args = transformers.TrainingArguments(
        output_dir=os.path.join(out, "run"), report_to="none", disable_tqdm=True, save_strategy="no",
        num_train_epochs=2, per_device_train_batch_size=2, learning_rate=1e-2, seed=3, logging_steps=1,
        train_sampling_strategy=strategy, gradient_accumulation_steps=2 if strategy == "batch_rebalance" else 1,
        use_cpu=True, ddp_backend="gloo", dataloader_pin_memory=False)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ["RANK"])

    theirs, seen = recorded_bert()
    trainer = transformers.Trainer(model=theirs, args=args, train_dataset=Varied(), data_collator=pad)
    trainer.train()
    torch.save({"batches": seen, "weights": theirs.state_dict(), "log_history": trainer.state.log_history},
               os.path.join(out, f"trainer-{rank}.pt"))

    ours, seen = recorded_bert()
    model = Model(ours).compile(devices=2, strategy="ddp", accelerator="cpu")
    model.fit(Varied(), args=args, data_collator=pad)
    torch.save({"batches": seen, "weights": ours.state_dict(), "log_history": model.state.log_history},
               os.path.join(out, f"fitkit-{rank}.pt"))


if __name__ == "__main__":
    main()
