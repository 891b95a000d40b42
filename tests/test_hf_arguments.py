"""Hugging Face arguments and data habits in `fit`: `args=transformers.TrainingArguments(...)`,
HF field names, `compute_metrics(EvalPrediction)`, `data_collator` and per-sample dicts."""

import glob
import os
import warnings

import numpy as np
import pytest
import torch
from helpers import blobs, mlp

from fitkit import Model, TrainingArguments
from fitkit.engine.data.collate import SampleList, default_data_collator, is_sample_list
from fitkit.engine.eval_prediction import EvalPrediction

transformers = pytest.importorskip("transformers")


class KeywordMLP(torch.nn.Module):
    """Takes its input by keyword, as a Hugging Face model does."""

    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, features):
        return self.net(features)


def samples(n=48, seed=0):
    x, y = blobs(n, seed)
    return [{"features": x[i].tolist(), "label": int(y[i])} for i in range(n)]


def _fit_options(**options):
    return {"epochs": 2, "batch_size": 16, "verbose": 0, "seed": 0, **options}


# -- args=transformers.TrainingArguments(...) ----------------------------------------------------------
@pytest.fixture(scope="module")
def hf_args(tmp_path_factory):
    pytest.importorskip("accelerate")  # transformers' TrainingArguments needs it to be built
    out = tmp_path_factory.mktemp("hf")
    return transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=8, per_device_eval_batch_size=4, num_train_epochs=2,
        learning_rate=0.02, optim="sgd", lr_scheduler_type="constant", eval_strategy="epoch", save_strategy="epoch",
        logging_strategy="epoch", metric_for_best_model="accuracy", report_to="none", max_grad_norm=0.0)


def test_hf_training_arguments_are_honoured(hf_args):
    x, y = blobs(64, 0)
    model = Model(mlp()).compile("adam", "cross_entropy", ["accuracy"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, validation_split=0.25, args=hf_args, verbose=0)
    assert not [w for w in caught if "cannot honour" in str(w.message)]
    assert model.state.max_steps == 12  # 48 samples / 8 a batch, 2 epochs
    optimizer = model.optimizer.optimizer if hasattr(model.optimizer, "optimizer") else model.optimizer
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["lr"] == 0.02
    assert len(history.history["val_loss"]) == 2
    saved = sorted(os.path.basename(p) for p in glob.glob(os.path.join(hf_args.output_dir, "checkpoint-*")))
    assert saved == ["checkpoint-12", "checkpoint-6"]
    assert model.state.best_metric == max(history.history["val_accuracy"])  # "accuracy": eval's, greater is better


def test_hf_fields_fitkit_cannot_honour_are_named_in_one_warning(hf_args):
    import dataclasses

    odd = dataclasses.replace(hf_args, use_liger_kernel=True, hub_model_id="me/model", optim="adamw_8bit")
    x, y = blobs(32, 0)
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.warns(UserWarning, match="cannot honour") as caught:
        model.fit(x, y, args=odd, save_strategy="no", eval_strategy="no", verbose=0)
    messages = [str(w.message) for w in caught if "cannot honour" in str(w.message)]
    assert len(messages) == 1
    for name in ("use_liger_kernel", "hub_model_id", "optim='adamw_8bit'"):
        assert name in messages[0]


# -- HF names in fit / compile / TrainingArguments ------------------------------------------------------
def test_hf_names_map_onto_fitkit_fields():
    args = TrainingArguments(fp16=True, disable_tqdm=True, lr_scheduler_type="linear", evaluation_strategy="epoch",
                             optim="adamw_torch_fused", per_device_train_batch_size=4, run_name="r", logging_dir="tb")
    assert (args.precision, args.verbose, args.lr_scheduler, args.eval_strategy) == ("16-mixed", 0, "linear", "epoch")
    assert (args.optim, args.batch_size, args.run_name, args.logging_dir) == ("adamw_torch_fused", 4, "r", "tb")
    assert TrainingArguments(bf16=True).precision == "bf16-mixed"
    assert TrainingArguments(fp16=False).precision is None
    model = Model(mlp()).compile("adam", "mse", bf16=True, dataloader_num_workers=2)
    run = model.training_arguments(disable_tqdm=True, use_cpu=True)
    assert (run.precision, run.dataloader_num_workers, run.verbose, run.accelerator) == ("bf16-mixed", 2, 0, "cpu")


def test_hf_name_errors_say_what_to_pass():
    with pytest.raises(ValueError, match="`optim`='adamw_8bit' is invalid.*adamw_torch"):
        TrainingArguments(optim="adamw_8bit")
    with pytest.raises(ValueError, match="`fp16`=True and `precision`='bf16-mixed' disagree"):
        TrainingArguments(fp16=True, precision="bf16-mixed")
    with pytest.raises(TypeError, match="unknown option 'no_such_field'"):
        TrainingArguments(no_such_field=1)
    with pytest.warns(UserWarning, match=r"ignored: hub_model_id, use_liger_kernel \(") as caught:
        TrainingArguments(use_liger_kernel=True, hub_model_id="me/model", num_train_epochs=2)
    assert len([w for w in caught if "cannot honour" in str(w.message)]) == 1


def test_optim_builds_the_optimizer_it_names():
    x, y = blobs(32, 0)
    model = Model(mlp()).compile("sgd", "cross_entropy")
    model.fit(x, y, optim="adamw_torch", learning_rate=0.003, **_fit_options())
    optimizer = getattr(model.optimizer, "optimizer", model.optimizer)
    assert type(optimizer) is torch.optim.AdamW and optimizer.param_groups[0]["lr"] == 0.003


def test_logging_dir_is_where_tensorboard_writes(tmp_path):
    pytest.importorskip("tensorboard")
    x, y = blobs(32, 0)
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, report_to="tensorboard", output_dir=str(tmp_path / "out"), logging_dir=str(tmp_path / "tb"),
              **_fit_options())
    assert glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert not glob.glob(str(tmp_path / "out" / "runs" / "*"))


class Checkpointable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net, self.enabled = mlp(), 0

    def gradient_checkpointing_enable(self):
        self.enabled += 1

    def forward(self, x):
        return self.net(x)


def test_gradient_checkpointing_calls_the_modules_own_switch_or_warns():
    x, y = blobs(32, 0)
    module = Checkpointable()
    Model(module).compile("adam", "cross_entropy").fit(x, y, gradient_checkpointing=True, **_fit_options())
    assert module.enabled == 1
    with pytest.warns(UserWarning, match="gradient_checkpointing.*Sequential has no gradient_checkpointing_enable"):
        Model(mlp()).compile("adam", "cross_entropy").fit(x, y, gradient_checkpointing=True, **_fit_options())


# -- compute_metrics --------------------------------------------------------------------------------------
def test_compute_metrics_sees_the_whole_evaluation_set_and_its_values_are_logged():
    calls = []

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        calls.append((logits.shape, labels.shape, type(eval_pred).__name__))
        return {"my_accuracy": float((logits.argmax(-1) == labels).mean()), "eval_count": len(labels)}

    seen = []

    class HFWatcher(transformers.TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            seen.append(dict(metrics))

    x, y = blobs(80, 0)
    model = Model(mlp()).compile("sgd", "cross_entropy", ["accuracy"], learning_rate=0.05)
    history = model.fit(x, y, validation_split=0.25, compute_metrics=compute_metrics, callbacks=[HFWatcher()],
                        **_fit_options())
    assert calls == [((20, 3), (20,), "EvalPrediction")] * 2  # once per evaluation, every sample gathered
    assert history.history["val_my_accuracy"] == pytest.approx(history.history["val_accuracy"])
    assert history.history["val_count"] == [20.0, 20.0]  # "eval_count" is val_count in fitkit's names
    assert seen[0]["eval_my_accuracy"] == history.history["val_my_accuracy"][0] and "eval_count" in seen[0]
    # evaluate() with compile's compute_metrics: unprefixed values, as fitkit's evaluate gives them
    model.compile("sgd", "cross_entropy", ["accuracy"], compute_metrics=compute_metrics)
    result = model.evaluate(x[:40], y[:40], verbose=0, return_dict=True)
    assert result["my_accuracy"] == pytest.approx(result["accuracy"]) and result["count"] == 40


def test_compute_metrics_gets_logits_of_a_dict_output():
    class HFLike(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def forward(self, features, labels=None):
            logits = self.net(features)
            loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
            return {"loss": loss, "logits": logits}

    got = {}

    def compute_metrics(eval_pred):
        got["predictions"], got["labels"] = eval_pred.predictions, eval_pred.label_ids
        return {"mean_label": float(np.mean(eval_pred.label_ids))}

    data = samples(48)
    model = Model(HFLike()).compile("adam", loss=None)
    history = model.fit(data[:32], validation_data=data[32:], compute_metrics=compute_metrics, **_fit_options())
    assert got["predictions"].shape == (16, 3) and isinstance(got["predictions"], np.ndarray)
    assert got["labels"].tolist() == [s["label"] for s in data[32:]]
    assert history.history["val_mean_label"][-1] == pytest.approx(np.mean([s["label"] for s in data[32:]]))
    assert EvalPrediction(1, 2)[1] == 2 and len(EvalPrediction(1, 2, 3)) == 3


# -- per-sample dicts and data_collator ----------------------------------------------------------------
def test_default_collation_stacks_each_key_and_names_the_labels():
    batch = default_data_collator([{"ids": [1, 2], "label": 1, "text": "a"}, {"ids": [3, 4], "label": 0, "text": "b"}])
    assert set(batch) == {"ids", "labels"}
    assert batch["ids"].tolist() == [[1, 2], [3, 4]] and batch["labels"].dtype == torch.int64
    floats = default_data_collator([{"x": torch.ones(2), "label": 0.5}, {"x": torch.zeros(2), "label": 1.5}])
    assert floats["labels"].dtype == torch.float32 and floats["x"].shape == (2, 2)
    assert is_sample_list(samples(4)) and not is_sample_list([{"x": torch.ones(4, 2), "labels": torch.ones(4)}])


def test_a_list_of_per_sample_dicts_trains_as_the_same_tensors_do():
    data = samples(48)
    x = torch.tensor([s["features"] for s in data])
    y = torch.tensor([s["label"] for s in data])
    as_dicts = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    h1 = as_dicts.fit(data, shuffle=False, **_fit_options())
    as_tensors = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    h2 = as_tensors.fit({"features": x}, y, shuffle=False, **_fit_options())
    assert as_dicts.state.max_steps == 6  # 48 samples in batches of 16, two epochs: not 48 "batches"
    assert h1.history["loss"] == pytest.approx(h2.history["loss"], rel=1e-6)
    assert h1.history["loss"][1] < h1.history["loss"][0]


def test_a_datasets_dataset_is_read_a_batch_at_a_time_as_its_rows_would_be(monkeypatch):
    # one Arrow read per batch (`__getitems__`, as a DataLoader over the dataset reads it), not one per row
    datasets = pytest.importorskip("datasets")
    data = samples(48)
    rows = datasets.Dataset.from_list(data)
    assert SampleList(rows).__getitems__([5, 0, 7]) == [rows[5], rows[0], rows[7]] == [data[5], data[0], data[7]]
    assert SampleList(data).__getitems__([2, 1]) == [data[2], data[1]]  # a list: item by item
    reads = []
    original = datasets.Dataset.__getitems__
    monkeypatch.setattr(datasets.Dataset, "__getitems__", lambda self, keys: reads.append(len(keys)) or original(self, keys))
    from_rows = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    h1 = from_rows.fit(rows, shuffle=False, **_fit_options())
    from_list = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    h2 = from_list.fit(data, shuffle=False, **_fit_options())
    assert reads == [16] * 6  # 3 batches in each of 2 epochs (the checks read the first step's batch)
    assert h1.history["loss"] == pytest.approx(h2.history["loss"], rel=1e-6)


def test_data_collator_builds_the_batches():
    calls = []

    def collate(features):
        calls.append(len(features))
        return {"features": torch.tensor([f["features"] for f in features]),
                "labels": torch.tensor([f["label"] for f in features])}

    model = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    model.fit(samples(40), data_collator=collate, **_fit_options(epochs=1))
    assert calls[-3:] == [16, 16, 8] and model.state.global_step == 3


def test_dataloader_num_workers_reach_the_loader_fitkit_builds():
    seen = []

    class Watch(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            seen.append((args.dataloader_num_workers, getattr(train_dataloader, "num_workers", None)))

    model = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    model.fit(samples(32), dataloader_num_workers=1, callbacks=[Watch()], **_fit_options(epochs=1))
    assert seen == [(1, 1)] and model.state.global_step == 2


def test_label_names_other_than_the_label_keys_are_warned_about():
    x, y = blobs(32, 0)
    model = Model(mlp()).compile("adam", "cross_entropy")
    with pytest.warns(UserWarning, match=r"`label_names`=\['start_positions'\] is not honoured"):
        model.fit(x, y, label_names=["start_positions"], **_fit_options(epochs=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, y, label_names=["labels"], **_fit_options(epochs=1))


# -- the migration page ------------------------------------------------------------------------------------
def test_the_migrating_from_hf_page_runs(tmp_path, monkeypatch, capsys):
    """The page's HF script, converted by its imports and the training line, runs as it is shown."""
    import re

    pytest.importorskip("accelerate")
    page = os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs", "migrating-from-hf.md")
    with open(page) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    common, hf_script, fitkit_script = blocks[0], blocks[1], blocks[2]
    assert "Trainer(" in hf_script and "Trainer(" not in fitkit_script
    arguments = [re.search(r"args = TrainingArguments\(.*?\)\n", text, re.S) for text in (hf_script, fitkit_script)]
    assert arguments[0] and arguments[1]
    same = [re.sub(r'output_dir="[^"]*"', "output_dir=...", m.group(0)) for m in arguments]
    assert same[0] == same[1]  # the same TrainingArguments; fitkit writes beside the Trainer's out/, not into it
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "migrating"}
    exec(compile(common + "\n" + fitkit_script, page, "exec"), namespace)
    history = namespace["history"].history
    assert len(history["val_accuracy"]) >= 3 and max(history["val_accuracy"]) > 0.9  # learnt the rule
    assert glob.glob(str(tmp_path / "out_fitkit" / "checkpoint-*"))
    assert str(history["val_accuracy"]) in capsys.readouterr().out


@pytest.mark.slow
def test_per_sample_dicts_and_compute_metrics_on_two_processes(tmp_path):
    import json
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "scripts", "hf_data_ddp.py")
    proc = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["global_step"] == 2 * 4  # 64 samples, 2 processes x 8 a batch: 4 steps an epoch
    history = result["history"]
    assert history["val_my_accuracy"] == pytest.approx(history["val_accuracy"])  # over all 37, as torchmetrics
    calls = [json.loads(p.read_text()) for p in tmp_path.glob("call-*.json")]
    assert len(calls) == 2 * 2  # each process, each evaluation
    for call in calls:  # every process got all 37 labels, in the data's order (19 + 18 gathered)
        assert call["rows"] == 37 and call["labels"] == result["val_labels"]


class DictSamples(torch.utils.data.Dataset):
    """A map-style torch Dataset of per-sample dicts, as `dataset.with_format("torch")` gives them."""

    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        return {"features": torch.tensor(row["features"]), "label": torch.tensor(row["label"]), "id": f"s{i}"}


def test_a_torch_dataset_of_dicts_gets_the_same_collation():
    rows = samples(48)
    first = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    h1 = first.fit(DictSamples(rows), shuffle=False, **_fit_options())
    second = Model(KeywordMLP()).compile("sgd", "cross_entropy", learning_rate=0.1)
    h2 = second.fit(rows, shuffle=False, **_fit_options())
    assert first.state.max_steps == 6 and h1.history["loss"] == pytest.approx(h2.history["loss"], rel=1e-6)
