"""Outputs and labels whose length differs per batch, padded with -100 across batches and
processes, for `compute_metrics` and `predict`, with and without `eval_accumulation_steps`:
`distributed.py` makes these calls on two processes, `tests/test_distributed.py` on one.
"""

import torch

from fitkit import Model


class PerPosition(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, 2)
        with torch.no_grad():  # the same weights whatever the RNG's state
            self.linear.weight.copy_(torch.tensor([[0.5], [-1.5]]))
            self.linear.bias.copy_(torch.tensor([0.1, -0.2]))

    def forward(self, x, labels=None):
        logits = self.linear(x.unsqueeze(-1))
        if labels is None:
            return {"logits": logits}
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}


def collate(samples):
    """Each batch padded to its own longest sample (as DataCollatorForTokenClassification)."""
    width = max(len(s["x"]) for s in samples)
    x = torch.tensor([s["x"] + [0.0] * (width - len(s["x"])) for s in samples])
    labels = torch.tensor([s["labels"] + [-100] * (width - len(s["labels"])) for s in samples])
    return {"x": x, "labels": labels}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    keep = labels != -100
    return {"width": float(labels.shape[1]), "rows": float(labels.shape[0]), "kept": float(keep.sum()),
            "kept_logits": float(logits[keep].sum()), "padded": float((logits == -100).all(-1).sum())}


ROWS = [{"x": [0.1 * ((7 * i + j) % 11) - 0.5 for j in range(n)], "labels": [i % 2] * n}
        for i, n in enumerate([2, 3, 2, 2, 5, 4, 3, 2, 7, 3, 2, 2, 3, 4, 2, 6, 2, 3, 2, 2, 3])]


def calls(model: Model) -> dict:
    """evaluate (compute_metrics) with eval_accumulation_steps=1 and predict without, through a
    `Model` of `PerPosition` (compiled) on whatever processes it runs."""
    opts = dict(batch_size=4, verbose=0, data_collator=collate)
    return {"evaluate": model.evaluate(ROWS, compute_metrics=compute_metrics, eval_accumulation_steps=1, **opts, return_dict=True),
            "predict": model.predict(ROWS, **opts)["logits"].tolist()}
