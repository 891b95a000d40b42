"""Two processes (ddp_spawn on CPU): per-sample dicts as training data and HF's
`compute_metrics`, which sees the whole evaluation set, gathered, on every process.

usage: hf_data_ddp.py RESULT_DIR
"""

import json
import os
import sys

import numpy as np
import torch

from fitkit import Model


class KeywordNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def forward(self, features):
        return self.net(features)


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    with open(os.path.join(sys.argv[1], f"call-{os.getpid()}-{os.urandom(4).hex()}.json"), "w") as f:
        json.dump({"labels": labels.tolist(), "rows": int(logits.shape[0])}, f)
    return {"my_accuracy": float((logits.argmax(-1) == labels).mean())}


def main() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(101, 8, generator=g)
    y = (x[:, 0] > 0).long()
    rows = [{"features": x[i].tolist(), "label": int(y[i])} for i in range(101)]
    model = Model(KeywordNet()).compile("adam", "cross_entropy", ["accuracy"], strategy="ddp_spawn", devices=2,
                                        accelerator="cpu", learning_rate=1e-2)
    history = model.fit(rows[:64], validation_data=rows[64:], epochs=2, batch_size=8, verbose=0,
                        compute_metrics=compute_metrics)
    result = {"history": history.history, "global_step": model.state.global_step,
              "val_labels": [r["label"] for r in rows[64:]], "positive": float(np.mean(y.numpy()))}
    with open(os.path.join(sys.argv[1], "result.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
