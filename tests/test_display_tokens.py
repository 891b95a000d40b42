"""The epoch line's tokens/s: counted from the shapes of `input_ids` batches (no device read),
absent when the batches carry no `input_ids`."""

import re

import torch

from fitkit import Model


class Bag(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(50, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        return torch.nn.functional.cross_entropy(logits, labels), logits


def _tokens_batches():
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 50, (4, 7), generator=g), "labels": torch.randint(0, 2, (4,), generator=g)}
            for _ in range(5)]


def test_verbose_two_shows_tokens_per_second_for_input_ids_batches(capsys):
    Model(Bag()).compile("sgd", None).fit(_tokens_batches(), epochs=2, verbose=2)
    lines = [line for line in capsys.readouterr().out.splitlines() if " | " in line]
    assert len(lines) == 2
    for line in lines:
        samples = float(re.search(r"(\d+) samples/s", line).group(1))
        tokens = float(re.search(r"(\d+) tokens/s", line).group(1))
        assert tokens > 0 and abs(tokens / max(samples, 1) - 7) < 1.5, line  # 7 tokens a sample


def test_no_tokens_per_second_without_input_ids(capsys):
    x, y = torch.randn(20, 4), torch.randint(0, 2, (20,))
    Model(torch.nn.Linear(4, 2)).compile("sgd", "cross_entropy").fit(x, y, epochs=1, batch_size=5, verbose=2)
    out = capsys.readouterr().out
    assert "samples/s" in out and "tokens/s" not in out
