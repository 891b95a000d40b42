"""The real `transformers.Trainer` and fitkit on two processes (torchrun, gloo on CPU) with HF's
`accelerator_config` away from its defaults, one after the other in the same processes (the BERT
classifier with dropout of `hf_trainer_ddp.py`). Each process writes, per form and case, the sample
ids of its training batches, its final weights and the log history to
`RESULT_DIR/<form>-<case>-<rank>.pt`, for tests/test_hf_accelerator_config.py to compare.

- "split": `split_batches=True` (batches of 4 split into 2 a process), `even_batches=False` (15
  samples: the last batch of 3 gives rank 1 one sample, not one completed from the epoch's first),
  `sync_each_batch=True` under `gradient_accumulation_steps=2` (the gradient after each step's first
  micro-batch is kept: synced, the same on both ranks);
- "uneven": `even_batches=False` alone: 7 samples by 2, rank 1's last batch holds the one sample left.

usage: python -m torch.distributed.run --standalone --nproc_per_node 2 hf_accelerator_ddp.py RESULT_DIR
"""

import copy
import os
import sys

import torch
import transformers
from hf_trainer_ddp import recorded_bert

from fitkit import Model

CASES = {
    "split": (15, dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, accelerator_config={
        "split_batches": True, "even_batches": False, "gradient_accumulation_kwargs": {"sync_each_batch": True}})),
    "uneven": (7, dict(per_device_train_batch_size=2, accelerator_config={"even_batches": False})),
}


class Rows(torch.utils.data.Dataset):
    """Sample `i` holds token `5 + i` first, so a batch tells which samples it holds."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([5 + i, 3, 4, 7, 2]), "labels": torch.tensor(i % 2)}


class SubstepGrads(transformers.TrainerCallback):
    """The classifier's gradient after each micro-batch but the last of a step: the same on every
    rank when it was synced (`sync_each_batch`), each rank's own otherwise."""

    def __init__(self):
        self.seen = []

    def on_substep_end(self, args, state, control, model=None, **kwargs):
        self.seen.append(model.classifier.weight.grad.clone())


def main() -> None:
    out = sys.argv[1]
    for case, (n, fields) in CASES.items():
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ["RANK"])
        theirs, seen = recorded_bert()
        grads = SubstepGrads()
        trainer = transformers.Trainer(model=theirs, args=arguments(out, case, fields), train_dataset=Rows(n),
                                       callbacks=[grads])
        trainer.train()
        torch.save({"batches": seen, "weights": theirs.state_dict(), "log_history": trainer.state.log_history,
                    "substep_grads": grads.seen},
                   os.path.join(out, f"trainer-{case}-{rank}.pt"))
        ours, seen = recorded_bert()
        model = Model(ours).compile(devices=2, strategy="ddp", accelerator="cpu")
        grads = SubstepGrads()
        model.fit(Rows(n), args=arguments(out, case, fields), callbacks=[grads])
        torch.save({"batches": seen, "weights": ours.state_dict(), "log_history": model.state.log_history,
                    "substep_grads": grads.seen},
                   os.path.join(out, f"fitkit-{case}-{rank}.pt"))


def arguments(out, case, fields):
    """Built anew for each form: the Trainer writes `num_steps=1` into `gradient_accumulation_kwargs`."""
    return transformers.TrainingArguments(
        output_dir=os.path.join(out, case), report_to="none", disable_tqdm=True, save_strategy="no",
        num_train_epochs=2, learning_rate=1e-2, seed=3, data_seed=7, logging_steps=1, use_cpu=True,
        ddp_backend="gloo", dataloader_pin_memory=False, **copy.deepcopy(fields))

if __name__ == "__main__":
    main()
