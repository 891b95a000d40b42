"""The real `transformers.Trainer` and fitkit on two processes (torchrun, gloo on CPU), one after
the other in the same processes, with the same `transformers.TrainingArguments`: a one-layer BERT
classifier with dropout on, a map-style dataset, the same `seed` and `data_seed`. Each process
writes, per form, the sample ids of its training batches step by step, the final weights and the
log history to `RESULT_DIR/<form>-<rank>.pt`, for tests/test_hf_trainer_ddp.py to compare.

usage: python -m torch.distributed.run --standalone --nproc_per_node 2 hf_trainer_ddp.py RESULT_DIR
"""

import os
import sys

import torch
import transformers

from fitkit import Model

N, BATCH = 13, 3  # 5 batches an epoch, the last one short: accelerate completes rank 1's last batch


class Rows(torch.utils.data.Dataset):
    """Sample `i` holds token `5 + i` first, so a batch tells which samples it holds."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([5 + i, 3, 4, 7, 2]), "labels": torch.tensor(i % 2)}


def recorded_bert():
    """A one-layer BERT classifier with dropout on (the same weights at each call) and the list
    its training forwards append their batches' sample ids to."""
    transformers.set_seed(0)
    cfg = transformers.BertConfig(vocab_size=N + 8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=8, num_labels=2,
                                  hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.3)
    net, seen = transformers.BertForSequenceClassification(cfg), []
    # The Trainer multiplies the loss of a model whose forward takes **kwargs by the number of processes
    # (for a loss divided by the tokens of all processes); BERT's classifier takes the batch's mean, and
    # fitkit keeps that mean (docs/migrating-from-hf.md). Marked, the Trainer trains on the mean too.
    net.accepts_loss_kwargs = False

    def hook(module, args, kwargs):
        if module.training and torch.is_grad_enabled():
            seen.append((kwargs["input_ids"][:, 0] - 5).tolist())

    net.register_forward_pre_hook(hook, with_kwargs=True)
    return net, seen


def main() -> None:
    out = sys.argv[1]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(out, "run"), report_to="none", disable_tqdm=True, save_strategy="no",
        num_train_epochs=2, per_device_train_batch_size=BATCH, learning_rate=1e-2, seed=3, data_seed=7,
        logging_steps=1, use_cpu=True, ddp_backend="gloo", dataloader_pin_memory=False)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(os.environ["RANK"])

    theirs, seen = recorded_bert()
    trainer = transformers.Trainer(model=theirs, args=args, train_dataset=Rows())
    trainer.train()
    torch.save({"batches": seen, "weights": theirs.state_dict(), "log_history": trainer.state.log_history},
               os.path.join(out, f"trainer-{rank}.pt"))

    ours, seen = recorded_bert()
    model = Model(ours).compile(devices=2, strategy="ddp", accelerator="cpu")
    model.fit(Rows(), args=args)
    torch.save({"batches": seen, "weights": ours.state_dict(), "log_history": model.state.log_history},
               os.path.join(out, f"fitkit-{rank}.pt"))


if __name__ == "__main__":
    main()
