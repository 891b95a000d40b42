"""The Trainer's token-count loss (`num_items_in_batch`, `average_tokens_across_devices`) under
gradient accumulation, beside the real `transformers.Trainer` (dropout off, the same seed and data):
a causal LM whose loss divides by the window's label tokens, a BERT classifier whose `forward` takes
`**kwargs` and ignores them, and a module without `**kwargs`. Every logged loss, grad norm and the
final weights within 1e-5. The two-process runs are in `tests/test_hf_trainer_ddp.py`."""

import numpy as np
import pytest
import torch

from fitkit import Model
from fitkit.engine.token_loss import accepts_loss_kwargs, shifts_labels

transformers = pytest.importorskip("transformers")
from hf_tiny import VOCAB, assert_same_logs, classifier, datasets, token_data  # noqa: E402

LENGTH = 10


def tiny_gpt2():
    transformers.set_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=16, n_layer=1, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    net = transformers.GPT2LMHeadModel(cfg)
    net.loss_type = "ForCausalLM"  # as a pretrained causal LM's: the Trainer counts labels[..., 1:]
    return net


def padded_lm_data(n, seed=0):
    """`n` sequences of 3 to LENGTH real tokens, padded to LENGTH; labels -100 on the padding, so
    the micro-batches of a window hold different numbers of label tokens."""
    rng = np.random.default_rng(seed)
    ids, labels, masks = [], [], []
    for _ in range(n):
        real = int(rng.integers(3, LENGTH + 1))
        tokens = rng.integers(1, VOCAB, size=real).tolist()
        ids.append(tokens + [0] * (LENGTH - real))
        labels.append(tokens + [-100] * (LENGTH - real))
        masks.append([1] * real + [0] * (LENGTH - real))
    return datasets.Dataset.from_dict({"input_ids": ids, "attention_mask": masks, "labels": labels})


class NoKwargs(torch.nn.Module):
    """A classifier whose forward names its arguments (no `**kwargs`): the Trainer divides its
    mean loss by the window's length."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.EmbeddingBag(VOCAB, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def both(tmp_path, make_model, data, **fields):
    """The Trainer's and fitkit's log histories and final modules under the same arguments: the
    Trainer's batches, a log every step, a short last window (10 batches, 3 per window)."""
    base = dict(report_to="none", disable_tqdm=True, num_train_epochs=1, per_device_train_batch_size=2,
                logging_steps=1, save_strategy="no", seed=0, learning_rate=0.01, gradient_accumulation_steps=3)
    base.update(fields)
    hf_net, net = make_model(), make_model()
    trainer = transformers.Trainer(model=hf_net, args=transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), **base), train_dataset=data)
    trainer.train()
    model = Model(net).compile()
    model.fit(data, args=transformers.TrainingArguments(output_dir=str(tmp_path / "fitkit"), **base))
    return (trainer.state.log_history, hf_net), (model.state.log_history, net)


def assert_same_run(hf, ours):
    assert_same_logs(hf[0], ours[0])
    for (name, a), b in zip(hf[1].named_parameters(), ours[1].parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0, msg=name)


def _losses(history):
    return [r["loss"] for r in history if "loss" in r]


@pytest.mark.parametrize("across", [True, False])
def test_a_causal_lm_divides_by_the_windows_label_tokens_as_the_trainer(tmp_path, across):
    """On one process `average_tokens_across_devices` changes nothing, in both (two: test_hf_trainer_ddp.py)."""
    data = padded_lm_data(20)
    hf, ours = both(tmp_path, tiny_gpt2, data, average_tokens_across_devices=across)
    assert len(_losses(ours[0])) == 4  # windows of 3, 3, 3 and 1 batches
    assert_same_run(hf, ours)


def test_a_kwargs_classifier_that_ignores_the_count_steps_on_the_sum_as_the_trainer(tmp_path):
    """BERT's classifier takes `**kwargs` and ignores `num_items_in_batch`: the Trainer neither
    divides by the window's length, and logs (and steps on) the micro-batches' summed means."""
    data = token_data(20, seed=0)
    hf, ours = both(tmp_path, classifier, data, gradient_accumulation_steps=2)
    assert_same_run(hf, ours)


def test_a_module_without_kwargs_keeps_the_windows_mean_as_the_trainer(tmp_path):
    data = token_data(20, seed=0)
    hf, ours = both(tmp_path, NoKwargs, data)
    assert hf[0][-1].pop("total_flos") == 0  # a plain module: the Trainer counts no FLOPs, fitkit logs none
    assert_same_run(hf, ours)  # train_loss too: the mean of the steps' means (the last window holds one batch)


def test_the_trainers_rules_for_accepting_loss_kwargs_and_shifting_labels():
    assert accepts_loss_kwargs(classifier()) and accepts_loss_kwargs(tiny_gpt2())
    assert not accepts_loss_kwargs(NoKwargs())
    flagged = NoKwargs()
    flagged.accepts_loss_kwargs = True  # the attribute wins over the signature, as in the Trainer
    assert accepts_loss_kwargs(flagged)
    assert shifts_labels(tiny_gpt2()) and not shifts_labels(classifier()) and not shifts_labels(NoKwargs())
