"""FSDP runs on two processes (torchrun, gloo on CPU) of a one-layer BERT classifier (dropout off),
for tests/test_hf_fsdp_runs.py, each in the same processes after the other:

- "hf": `fit(args=TrainingArguments(fsdp="full_shard auto_wrap", fsdp_config={...}))`;
- "fitkit": the same arguments without `fsdp`, and fitkit's own `compile(strategy="fsdp", fsdp_wrap=...)`;
- "trainer": `transformers.Trainer` with the arguments of "hf";
- "ac": HF's `fsdp="shard_grad_op"` with `fsdp_config={"activation_checkpointing": True}`.

Each writes its losses, final whole weights, the modules sharded as FSDP units and those
checkpointed, and those kept gathered after forward to RESULT_DIR/<run>-<rank>.json.

usage: python -m torch.distributed.run --standalone --nproc_per_node 2 hf_fsdp_args.py RESULT_DIR
"""

import json
import os
import sys

import torch
import transformers

from fitkit import Model, TrainerCallback

N = 16


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([5 + i % 11, 3, 4, 7, 2]), "labels": torch.tensor(i % 2)}


def bert(trial=None):
    transformers.set_seed(0)
    cfg = transformers.BertConfig(vocab_size=24, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=8, num_labels=2,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    net = transformers.BertForSequenceClassification(cfg)
    net.accepts_loss_kwargs = False  # the batch's mean loss in both runs (see tests/scripts/hf_trainer_ddp.py)
    return net


class Record(TrainerCallback):
    def __init__(self):
        self.losses, self.units, self.checkpointed, self.kept = [], [], [], []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from torch.distributed._composable.contract import _get_registry
        from torch.distributed.fsdp import FSDPModule

        self.units = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)]
        self.checkpointed = [n for n, m in model.named_modules() if "checkpoint" in (_get_registry(m) or {})]
        # units that stay gathered from forward to backward (reshard_after_forward=False): no mesh to reshard to
        self.kept = [n for n, m in model.named_modules() if isinstance(m, FSDPModule)
                     and m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is None]

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.losses.append(logs["loss"])


def hf_arguments(out, name, **fields):
    return transformers.TrainingArguments(
        output_dir=os.path.join(out, name), report_to="none", disable_tqdm=True, save_strategy="no", max_steps=3,
        per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1, use_cpu=True, ddp_backend="gloo",
        dataloader_pin_memory=False, **fields)


def dump(out, rank, name, module, **values):
    weights = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten().tolist()
               for n, p in module.named_parameters()}
    with open(os.path.join(out, f"{name}-{rank}.json"), "w") as f:
        json.dump({"weights": weights, **values}, f)


def run(out, rank, name, compile_options, **fields):
    args = hf_arguments(out, name, **fields)
    record = Record()
    model = Model(model_init=bert).compile(devices=2, accelerator="cpu", **compile_options)
    model.fit(Rows(), args=args, callbacks=[record], verbose=0)
    dump(out, rank, name, model.module, losses=record.losses, units=record.units, checkpointed=record.checkpointed,
         kept=record.kept)


def trainer(out, rank):
    """The real Trainer with the same arguments (on CPU, Accelerate leaves its FSDP plugin off: no units)."""
    trainer = transformers.Trainer(model=bert(), args=hf_arguments(out, "trainer", fsdp="full_shard auto_wrap",
                                                                   fsdp_config={"transformer_layer_cls_to_wrap":
                                                                                ["BertLayer"]}), train_dataset=Rows())
    trainer.train()
    dump(out, rank, "trainer", trainer.model, losses=[r["loss"] for r in trainer.state.log_history if "loss" in r])


def main() -> None:
    out, rank = sys.argv[1], int(os.environ["RANK"])
    torch.set_num_threads(1)
    # a new dict for each: HF's `__post_init__` fills its defaults into the `fsdp_config` dict it is given
    run(out, rank, "hf", {}, fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["BertLayer"]})
    run(out, rank, "fitkit", {"strategy": "fsdp", "fsdp_wrap": {transformers.models.bert.modeling_bert.BertLayer},
                              "fsdp_full_checkpoint": True})
    trainer(out, rank)
    run(out, rank, "ac", {}, fsdp="shard_grad_op", fsdp_config={"transformer_layer_cls_to_wrap": ["BertLayer"],
                                                                "activation_checkpointing": True})


if __name__ == "__main__":
    main()
