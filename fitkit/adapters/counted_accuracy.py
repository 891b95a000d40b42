"""`CountedAccuracy`: the named "accuracy" of a multiclass output (Keras' sparse and categorical
accuracy) as two counts on the device, the correct predictions and the samples seen.

It gives torchmetrics' `MulticlassAccuracy(average="micro")` value bit for bit (float32 correct /
float32 total) and saves the same state under the same names (`tp`, `fp`, `tn`, `fn`), so a
checkpoint of either resumes into the other. What it leaves out is torchmetrics' bookkeeping
around each call (state registration, update and compute wrappers, cached results, reset by
copies), which costs about as much as a small model's validation pass; a search builds, updates,
reads and resets two of these per trial and epoch::

    accuracy = CountedAccuracy(classes=10, device=torch.device("cpu"))
    accuracy.update(logits.argmax(1), labels)
    float(accuracy.compute())   # 0.8125
    accuracy.reset()

One process only: under several, the metric set keeps torchmetrics' object, which sums its
states across processes.
"""

from __future__ import annotations

import torch


class CountedAccuracy:
    """Correct / seen over every sample given to `update` since the last `reset`."""

    higher_is_better = True

    def __init__(self, classes: int, device: torch.device) -> None:
        self.num_classes = classes
        self.device = device
        self.correct = torch.zeros((), dtype=torch.long, device=device)
        self.count = 0  # a host number: the batch sizes are known without reading the device
        self._update_count = 0  # (torchmetrics' name: the updates since the last reset)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """`preds`: class indices of `target`'s shape, or scores with classes in dimension 1."""
        if preds.dim() == target.dim() + 1:
            preds = preds.argmax(1)
        self.correct += (preds == target).sum()
        self.count += target.numel()
        self._update_count += 1

    def compute(self) -> torch.Tensor:
        if not self.count:
            return torch.zeros((), device=self.device)
        # float32 / float32 (the count is cast to the tensor's dtype), as torchmetrics' `_safe_divide`
        return self.correct.float() / self.count

    def reset(self) -> None:
        self.correct.zero_()
        self.count = self._update_count = 0

    def to(self, device: torch.device | str) -> CountedAccuracy:
        self.device = torch.device(device)
        with torch.inference_mode(False):
            self.correct = self.correct.to(self.device)
        return self

    @property
    def metric_state(self) -> dict[str, torch.Tensor]:
        """The state under torchmetrics' names and shapes (`MulticlassAccuracy(average="micro")`)."""
        tp = self.correct.reshape(1).clone()
        wrong = self.count - tp
        return {"tp": tp, "fp": wrong, "tn": self.num_classes * self.count - self.count - wrong, "fn": wrong.clone()}

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Take a saved state (this class's or torchmetrics' `MulticlassAccuracy`)."""
        tp, fn = state["tp"].to(self.device).long(), state["fn"].to(self.device).long()
        with torch.inference_mode(False):  # updated in place later, in and out of inference mode
            self.correct = tp.sum()
        self.count = int((tp + fn).sum())
        self._update_count = max(self._update_count, 1)
