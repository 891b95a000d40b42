"""The real `transformers.Trainer` and fitkit on two processes (torchrun, gloo on CPU), one after
the other in the same processes, with the same `transformers.TrainingArguments`: a one-layer BERT
classifier with dropout on, a map-style dataset, the same `seed` and `data_seed`. Each process
writes, per form, the sample ids of its training batches step by step, the final weights and the
log history to `RESULT_DIR/<form>-<rank>.pt`, for tests/test_hf_trainer_ddp.py to compare.

Then the Trainer's token-count loss: a tiny GPT-2 whose labels are padded with -100 to different
lengths, two micro-batches a step, with `average_tokens_across_devices` True and False (the label
tokens of both processes, or of each), and the BERT classifier (its forward takes `**kwargs` and
ignores the count) with it False: `RESULT_DIR/<form>-<case>-<rank>.pt`.

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
    token_loss_cases(out, rank)


class PaddedText(torch.utils.data.Dataset):
    """Sequences of 2 to 8 real tokens padded to 8, labels -100 on the padding."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        real = 2 + (i * 5) % 7
        ids = [(3 + i * 7 + j * 3) % 20 + 1 for j in range(real)]
        return {"input_ids": torch.tensor(ids + [0] * (8 - real)),
                "attention_mask": torch.tensor([1] * real + [0] * (8 - real)),
                "labels": torch.tensor(ids + [-100] * (8 - real))}


def tiny_gpt2():
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(vocab_size=24, n_positions=8, n_embd=16, n_layer=1, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    net = transformers.GPT2LMHeadModel(cfg)
    net.loss_type = "ForCausalLM"
    return net


def token_loss_cases(out: str, rank: int) -> None:
    """Each case run by the Trainer, then by fitkit, over two processes, two micro-batches a step."""
    cases = {"gpt2-across": (tiny_gpt2, PaddedText, True), "gpt2-local": (tiny_gpt2, PaddedText, False),
             "bert-local": (lambda: recorded_bert()[0], Rows, False)}
    for case, (make, data, across) in cases.items():
        args = transformers.TrainingArguments(
            output_dir=os.path.join(out, case), report_to="none", disable_tqdm=True, save_strategy="no",
            num_train_epochs=1, per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2,
            seed=3, logging_steps=1, use_cpu=True, ddp_backend="gloo", dataloader_pin_memory=False,
            average_tokens_across_devices=across)
        theirs = make()
        trainer = transformers.Trainer(model=theirs, args=args, train_dataset=data())
        trainer.train()
        torch.save({"weights": theirs.state_dict(), "log_history": trainer.state.log_history},
                   os.path.join(out, f"trainer-{case}-{rank}.pt"))
        ours = make()
        model = Model(ours).compile(devices=2, strategy="ddp", accelerator="cpu")
        model.fit(data(), args=args)
        torch.save({"weights": ours.state_dict(), "log_history": model.state.log_history},
                   os.path.join(out, f"fitkit-{case}-{rank}.pt"))


if __name__ == "__main__":
    main()
