"""Hugging Face fine-tuning habits (issue 27): HF collators' BatchEncoding, remove_unused_columns,
processing_class, the args= merge rule, evaluate/predict reusing fit's data options, HF's decay
groups, the logged loss under gradient accumulation, and checkpoints from_pretrained opens."""

import json
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import stress_only

from fitkit import Model, TrainingArguments
from fitkit.engine.data.hf_columns import drop_unused_columns

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from text_classification import make_texts, make_tokenizer  # noqa: E402

TEXTS, LABELS = make_texts(48, seed=3)
TOKENIZER = make_tokenizer(TEXTS)


def tiny_bert(cls=None, seed=0, **config):
    transformers.set_seed(seed)
    cfg = transformers.BertConfig(vocab_size=TOKENIZER.vocab_size, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32, max_position_embeddings=32,
                                  num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **config)
    return (cls or transformers.BertForSequenceClassification)(cfg)


def tokenized(n=48, keep_text=True):
    ds = datasets.Dataset.from_dict({"text": TEXTS[:n], "label": LABELS[:n], "idx": list(range(n))})
    ds = ds.map(lambda b: TOKENIZER(b["text"], truncation=True), batched=True)
    return ds if keep_text else ds.remove_columns(["text", "idx"])


def hf_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, save_strategy="no",
                num_train_epochs=1, per_device_train_batch_size=8, learning_rate=1e-3)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def accuracy(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


# -- Mapping batches ---------------------------------------------------------------------------------
def test_batch_encoding_from_the_padding_collator_is_a_keyword_batch():
    collator = transformers.DataCollatorWithPadding(TOKENIZER)
    batches = [collator([tokenized(keep_text=False)[i] for i in range(j, j + 8)]) for j in range(0, 48, 8)]
    assert type(batches[0]).__name__ == "BatchEncoding"
    model = Model(tiny_bert()).compile("adamw", learning_rate=1e-3)
    history = model.fit(batches, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and model.state.global_step == 12


def test_batch_encoding_from_the_language_modeling_collator():
    collator = transformers.DataCollatorForLanguageModeling(TOKENIZER, mlm_probability=0.3)
    samples = tokenized(keep_text=False).remove_columns(["label"])
    model = Model(tiny_bert(transformers.BertForMaskedLM)).compile("adamw", learning_rate=1e-3)
    history = model.fit(samples, batch_size=8, data_collator=collator, verbose=0)
    assert history.history["loss"][0] > 0 and model.state.global_step == 6


# -- remove_unused_columns ---------------------------------------------------------------------------
class KeyRecorder:
    """A padding collator that records the keys it is handed."""

    def __init__(self, keep_only=None):
        self.seen, self.keep_only = set(), keep_only
        self.pad = transformers.DataCollatorWithPadding(TOKENIZER)

    def __call__(self, features):
        self.seen |= set(features[0])
        if self.keep_only:
            features = [{k: f[k] for k in self.keep_only if k in f} for f in features]
        return self.pad(features)


def test_unused_columns_are_dropped_labels_kept_and_logged_once(caplog):
    recorder = KeyRecorder()
    model = Model(tiny_bert()).compile("adamw", learning_rate=1e-3)
    with caplog.at_level(logging.INFO, logger="fitkit"):
        model.fit(tokenized(), validation_data=tokenized(16), batch_size=8, data_collator=recorder, verbose=0,
                  epochs=2)
    assert recorder.seen == set(tokenized().column_names) - {"text", "idx"} and "label" in recorder.seen
    notes = [r.getMessage() for r in caplog.records if "not arguments of" in r.getMessage()]
    assert len(notes) == 2 and all("text, idx" in n for n in notes)  # training data, validation data: once each


def test_remove_unused_columns_false_keeps_them():
    recorder = KeyRecorder(keep_only=["input_ids", "attention_mask", "label"])
    model = Model(tiny_bert()).compile("adamw", learning_rate=1e-3)
    model.fit(tokenized(), batch_size=8, data_collator=recorder, remove_unused_columns=False, verbose=0)
    assert {"text", "idx"} <= recorder.seen


class StrictNet(torch.nn.Module):
    """Takes `features` only: an extra keyword would fail."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, features):
        return self.lin(features)


def test_keys_of_per_sample_dicts_are_dropped_for_a_plain_module():
    rows = [{"features": [float(i), 1.0, -1.0], "label": i % 2, "note": "x", "id": i} for i in range(16)]
    model = Model(StrictNet()).compile("adam", "cross_entropy")
    model.fit(rows, batch_size=4, verbose=0)
    assert model.state.global_step == 4


def test_an_iterable_dataset_loses_the_columns_the_hf_trainer_drops(tmp_path):
    theirs = KeyRecorder()
    trainer = transformers.Trainer(model=tiny_bert(), args=hf_args(tmp_path, max_steps=3),
                                   train_dataset=tokenized().to_iterable_dataset(), data_collator=theirs)
    trainer.train()
    ours = KeyRecorder()
    model = Model(tiny_bert()).compile("adamw", learning_rate=1e-3)
    model.fit(tokenized().to_iterable_dataset(), batch_size=8, data_collator=ours, verbose=0)
    assert ours.seen == theirs.seen == set(tokenized().column_names) - {"text", "idx"}
    assert model.state.global_step == 6
    kept = KeyRecorder(keep_only=["input_ids", "attention_mask", "label"])
    model.fit(tokenized().to_iterable_dataset(), batch_size=8, data_collator=kept, remove_unused_columns=False,
              verbose=0)
    assert {"text", "idx"} <= kept.seen


def test_a_torch_iterable_dataset_of_dicts_keeps_its_state_and_loses_unused_keys():
    class Rows(torch.utils.data.IterableDataset):
        def __init__(self):
            self.loaded = None

        def __iter__(self):
            for i in range(16):
                yield {"features": torch.tensor([float(i), 1.0, -1.0]), "label": i % 2, "note": "x", "id": i}

        def state_dict(self):
            return {"at": 0}

        def load_state_dict(self, state):
            self.loaded = state

    from fitkit.engine.data.loader_parts import stateful_parts

    model = Model(StrictNet()).compile("adam", "cross_entropy")
    model.fit(Rows(), batch_size=4, verbose=0)
    assert model.state.global_step == 4
    wrapped = drop_unused_columns(Rows(), StrictNet(), model.training_arguments())
    first = next(iter(wrapped))
    assert list(first) == ["features", "label"] and first["features"].tolist() == [0.0, 1.0, -1.0]
    assert stateful_parts(torch.utils.data.DataLoader(wrapped, batch_size=4)) == [wrapped]
    wrapped.load_state_dict({"at": 3})
    assert wrapped.dataset.loaded == {"at": 3}  # the dataset's own state, reached through the filter


def test_an_iterable_dataset_of_dicts_is_batched_as_the_hf_trainer_batches_it(tmp_path):
    class Net(torch.nn.Module):
        """Returns its loss, as an HF model does; records what each training forward receives."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin, self.seen = torch.nn.Linear(3, 2), []

        def forward(self, features, labels=None):
            if self.training:
                self.seen.append({"features": (tuple(features.shape), str(features.dtype)),
                                  "labels": (tuple(labels.shape), str(labels.dtype))})
            logits = self.lin(features)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Rows(torch.utils.data.IterableDataset):  # lists and ints, as a tokenizer's output is
        def __iter__(self):
            for i in range(16):
                yield {"features": [float(i % 5), 1.0, -1.0], "label": i % 2, "note": "x"}

    theirs = Net()
    transformers.Trainer(model=theirs, args=hf_args(tmp_path, max_steps=4, per_device_train_batch_size=4),
                         train_dataset=Rows()).train()
    ours = Net()
    Model(ours).compile("sgd", learning_rate=1e-2).fit(Rows(), batch_size=4, verbose=0)
    assert ours.seen == theirs.seen == [{"features": ((4, 3), "torch.float32"), "labels": ((4,), "torch.int64")}] * 4


def test_no_column_matching_forward_is_an_error_naming_both():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.lin(x)

    rows = [{"features": [float(i), 1.0, -1.0], "label": i % 2} for i in range(8)]
    with pytest.raises(ValueError, match=r"no column of `x` \(features, label\) is an argument of Net.forward \(x\)"):
        Model(Net()).compile("adam", "cross_entropy").fit(rows, batch_size=4, verbose=0)


# -- processing_class ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["processing_class", "tokenizer"])
def test_processing_class_pads_without_a_collator_and_is_saved(tmp_path, name):
    model = Model(tiny_bert()).compile("adamw", learning_rate=1e-3)
    model.fit(tokenized(), batch_size=8, verbose=0, save_strategy="epoch", output_dir=str(tmp_path),
              **{name: TOKENIZER})
    checkpoint = tmp_path / "checkpoint-6"
    assert (checkpoint / "tokenizer.json").is_file() and (checkpoint / "config.json").is_file()
    again = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    assert again("good film")["input_ids"] == TOKENIZER("good film")["input_ids"]


# -- args= merged with compile and fit options ------------------------------------------------------
def test_args_keep_what_compile_was_given(tmp_path):
    collate, metrics = transformers.DataCollatorWithPadding(TOKENIZER), accuracy
    model = Model(tiny_bert()).compile(learning_rate=3e-3, data_collator=collate, compute_metrics=metrics,
                                       lr_scheduler="constant")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no conflict: nothing to warn about
        run = model.training_arguments(hf_args(tmp_path, learning_rate=5e-5, num_train_epochs=2), epochs=None)
    assert run.data_collator is collate and run.compute_metrics is metrics  # not given by args=: compile's
    assert run.lr_scheduler == "constant"  # HF's default "linear" in args= is not "given"
    assert run.learning_rate == 3e-3  # HF's default 5e-5 is not "given" either
    assert run.num_train_epochs == 2 and run.optim.startswith("adamw_torch")  # compile's default optimizer: HF's


def test_conflicting_values_are_named_and_the_rule_applied(tmp_path):
    model = Model(tiny_bert()).compile("sgd", learning_rate=1e-2, max_grad_norm=2.0)
    with pytest.warns(UserWarning) as record:
        run = model.training_arguments(hf_args(tmp_path, learning_rate=3e-4, optim="adafactor", max_grad_norm=0.5),
                                       max_grad_norm=0.25)
    text = " ".join(str(w.message) for w in record)
    assert "compile(learning_rate=0.01) and args.learning_rate=0.0003" in text
    assert "args.optim='adafactor'" in text and "fit(max_grad_norm=0.25)" in text
    assert run.learning_rate == 3e-4 and run.optim == "adafactor" and run.max_grad_norm == 0.25
    sgd = Model(tiny_bert()).compile("sgd").training_arguments(hf_args(tmp_path))
    assert sgd.optim is None  # compile's optimizer, not HF's default adamw


def test_fitkit_arguments_merge_the_same_way():
    model = Model(torch.nn.Linear(2, 2)).compile(learning_rate=0.5, devices=1)
    run = model.training_arguments(TrainingArguments(num_train_epochs=3))
    assert run.learning_rate == 0.5 and run.num_train_epochs == 3 and run.devices == 1


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", stress_only("ddp_spawn")])
def test_args_with_compile_device_options_on_two_processes(tmp_path, strategy):
    script = os.path.join(ROOT, "tests", "scripts", "hf_args_ddp.py")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, script, str(tmp_path), strategy], capture_output=True, text=True,
                          timeout=400, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    ranks = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in tmp_path.glob("world-*.json")}
    assert sorted(ranks) == [0, 1] and all(r["world"] == 2 for r in ranks.values())  # really 2 processes
    if strategy == "ddp":  # the second process ran this script again, built its TrainingArguments, got RANK
        assert ranks[1]["RANK"] == "1"
    assert result["global_step"] == 2 * 4  # 32 samples over 2 processes x 4: 4 steps an epoch, 2 epochs
    assert "val_accuracy" in result["history"] and "accuracy" in result["metrics"]  # compile's compute_metrics
    assert result["collate"] > 0 or strategy == "ddp_spawn"  # compile's collator (spawned: it ran in the children)


# -- evaluate and predict reuse fit's data options ----------------------------------------------------
def test_evaluate_and_predict_use_the_collator_and_metrics_of_the_last_fit():
    model = Model(tiny_bert()).compile("adamw", learning_rate=1e-3)
    data = tokenized()
    model.fit(data, batch_size=8, verbose=0, data_collator=transformers.DataCollatorWithPadding(TOKENIZER),
              compute_metrics=accuracy)
    metrics = model.evaluate(data, verbose=0, batch_size=16, return_dict=True)
    assert set(metrics) >= {"loss", "accuracy"}
    logits = model.predict(data, verbose=0, batch_size=16)["logits"]  # the model's output, a dict of tensors
    assert logits.shape == (48, 2)
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(-1) == torch.tensor(LABELS)).float().mean()))
    plain = model.evaluate(data, verbose=0, batch_size=16, compute_metrics=lambda p: {"seen": float(len(p[1]))}, return_dict=True)
    assert plain["seen"] == 48.0  # given to evaluate: wins over fit's


# -- weight decay ------------------------------------------------------------------------------------------
def test_hf_decay_groups_equal_the_trainers(tmp_path):
    net = tiny_bert()
    args = hf_args(tmp_path, weight_decay=0.1)
    expected = transformers.Trainer(model=net, args=args).get_decay_parameter_names(net)
    model = Model(net).compile()
    model.fit(tokenized(keep_text=False), args=args, data_collator=transformers.DataCollatorWithPadding(TOKENIZER),
              max_steps=1)
    names = {id(p): n for n, p in net.named_parameters()}
    groups = model.optimizer.param_groups
    assert sorted(names[id(p)] for p in groups[0]["params"]) == sorted(expected)
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert len(groups[0]["params"]) + len(groups[1]["params"]) == len(list(net.parameters()))


def test_exclude_from_weight_decay_switch():
    from fitkit.adapters.weight_decay import parameter_groups

    net = tiny_bert()
    names = {id(p): n for n, p in net.named_parameters()}
    own = parameter_groups(net, "adamw", TrainingArguments(exclude_from_weight_decay=["bias$"]))
    assert all(names[id(p)].endswith("bias") for p in own[1]["params"])
    assert len(own[1]["params"]) == sum(n.endswith("bias") for n in names.values())
    everything = parameter_groups(net, "adamw", TrainingArguments(optim="adamw_torch", exclude_from_weight_decay=[]))
    assert len(list(everything)) == len(names)  # no groups: all decayed
    assert len(list(parameter_groups(net, "adamw", TrainingArguments()))) == len(names)  # fitkit's names: Keras'
    with pytest.raises(ValueError, match="exclude_from_weight_decay"):
        TrainingArguments(exclude_from_weight_decay="bias")


# -- the logged loss under gradient accumulation ---------------------------------------------------------
class NoKwargsClassifier(torch.nn.Module):
    """An HF-style model whose forward takes no **kwargs (so the HF Trainer averages micro-batches)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.EmbeddingBag(TOKENIZER.vocab_size, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def _losses(log_history):
    return [r["loss"] for r in log_history if "loss" in r and "train_runtime" not in r]


def test_logged_loss_under_accumulation_equals_the_hf_trainers(tmp_path):
    data = tokenized(keep_text=False)
    collator = transformers.DataCollatorWithPadding(TOKENIZER, padding="max_length", max_length=24)
    args = hf_args(tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=4, logging_steps=1,
                   logging_strategy="steps", num_train_epochs=1, learning_rate=0.05)

    class InOrder(transformers.Trainer):  # the same data order as fitkit's shuffle=False
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    hf_net = NoKwargsClassifier()
    trainer = InOrder(model=hf_net, args=args, train_dataset=data, data_collator=collator)
    trainer.train()
    net = NoKwargsClassifier()
    model = Model(net).compile()
    model.fit(data, args=args, data_collator=collator, shuffle=False)
    theirs, ours = _losses(trainer.state.log_history), _losses(model.state.log_history)[:6]  # then the epoch's
    assert len(ours) == len(theirs) == 6
    assert ours == pytest.approx(theirs, abs=2e-4)  # HF rounds its logged loss to 4 decimals
    for a, b in zip(hf_net.parameters(), net.parameters()):  # the same gradients, stepped the same way
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_logged_loss_of_an_hf_bert_is_the_windows_sum_as_the_trainers(tmp_path):
    """transformers 5.x: BERT's forward takes **kwargs and ignores `num_items_in_batch`, so the
    Trainer does not divide by the window's length; fitkit's Trainer face does the same."""
    data = tokenized(16, keep_text=False)
    collator = transformers.DataCollatorWithPadding(TOKENIZER)
    net = tiny_bert()
    with torch.no_grad():  # the first window's micro-batch losses, at the initial weights
        first = [net(**collator([data[i] for i in range(j, j + 4)])).loss.item() for j in (0, 4)]
    model = Model(net).compile()
    model.fit(data, args=hf_args(tmp_path, gradient_accumulation_steps=2, per_device_train_batch_size=4,
                                 logging_steps=1, logging_strategy="steps"), data_collator=collator, shuffle=False)
    assert _losses(model.state.log_history)[0] == pytest.approx(sum(first), rel=1e-4)

    class InOrder(transformers.Trainer):
        def _get_train_sampler(self, *a, **k):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    trainer = InOrder(model=tiny_bert(), args=hf_args(tmp_path, gradient_accumulation_steps=2, max_steps=1,
                                                      per_device_train_batch_size=4, logging_steps=1),
                      train_dataset=data, data_collator=collator)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(sum(first), rel=1e-4)


# -- checkpoints hold what from_pretrained reads --------------------------------------------------------------
def test_checkpoints_open_with_from_pretrained_and_still_resume(tmp_path):
    from fitkit.engine.checkpoint.verify import verify

    net = tiny_bert()
    model = Model(net).compile()
    args = hf_args(tmp_path, save_strategy="epoch", num_train_epochs=2)
    model.fit(tokenized(), args=args, processing_class=TOKENIZER)
    checkpoint = str(tmp_path / "out" / "checkpoint-12")
    manifest = verify(checkpoint)
    assert {"config.json", "model.safetensors", "tokenizer.json", "state.pt"} <= set(manifest["files"])
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    for name, value in net.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)
    again = Model(tiny_bert(seed=5)).compile()
    again.fit(tokenized(), args=hf_args(tmp_path, save_strategy="epoch", num_train_epochs=3),
              processing_class=TOKENIZER, resume_from_checkpoint=checkpoint)
    assert again.state.global_step == 18
    saved = model.save_model(str(tmp_path / "final"))
    assert os.path.isfile(os.path.join(saved, "model.safetensors"))


# -- the offline text-classification example, with transformers.Trainer and with fitkit -------------------------
def _run_example(trainer, tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "text_classification.py"), "--trainer",
                           trainer, "--output-dir", str(tmp_path / trainer)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_text_classification_example_matches_the_hf_trainer(tmp_path):
    hf, ours = _run_example("hf", tmp_path), _run_example("fitkit", tmp_path)
    assert ours["epochs"] == hf["epochs"] < 8  # stopped early, after as many epochs
    assert ours["best_step"] == hf["best_step"]
    assert abs(ours["accuracy"] - hf["accuracy"]) <= 0.05
    best = transformers.AutoModelForSequenceClassification.from_pretrained(ours["best_checkpoint"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(ours["best_checkpoint"])
    texts, _ = make_texts(64, seed=2)
    with torch.no_grad():
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        assert best(**batch).logits.argmax(-1).tolist() == ours["predictions"]


@pytest.mark.slow
def test_the_benchmark_scenario_runs():
    from benchmarks.hf_finetune import measure, table

    result = measure(reps=1, log=lambda s: None)
    assert set(result["ratios"]) == {"fitkit/hf_trainer", "fitkit/hand_loop", "first step fitkit/hf_trainer"}
    assert "| fitkit |" in table(result)


def test_processes_of_the_script_launcher_get_rank():
    from fitkit.common.launch_env import MARKER, complete

    env = {MARKER: "2", "LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4"}
    complete(env)
    assert env["RANK"] == "3" and env["LOCAL_WORLD_SIZE"] == "2"
    torchrun = {"LOCAL_RANK": "1", "RANK": "5"}
    complete(torchrun)  # not started by fitkit's launch, or RANK already there: untouched
    assert torchrun == {"LOCAL_RANK": "1", "RANK": "5"}
    plain = {"LOCAL_RANK": "1"}
    complete(plain)
    assert "RANK" not in plain
