"""Two processes started by Fabric's script launcher (strategy="ddp" on CPU): `fit(args=)` with a
`transformers.TrainingArguments` keeps compile's devices, strategy, data_collator and
compute_metrics, and the second process (which runs this script again) builds the
`transformers.TrainingArguments` too.

usage: hf_args_ddp.py RESULT_DIR [STRATEGY]    (STRATEGY: ddp, the default, or ddp_spawn)
"""

import json
import os
import sys

import torch
import transformers

from fitkit import Model, TrainerCallback
from fitkit.engine.data.collate import default_data_collator

CALLS = {"collate": 0}


class KeywordNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, features, labels=None):
        logits = self.net(features)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def collate(samples):
    CALLS["collate"] += 1
    return default_data_collator(samples)


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


class WorldSize(TrainerCallback):
    """Each training process writes its rank and the process group's size (files: spawned ones too)."""

    def __init__(self, out):
        self.out = out

    def on_train_begin(self, args, state, control, **kwargs):
        dist = torch.distributed
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        with open(os.path.join(self.out, f"world-{rank}.json"), "w") as f:
            json.dump({"world": world, "RANK": os.environ.get("RANK")}, f)


def main() -> None:
    out = sys.argv[1]
    hf_args = transformers.TrainingArguments(output_dir=os.path.join(out, "run"), num_train_epochs=2,
                                             per_device_train_batch_size=4, learning_rate=0.05, eval_strategy="epoch",
                                             save_strategy="no", report_to="none", disable_tqdm=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g)
    rows = [{"features": x[i].tolist(), "label": int(x[i, 0] > 0), "idx": i} for i in range(48)]
    strategy = sys.argv[2] if len(sys.argv) > 2 else "ddp"
    model = Model(KeywordNet()).compile(devices=2, strategy=strategy, accelerator="cpu", data_collator=collate,
                                        compute_metrics=compute_metrics)
    world = WorldSize(out)
    history = model.fit(rows[:32], validation_data=rows[32:], args=hf_args, callbacks=[world])
    metrics = model.evaluate(rows[32:], verbose=0, return_dict=True)
    if model.fabric is None or model.fabric.global_rank == 0:  # ddp_spawn: this process has rank 0's results
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"global_step": model.state.global_step, "collate": CALLS["collate"],
                       "history": history.history, "metrics": metrics}, f)


if __name__ == "__main__":
    main()
