"""`fit(args=transformers.TrainingArguments(fsdp=..., fsdp_config=...))` on two gloo processes
(tests/scripts/hf_fsdp_args.py under torchrun): the run equals the one with fitkit's own
`strategy="fsdp"` options (losses and weights), the FSDP units are the layers named in
`transformer_layer_cls_to_wrap` (and the root), the losses and weights are the real Trainer's
with the same arguments, and `shard_grad_op` with `fsdp_config`'s
`activation_checkpointing` keeps those units gathered after forward and checkpoints them without
changing a number. The mapping of each key alone: tests/test_hf_distributed.py."""

import json

import pytest
from helpers import torchrun

pytest.importorskip("transformers")

RUNS = ("hf", "fitkit", "trainer", "ac")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_fsdp")
    torchrun("hf_fsdp_args.py", out, timeout=600)
    return {name: [json.loads((out / f"{name}-{rank}.json").read_text()) for rank in (0, 1)] for name in RUNS}


@pytest.mark.slow
def test_hfs_fsdp_fields_run_as_fitkits_own_fsdp_options(runs):
    for rank in (0, 1):
        hf, own = runs["hf"][rank], runs["fitkit"][rank]
        assert len(hf["losses"]) == 3 and hf["losses"] == own["losses"]
        assert hf["weights"] == own["weights"]
        assert hf["units"] == own["units"] == ["", "bert.encoder.layer.0", "bert.encoder.layer.1"]
        assert hf["checkpointed"] == [] and hf["kept"] == []


@pytest.mark.slow
def test_hfs_fsdp_fields_give_the_trainers_losses_and_weights(runs):
    for rank in (0, 1):
        hf, trainer = runs["hf"][rank], runs["trainer"][rank]
        assert hf["losses"] == pytest.approx(trainer["losses"], abs=1e-5)
        assert set(hf["weights"]) == set(trainer["weights"])
        for name, values in trainer["weights"].items():
            assert hf["weights"][name] == pytest.approx(values, abs=1e-5), name


@pytest.mark.slow
def test_shard_grad_op_and_activation_checkpointing_change_how_not_what(runs):
    for rank in (0, 1):
        ac, hf = runs["ac"][rank], runs["hf"][rank]
        assert ac["checkpointed"] == ac["kept"] == ["bert.encoder.layer.0", "bert.encoder.layer.1"]
        assert ac["losses"] == pytest.approx(hf["losses"], abs=1e-6)
        for name, values in hf["weights"].items():
            assert ac["weights"][name] == pytest.approx(values, abs=1e-6), name
