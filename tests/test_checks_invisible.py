"""fitkit's first-batch checks are invisible (issue 46): a fit with the checks on reads each sample,
batch and collation once, and draws every random number a hand-written PyTorch loop draws, in
the same order, for each kind of generator a run's data may draw from: torch's global one (a
dataset drawing noise), a collator's own `torch.Generator` (transformers'
`DataCollatorForLanguageModeling(seed=...)` and a hand-made one), a `datasets` transform
(`set_transform`, a random flip), NumPy's global generator and Python's `random`."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fitkit import Model
from fitkit.engine import trainer as trainer_module

SEED, EPOCHS, BATCH = 3, 2, 8


class Noisy(torch.utils.data.Dataset):
    """Rows of 4 features and a class; each read adds noise drawn by `draw` (recorded)."""

    def __init__(self, n: int, draw, drawn: list, offset: int = 0):
        g = torch.Generator().manual_seed(offset)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)
        self.draw, self.drawn = draw, drawn

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        noise = float(self.draw()) if self.draw is not None else 0.0
        self.drawn.append(("sample", i, noise))
        return self.x[i] + noise, self.y[i]


class MaskingCollator:
    """A collator with its own generator (as transformers' seeded collators have): a random
    feature mask per batch, recorded."""

    def __init__(self, seed: int, drawn: list):
        self.generator, self.drawn = torch.Generator().manual_seed(seed), drawn

    def __call__(self, rows):
        x = torch.stack([r[0] for r in rows])
        mask = torch.rand(x.shape, generator=self.generator) > 0.3
        self.drawn.append(("mask", mask.tolist()))
        return x * mask, torch.stack([r[1] for r in rows])


def _draws(kind: str):
    return {"torch": lambda: torch.rand(()), "numpy": lambda: np.random.rand(), "python": random.random,
            "collator": None}[kind]


def _loaders(kind: str, drawn: list):
    draw = _draws(kind)
    train, val = Noisy(40, draw, drawn), Noisy(16, draw, drawn, offset=1)
    collate = MaskingCollator(7, drawn) if kind == "collator" else None
    return (torch.utils.data.DataLoader(train, batch_size=BATCH, shuffle=True, collate_fn=collate),
            torch.utils.data.DataLoader(val, batch_size=BATCH, collate_fn=collate))


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _hand_loop(train, val, net, step) -> None:
    """The loop a user writes: the run's seed, then per epoch a pass over the training data and
    one over the validation data."""
    _seed_all(SEED)
    for _ in range(EPOCHS):
        net.train()
        for batch in train:
            step(batch)
        net.eval()
        with torch.no_grad():
            for batch in val:
                net(batch[0]) if isinstance(batch, (tuple, list)) else net(**batch)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


@pytest.mark.parametrize("kind", ["torch", "collator", "numpy", "python"])
def test_a_fit_draws_what_a_hand_loop_draws(kind):
    fitted: list = []
    train, val = _loaders(kind, fitted)
    Model(_net()).compile("sgd", "cross_entropy", ["accuracy"]).fit(
        train, validation_data=val, epochs=EPOCHS, seed=SEED, verbose=0)

    by_hand: list = []
    train, val = _loaders(kind, by_hand)
    net = _net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

    def step(batch):
        torch.nn.functional.cross_entropy(net(batch[0]), batch[1]).backward()
        optimizer.step()
        optimizer.zero_grad()

    _hand_loop(train, val, net, step)
    assert len(fitted) == len(by_hand) == EPOCHS * (56 + (7 if kind == "collator" else 0))  # each read once
    assert fitted == by_hand  # every draw, in order


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[MASK]", *[f"w{i}" for i in range(13)]]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")


class Recorded:
    """A collator whose every output's labels (the masks it drew) are recorded."""

    def __init__(self, collator, drawn: list):
        self.collator, self.drawn = collator, drawn

    def __call__(self, rows):
        batch = self.collator(rows)
        self.drawn.append(batch["labels"].tolist())
        return batch


def _mlm_loaders(drawn: list):
    from transformers import DataCollatorForLanguageModeling

    collator = Recorded(DataCollatorForLanguageModeling(_tokenizer(), mlm_probability=0.3, seed=7), drawn)
    g = torch.Generator().manual_seed(2)
    rows = [{"input_ids": torch.randint(3, 16, (10,), generator=g).tolist()} for _ in range(32)]
    return (torch.utils.data.DataLoader(rows[:24], batch_size=BATCH, shuffle=True, collate_fn=collator),
            torch.utils.data.DataLoader(rows[24:], batch_size=BATCH, collate_fn=collator))


def _tiny_mlm():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                        intermediate_size=16, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(config)


def test_a_seeded_masked_lm_collator_draws_the_masks_a_hand_loop_draws():
    fitted: list = []
    train, val = _mlm_loaders(fitted)
    Model(_tiny_mlm()).compile("sgd").fit(train, validation_data=val, epochs=EPOCHS, seed=SEED, verbose=0)

    by_hand: list = []
    train, val = _mlm_loaders(by_hand)
    net = _tiny_mlm()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

    def step(batch):
        net(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    _hand_loop(train, val, net, step)
    assert len(fitted) == len(by_hand) == EPOCHS * 4  # each collation once
    assert fitted == by_hand


def _flipped(drawn: list):
    """A `datasets` Dataset whose transform flips each row's features at random (torch's global
    generator, as torchvision's RandomHorizontalFlip draws), recorded."""
    import datasets

    g = torch.Generator().manual_seed(4)
    ds = datasets.Dataset.from_dict({"x": torch.randn(40, 4, generator=g).tolist(),
                                     "labels": torch.randint(0, 3, (40,), generator=g).tolist()})

    def transform(rows):
        flips = [bool(torch.rand(()) < 0.5) for _ in rows["x"]]
        drawn.extend(flips)
        return {"x": [torch.tensor(v[::-1] if f else v) for v, f in zip(rows["x"], flips)],
                "labels": rows["labels"]}

    ds.set_transform(transform)
    return ds


class Keyword(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = _net()

    def forward(self, x):
        return self.linear(x)


def test_a_dataset_transforms_flips_are_a_hand_loops():
    fitted: list = []
    ds = _flipped(fitted)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True)
    Model(Keyword()).compile("sgd", "cross_entropy").fit(loader, epochs=EPOCHS, seed=SEED, verbose=0)

    by_hand: list = []
    ds = _flipped(by_hand)
    net = Keyword()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    _seed_all(SEED)
    for _ in range(EPOCHS):
        for batch in torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True):
            torch.nn.functional.cross_entropy(net(x=batch["x"]), batch["labels"]).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert len(fitted) == len(by_hand) == EPOCHS * 40
    assert fitted == by_hand


@pytest.mark.parametrize("kind", ["torch", "collator", "numpy", "python", "flip"])
def test_the_checks_change_no_draw_when_fitkit_builds_the_loader(kind, monkeypatch):
    """A Dataset passed as is (fitkit builds the loader and its order): the same draws with
    the checks on as with them switched off."""
    runs = []
    for checked in (True, False):
        if not checked:
            monkeypatch.setattr(trainer_module, "check_data", lambda *a, **k: None)
        drawn: list = []
        if kind == "flip":
            data, val, net = _flipped(drawn), None, Keyword()
        else:
            draw = _draws(kind)
            data, val, net = Noisy(40, draw, drawn), (torch.randn(16, 4), torch.randint(0, 3, (16,))), _net()
        collate = MaskingCollator(7, drawn) if kind == "collator" else None
        Model(net).compile("sgd", "cross_entropy").fit(data, validation_data=val, epochs=EPOCHS, seed=SEED,
                                                       batch_size=BATCH, verbose=0, data_collator=collate)
        runs.append(drawn)
    assert runs[0] == runs[1] and len(runs[0]) >= EPOCHS * 40


class OwnModes(torch.nn.Module):
    """A module whose `train()` override does more than set flags (as a user's may): it keeps its
    norm frozen and switches a setting of its forward by mode."""

    def __init__(self):
        super().__init__()
        self.norm, self.linear = torch.nn.BatchNorm1d(4), _net()
        self.scale, self.seen = 1.0, []
        self.train()  # (fitkit's mode setting skips a module whose flags are all set already)

    def train(self, mode=True):
        super().train(mode)
        self.norm.eval()
        self.scale = 1.0 if mode else 0.5
        return self

    def forward(self, x):
        self.seen.append((x.shape[1], self.training, self.norm.training, self.scale))
        return self.linear(self.norm(x.mean(1)) * self.scale)


def test_the_validation_probe_sets_the_mode_through_the_modules_own_train():
    """In-memory validation inputs of another shape than the training batch's are run once by
    the checks in eval mode: through the module's `eval()`, then its `train()` again."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 5, 4, generator=g), torch.randint(0, 3, (32,), generator=g)
    vx, vy = torch.randn(8, 7, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    net = OwnModes()
    Model(net).compile("sgd", "cross_entropy").fit(x, y, validation_data=(vx, vy), batch_size=16, epochs=1,
                                                   verbose=0)
    probe, *rest = [s for s in net.seen if s[0] == 7]
    assert probe == (7, False, False, 0.5)  # the eval mode the override makes
    assert all(s == (5, True, False, 1.0) for s in net.seen if s[0] == 5)  # training: as `train()` leaves it
    assert rest and all(s == (7, False, False, 0.5) for s in rest)  # the validation passes
    assert torch.equal(net.norm.running_mean, torch.zeros(4))  # the frozen norm never updated


def test_a_seeded_masked_lm_collator_gives_the_trainers_log(tmp_path):
    """`run_mlm.py`'s shape with `DataCollatorForLanguageModeling(seed=7)` (its own generator),
    the real Trainer beside fitkit under the same `args`: every logged value equal."""
    import datasets
    import transformers

    def rows(n, seed):
        g = torch.Generator().manual_seed(seed)
        return datasets.Dataset.from_dict({"input_ids": torch.randint(3, 16, (n, 10), generator=g).tolist()})

    def args(name):
        return transformers.TrainingArguments(
            output_dir=str(tmp_path / name), report_to="none", disable_tqdm=True, save_strategy="no",
            eval_strategy="epoch", logging_steps=1, num_train_epochs=2, per_device_train_batch_size=8,
            per_device_eval_batch_size=8, learning_rate=1e-2, seed=0, dataloader_pin_memory=False)

    def collator():
        return transformers.DataCollatorForLanguageModeling(_tokenizer(), mlm_probability=0.3, seed=7)

    train, val = rows(32, 0), rows(16, 1)
    trainer = transformers.Trainer(model=_tiny_mlm(), args=args("hf"), train_dataset=train, eval_dataset=val,
                                   data_collator=collator())
    trainer.train()
    model = Model(_tiny_mlm()).compile()
    model.fit(train, validation_data=val, args=args("fitkit"), data_collator=collator())
    timings = ("runtime", "per_second", "flos")
    theirs, ours = ([{k: v for k, v in r.items() if not any(t in k for t in timings)} for r in h]
                    for h in (trainer.state.log_history, model.state.log_history))
    assert len(ours) == len(theirs) == 8 + 2 + 1  # a loss per step, an evaluation per epoch, the summary
    for a, b in zip(ours, theirs):
        assert set(a) == set(b) and a == pytest.approx(b, abs=1e-5), (a, b)


class FlipNet(torch.nn.Module):
    """A classifier computing its own loss, as a transformers model does (`x`, `labels`)."""

    def __init__(self):
        super().__init__()
        self.linear = _net()

    def forward(self, x, labels=None):
        logits = self.linear(x)
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits} if loss is not None else {"logits": logits}


def test_a_random_flip_in_set_transform_gives_the_trainers_log(tmp_path):
    """`run_image_classification.py`'s shape: a random flip in `set_transform` (torch's global
    generator), the real Trainer beside fitkit: the same draws, so every logged value equal."""
    import transformers

    def args(name):
        return transformers.TrainingArguments(
            output_dir=str(tmp_path / name), report_to="none", disable_tqdm=True, save_strategy="no",
            logging_steps=1, num_train_epochs=2, per_device_train_batch_size=8, learning_rate=1e-1, seed=0,
            dataloader_pin_memory=False, remove_unused_columns=False)

    drawn_by_trainer: list = []
    trainer = transformers.Trainer(model=FlipNet(), args=args("hf"), train_dataset=_flipped(drawn_by_trainer))
    trainer.train()
    drawn: list = []
    model = Model(FlipNet()).compile()
    model.fit(_flipped(drawn), args=args("fitkit"))
    assert drawn == drawn_by_trainer and len(drawn) == 2 * 40
    timings = ("runtime", "per_second", "flos")
    theirs, ours = ([{k: v for k, v in r.items() if not any(t in k for t in timings)} for r in h]
                    for h in (trainer.state.log_history, model.state.log_history))
    assert len(ours) == len(theirs) == 10 + 1
    for a, b in zip(ours, theirs):
        assert set(a) == set(b) and a == pytest.approx(b, abs=1e-5), (a, b)
