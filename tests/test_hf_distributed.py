"""Hugging Face's distributed-setup fields under `args=` (issue 46): `fsdp` and `fsdp_config` become
fitkit's `strategy="fsdp"` and `fsdp_*` options (Fabric's FSDP2 strategy with Accelerate's choice
of units), `deepspeed` a DeepSpeed config with the Trainer's "auto" values filled in,
`activation_checkpointing` the Trainer's `activation_checkpointing_enable` call, and
`accelerator_config` / `parallelism_config` named where they cannot apply. Each mapping is
checked down to the Fabric strategy object it builds; each bad value to its error. The
two-process FSDP runs compared with fitkit's own options are in tests/test_hf_fsdp_runs.py."""

import json
import warnings

import pytest
import torch

from fitkit import Model, TrainingArguments
from fitkit.config.hf_deepspeed import deepspeed_config, finalize_deepspeed
from fitkit.config.hf_distributed import HFWrapPolicy, accelerator_options, fsdp_options

transformers = pytest.importorskip("transformers")


def hf(tmp_path, **fields):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own deprecation notes (fsdp as a string)
        return transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, **fields)


def read(hf_args, strategy=None):
    """fitkit's arguments for `hf_args` under a compile with `strategy` (None: not given), and the warnings."""
    options = {} if strategy is None else {"strategy": strategy}
    model = Model(torch.nn.Linear(2, 2)).compile("sgd", "mse", devices=2, accelerator="cpu", **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = model.training_arguments(hf_args)
    return args, [str(w.message) for w in caught if "fitkit cannot honour" in str(w.message)]


def fabric_strategy(args):
    """The Fabric strategy object the run builds (the Fabric is made, not launched)."""
    from fitkit.engine.devices.fabric import _fabric

    return _fabric(args, "cpu").strategy


def test_fsdp_words_and_config_become_fitkits_fsdp_options(tmp_path):
    args, warned = read(hf(tmp_path, fsdp="shard_grad_op auto_wrap offload",
                           fsdp_config={"transformer_layer_cls_to_wrap": "BertLayer", "activation_checkpointing": True,
                                        "state_dict_type": "SHARDED_STATE_DICT"}))
    assert warned == []
    assert args.strategy == "fsdp"
    assert args.fsdp_wrap == HFWrapPolicy("TRANSFORMER_BASED_WRAP", ("BertLayer",), 0)
    assert (args.fsdp_reshard_after_forward, args.fsdp_cpu_offload, args.fsdp_activation_checkpointing) == (
        False, True, True)
    assert args.fsdp_full_checkpoint is False and args.fsdp_sharding == "full"
    settings = fabric_strategy(args).settings
    assert settings == {"wrap": args.fsdp_wrap, "sharding": "full", "reshard_after_forward": False,
                        "cpu_offload": True, "activation_checkpointing": True, "full_checkpoint": False}


def test_cpu_offload_is_fsdp2s_offload_policy():
    from torch.distributed.fsdp import CPUOffloadPolicy

    from fitkit.engine.devices.strategies import _shard_options

    assert isinstance(_shard_options("mesh", "mp", offload=True)["offload_policy"], CPUOffloadPolicy)
    assert "offload_policy" not in _shard_options("mesh", "mp", offload=False)  # a CPU run: in host memory already


def test_fsdp_true_takes_hfs_defaults(tmp_path):
    args, warned = read(hf(tmp_path, fsdp=True))
    assert warned == []
    assert args.strategy == "fsdp" and args.fsdp_full_checkpoint is True  # HF's FULL_STATE_DICT
    assert args.fsdp_reshard_after_forward is True and not args.fsdp_cpu_offload
    assert args.fsdp_wrap == HFWrapPolicy()  # the model's _no_split_modules
    strategy = fabric_strategy(args)
    assert type(strategy).__name__ == "FSDP2Strategy" and strategy.settings["full_checkpoint"] is True


def test_each_fsdp_config_key(tmp_path):
    options, unread = fsdp_options(True, {"fsdp_min_num_params": 100, "auto_wrap_policy": "SIZE_BASED_WRAP",
                                          "reshard_after_forward": "false", "cpu_offload": "true",
                                          "cpu_ram_efficient_loading": "true", "version": 2,
                                          "forward_prefetch": True, "backward_prefetch": "BACKWARD_PRE"})
    assert unread == []  # FSDP1's prefetch keys: HF's FSDP2 plugin does not read them either
    assert options["fsdp_wrap"] == HFWrapPolicy("SIZE_BASED_WRAP", None, 100)
    assert options["fsdp_reshard_after_forward"] is False and options["fsdp_cpu_offload"] is True
    assert options["fsdp_load_once"] is True
    assert fsdp_options("hybrid_shard", None)[0]["fsdp_sharding"] == "hybrid"
    # HF's words as given (a TrainingArguments built by HF has them in fsdp_config already)
    words = fsdp_options("shard_grad_op offload auto_wrap", None)[0]
    assert (words["fsdp_reshard_after_forward"], words["fsdp_cpu_offload"]) == (False, True)
    zero2 = fsdp_options(True, {"version": 1, "reshard_after_forward": "hybrid_shard_zero2"})[0]
    assert (zero2["fsdp_sharding"], zero2["fsdp_reshard_after_forward"]) == ("hybrid", False)
    assert fsdp_options(True, {"auto_wrap_policy": "NO_WRAP"})[0]["fsdp_wrap"].policy == "NO_WRAP"
    # FSDP1's tuning under version=1, and PyTorch/XLA's FSDP: named, fitkit runs FSDP2 on Fabric
    assert fsdp_options(True, {"version": 1, "limit_all_gathers": True, "xla": True,
                               "xla_fsdp_settings": {"a": 1}})[1] == ["limit_all_gathers", "xla", "xla_fsdp_settings"]
    assert fsdp_options(None, {"state_dict_type": "SHARDED_STATE_DICT"})[0] == {"fsdp_full_checkpoint": False}


def test_an_xla_key_is_named_in_the_warning(tmp_path):
    _, warned = read(hf(tmp_path, fsdp=True, fsdp_config={"xla_fsdp_grad_ckpt": True}))
    assert len(warned) == 1 and "fsdp_config['xla_fsdp_grad_ckpt']" in warned[0]


def test_the_wrap_policy_picks_accelerates_units():
    config = transformers.BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=16)
    bert = transformers.BertForSequenceClassification(config)
    by_name = HFWrapPolicy().for_module(bert)  # BERT's _no_split_modules
    assert [n for n, m in bert.named_modules() if by_name(m)] == [
        n for n, m in bert.named_modules() if type(m).__name__ in bert._no_split_modules]
    by_size = HFWrapPolicy("SIZE_BASED_WRAP", None, 1000).for_module(bert)
    assert all(sum(p.numel() for p in m.parameters()) > 1000 for m in bert.modules() if by_size(m))
    assert not any(HFWrapPolicy("SIZE_BASED_WRAP").for_module(bert)(m) for m in bert.modules())  # 0: none
    with pytest.raises(ValueError, match=r"transformer_layer_cls_to_wrap.*\['LlamaDecoderLayer'\] is no module"):
        HFWrapPolicy("TRANSFORMER_BASED_WRAP", ("LlamaDecoderLayer",)).for_module(bert)


@pytest.mark.parametrize(("fsdp", "config", "message"), [
    ("no_shard", None, "`fsdp`='no_shard' .*strategy='ddp'"),
    ("full_shard sideways", None, "`fsdp`: 'sideways' is not one of HF's words"),
    (True, {"auto_wrap_policy": "LAYER_WRAP"}, r"`fsdp_config\['auto_wrap_policy'\]`='LAYER_WRAP' is invalid"),
    (True, {"state_dict_type": "LOCAL_STATE_DICT"}, r"`fsdp_config\['state_dict_type'\]`='LOCAL_STATE_DICT'"),
    (True, {"version": 3}, r"`fsdp_config\['version'\]`=3 is invalid"),
    (True, {"min_num_params": -1}, r"`fsdp_config\['min_num_params'\]`=-1 is invalid"),
    (True, {"cpu_offload": "maybe"}, r"`fsdp_config\['cpu_offload'\]`='maybe' is invalid"),
    (True, {"transformer_layer_cls_to_wrap": [3]}, r"`fsdp_config\['transformer_layer_cls_to_wrap'\]`=\[3\]"),
    (True, "missing.json", "`fsdp_config`: 'missing.json' is neither a dict nor a readable JSON file"),
])
def test_bad_fsdp_values_are_errors_naming_the_key(fsdp, config, message):
    with pytest.raises(ValueError, match=message):
        fsdp_options(fsdp, config)


def test_fsdp_with_another_compiled_strategy_is_an_error_naming_both(tmp_path):
    with pytest.raises(ValueError, match=r"compile\(strategy='ddp'\) and the Hugging Face arguments' strategy "
                                         r"\('fsdp'"):
        read(hf(tmp_path, fsdp=True), strategy="ddp")
    assert read(hf(tmp_path, fsdp=True), strategy="fsdp")[0].strategy == "fsdp"


def test_fsdp_options_need_strategy_fsdp():
    for name, value in (("fsdp_reshard_after_forward", False), ("fsdp_cpu_offload", True),
                        ("fsdp_activation_checkpointing", True)):
        with pytest.raises(ValueError, match=f"`{name}`={value!r} applies to strategy='fsdp'.*strategy='ddp'"):
            Model(torch.nn.Linear(2, 2)).compile("sgd", "mse", strategy="ddp", **{name: value})
        assert getattr(TrainingArguments(strategy="fsdp", **{name: value}), name) == value


DS = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
      "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                        "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto"}}


def test_deepspeed_auto_values_are_filled_as_the_trainer_fills_them(tmp_path):
    from types import SimpleNamespace

    # the fields HF's HfTrainerDeepSpeedConfig reads (a real TrainingArguments with `deepspeed` needs the package)
    args = SimpleNamespace(**{name: getattr(hf(tmp_path), name) for name in (
        "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "fp16_full_eval", "bf16_full_eval")},
        per_device_train_batch_size=4, gradient_accumulation_steps=3, world_size=2, learning_rate=0.01,
        weight_decay=0.1, fp16=False, bf16=True, save_on_each_node=False, auto_find_batch_size=False)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DS))
    filled = deepspeed_config(str(path), args)
    assert (filled["train_micro_batch_size_per_gpu"], filled["gradient_accumulation_steps"],
            filled["train_batch_size"], filled["gradient_clipping"]) == (4, 3, 24, 1.0)
    assert filled["optimizer"]["params"] == {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1}
    assert filled["bf16"] == {"enabled": True} and filled["fp16"] == {"enabled": False}
    assert filled["scheduler"]["params"]["warmup_max_lr"] == 0.01 and filled["scheduler"]["params"]["warmup_min_lr"] == 0
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=16, vocab_size=20))
    finalize_deepspeed(filled, bert, num_training_steps=50, warmup=0.1)
    assert filled["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 64, "stage3_prefetch_bucket_size": 57,
                                           "stage3_param_persistence_threshold": 80}
    assert filled["scheduler"]["params"]["total_num_steps"] == 50
    assert filled["scheduler"]["params"]["warmup_num_steps"] == 5
    assert DS["train_batch_size"] == "auto"  # the user's config is not changed
    args.world_size = 1  # read before fitkit starts the processes: DeepSpeed derives train_batch_size itself
    assert "train_batch_size" not in deepspeed_config(DS, args)
    with pytest.raises(ValueError, match=r"`deepspeed`: .*train_micro_batch_size_per_gpu=8 vs "
                                         r"per_device_train_batch_size=4"):
        deepspeed_config({**DS, "train_micro_batch_size_per_gpu": 8}, args)
    with pytest.raises(ValueError, match=r"'zero_optimization.reduce_bucket_size'.*Linear has no config.hidden_size"):
        finalize_deepspeed(deepspeed_config(DS, args), torch.nn.Linear(2, 2), 10, 0)
    with pytest.raises(ValueError, match="`deepspeed`: 'nowhere.json' is neither a dict nor a readable JSON file"):
        deepspeed_config("nowhere.json", args)


def test_deepspeed_under_args_is_a_deepspeed_strategy_or_a_clear_error(tmp_path):
    hf_args = hf(tmp_path)
    object.__setattr__(hf_args, "deepspeed", {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}})
    args, warned = read(hf_args)
    assert warned == [] and args.strategy == {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
    from fitkit.engine.devices.strategies import deepspeed_strategy, is_deepspeed

    assert is_deepspeed(args.strategy)
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="deepspeed package is not installed: pip install deepspeed"):
            deepspeed_strategy(args.strategy)
    else:
        assert deepspeed_strategy(args.strategy).config["train_micro_batch_size_per_gpu"] == 8
    with pytest.raises(ValueError, match=r"\['scheduler.params.total_num_steps'\] are still 'auto'.*finalize_deepspeed"):
        deepspeed_strategy({"scheduler": {"params": {"total_num_steps": "auto", "warmup_min_lr": 0}}})
    object.__setattr__(hf_args, "fsdp", True)
    with pytest.raises(ValueError, match="`fsdp` and `deepspeed` are both set: pass only one"):
        read(hf_args)


def test_activation_checkpointing_is_the_trainers_call(tmp_path):
    calls = []

    class Net(torch.nn.Linear):
        is_gradient_checkpointing = False

        def activation_checkpointing_enable(self, **kwargs):
            calls.append(kwargs)

    args, _ = read(hf(tmp_path, activation_checkpointing=True,
                      activation_checkpointing_kwargs={"every_n_layers": 2, "use_reentrant": False}))
    assert args.gradient_checkpointing is True
    later = hf(tmp_path)  # set after HF mirrored them into gradient_checkpointing*: the new names are read
    object.__setattr__(later, "activation_checkpointing", True)
    object.__setattr__(later, "activation_checkpointing_kwargs", {"offload": True})
    assert (read(later)[0].gradient_checkpointing, read(later)[0].gradient_checkpointing_kwargs) == (
        True, {"offload": True})
    from fitkit.config.hf_arguments import prepare_module

    prepare_module(Net(2, 2), args)
    assert calls == [{"activation_checkpointing_kwargs": {"use_reentrant": False}, "every_n_layers": 2,
                      "offload": False}]
    hf_args = hf(tmp_path)
    object.__setattr__(hf_args, "activation_checkpointing_kwargs", ["offload"])
    with pytest.raises(ValueError, match="`activation_checkpointing_kwargs`=\\['offload'\\] is invalid: pass a dict"):
        read(hf_args)


def test_accelerator_config_entries_are_read_and_the_others_named(tmp_path):
    from transformers.trainer_pt_utils import AcceleratorConfig

    assert accelerator_options(AcceleratorConfig()) == ({"split_batches": False, "even_batches": True,
                                                         "use_seedable_sampler": True}, [])
    assert accelerator_options({"non_blocking": True, "even_batches": True})[1] == []
    options, unread = accelerator_options(AcceleratorConfig(
        split_batches=True, even_batches=False, use_seedable_sampler=False, dispatch_batches=True,
        gradient_accumulation_kwargs={"num_steps": 3, "sync_each_batch": True, "adjust_scheduler": True}))
    assert options == {"split_batches": True, "even_batches": False, "use_seedable_sampler": False,
                       "gradient_accumulation_steps": 3, "sync_each_batch": True} and unread == ["dispatch_batches"]
    args, warned = read(hf(tmp_path, accelerator_config={"split_batches": True, "even_batches": False,
                                                         "gradient_accumulation_kwargs": {"num_steps": 2}}))
    assert (args.split_batches, args.even_batches, args.gradient_accumulation_steps) == (True, False, 2)
    assert warned == []
    _, warned = read(hf(tmp_path, accelerator_config={"dispatch_batches": False}))
    assert len(warned) == 1 and "accelerator_config['dispatch_batches']" in warned[0]
    assert read(hf(tmp_path, accelerator_config={"non_blocking": True}))[1] == []
    with pytest.raises(ValueError, match="`accelerator_config`=3 is invalid: pass a dict"):
        accelerator_options(3)[1]
    with pytest.raises(ValueError, match="'num_steps'\\]` and `gradient_accumulation_steps` > 1 are both set"):
        accelerator_options({"gradient_accumulation_kwargs": {"num_steps": 2}}, accumulation=4)
    with pytest.raises(ValueError, match="\\['steps'\\] are not keywords"):
        accelerator_options({"gradient_accumulation_kwargs": {"steps": 2}})


def test_parallelism_config_is_named(tmp_path):
    hf_args = hf(tmp_path)
    object.__setattr__(hf_args, "parallelism_config", {"tp_size": 2})
    _, warned = read(hf_args)
    assert len(warned) == 1 and "parallelism_config" in warned[0]
