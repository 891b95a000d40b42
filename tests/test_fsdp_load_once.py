"""Pretrained weights loaded once under FSDP (`fsdp_load_once=True`, Hugging Face's
`fsdp_config={"cpu_ram_efficient_loading": True}`): `model_init` runs in rank 0 alone, the others
build nothing (the module reaches them on the meta device) and receive rank 0's values shard by
shard; search trials under FSDP are built as `fit` builds them. Two-process runs on CPU (gloo)
of tests/scripts/fsdp_load_once.py, on a tiny BERT written by `save_pretrained`."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import reserved_port

from fitkit import Model, TrainingArguments
from fitkit.engine.data.rng import seed_everything
from fitkit.engine.devices.deferred_init import build_on_meta
from fitkit.engine.devices.load_once import from_structure, structure_of

transformers = pytest.importorskip("transformers")

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_load_once.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import fsdp_load_once as script  # noqa: E402


def _pretrained(path):
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, num_labels=2)
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(path)
    return transformers.AutoModelForSequenceClassification.from_pretrained(path)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fsdp_load_once")
    pretrained = _pretrained(tmp / "pretrained")
    results = tmp / "results"
    results.mkdir()
    with reserved_port() as port:
        proc = subprocess.run([sys.executable, SCRIPT, "--results", str(results), "--pretrained", str(tmp / "pretrained")],
                              capture_output=True, text=True, timeout=600, env=dict(os.environ, MASTER_PORT=str(port)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads((results / f"rank-{rank}.json").read_text()) for rank in (0, 1)], pretrained


def _equal(weights, reference):
    """The names whose values differ from `reference`'s (a module), every parameter and buffer."""
    tensors = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert set(weights) == set(tensors)
    return [n for n, v in weights.items()
            if not torch.equal(torch.tensor(v, dtype=tensors[n].dtype).reshape(tensors[n].shape), tensors[n].detach())]


@pytest.mark.slow
def test_model_init_runs_in_rank_0_alone_and_the_others_shard_a_meta_module(launched):
    runs, _ = launched
    assert runs[0]["once_calls"] == 1 and runs[0]["once_devices"] == ["cpu"]  # rank 0 loaded the weights
    assert runs[1]["once_calls"] == 0 and runs[1]["once_devices"] == ["meta"]  # rank 1 never held them whole
    assert runs[1]["each_calls"] >= 1 and runs[1]["each_devices"] == ["cpu"]  # without the option: loaded in each


@pytest.mark.slow
def test_every_process_starts_from_the_pretrained_weights(launched):
    runs, pretrained = launched
    for run in runs:  # whole tensors gathered from the shards, and the (unsharded) buffers
        assert _equal(run["once_initial"], pretrained) == []


@pytest.mark.slow
def test_training_equals_the_run_that_loads_in_every_process(launched):
    runs, _ = launched
    assert runs[0]["once_final"] != runs[0]["once_initial"]  # it trained
    for run in runs:
        assert run["once_final"] == run["each_final"]


@pytest.mark.slow
def test_search_trials_are_built_as_fit_builds_them_under_fsdp(launched):
    runs, pretrained = launched
    assert (runs[0]["search_calls"], runs[1]["search_calls"]) == (2, 0)  # load once: each trial's in rank 0
    assert runs[1]["search_devices"] == ["meta"]
    for run in runs:
        begins = run["search_weights"][::2]
        assert len(begins) == 2 and all(_equal(w, pretrained) == [] for w in begins)
    seed_everything(42)  # the search's seed, set before each trial's model_init
    eager = script.net()
    for run in runs:  # plain torch model_init: on meta in every process, initialized shard by shard
        assert run["plain_devices"] == ["meta"]
        for begin in run["plain_weights"][::2]:
            assert _equal(begin, eager) == []


def test_the_structure_sent_has_no_values_and_keeps_tied_weights():
    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=50, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    module = transformers.GPT2LMHeadModel(config)
    module.scale = torch.tensor(3.0)  # a plain tensor attribute travels with its value
    data = structure_of(module)
    assert len(data) < sum(p.numel() * 4 for p in module.parameters())
    copy = from_structure(data)
    assert type(copy) is type(module) and copy.config.n_embd == 16
    assert all(t.is_meta for t in [*copy.parameters(), *copy.buffers()])
    assert copy.lm_head.weight is copy.transformer.wte.weight
    assert [n for n, _ in copy.named_parameters()] == [n for n, _ in module.named_parameters()]
    assert torch.equal(copy.scale, module.scale)


def test_a_module_that_does_not_pickle_is_named():
    module = torch.nn.Linear(2, 2)
    module.act = lambda x: x
    with pytest.raises(TypeError, match="fsdp_load_once=True sends the structure of model_init's Linear"):
        structure_of(module)


def test_a_build_that_fails_on_meta_is_built_whole_with_a_warning(tmp_path):
    _pretrained(tmp_path)
    before = torch.random.get_rng_state()
    with pytest.warns(UserWarning, match="failed on the meta device .*fsdp_load_once=True"):
        assert build_on_meta(lambda: transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)) is None
    assert torch.equal(torch.random.get_rng_state(), before)


def test_hf_cpu_ram_efficient_loading_is_fsdp_load_once(tmp_path):
    model = Model(torch.nn.Linear(2, 2)).compile("sgd", "mse", strategy="fsdp", devices=2, accelerator="cpu")
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_cpu_ram_efficient_loading": "true"}))
    for config in ({"cpu_ram_efficient_loading": True}, str(path)):
        hf = transformers.TrainingArguments(output_dir=str(tmp_path), fsdp_config=config, report_to="none")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert model.training_arguments(hf).fsdp_load_once is True
    hf = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none",
                                        fsdp_config={"cpu_ram_efficient_loading": False, "xla": True})
    with pytest.warns(UserWarning, match="fsdp_config\\['xla'\\]"):  # PyTorch/XLA's FSDP: not here
        assert model.training_arguments(hf).fsdp_load_once is False


def test_fsdp_load_once_needs_strategy_fsdp():
    with pytest.raises(ValueError, match="`fsdp_load_once`=True applies to strategy='fsdp'.*strategy='ddp'"):
        Model(torch.nn.Linear(2, 2)).compile("sgd", "mse", strategy="ddp", fsdp_load_once=True)
    assert TrainingArguments(strategy="fsdp", fsdp_load_once=True).fsdp_load_once
