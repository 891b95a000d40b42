"""The Trainer face chosen by name (`hf_trainer=True`, no transformers arguments) and the smaller
Trainer habits of issue 46, each beside the real `transformers.Trainer` on a tiny BERT from a
config (dropout off), the same data and seed: every logged value within 1e-5."""

import pytest
import torch

from fitkit import Model, TrainingArguments

transformers = pytest.importorskip("transformers")
from hf_tiny import accuracy, assert_same_logs, classifier, datasets, token_data  # noqa: E402

TRAIN, EVAL = token_data(32, seed=0), token_data(16, seed=1)


def trainer_logs(tmp_path, **fields):
    """The Trainer's log history over TRAIN / EVAL: 2 epochs of 4 steps, a log every step."""
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none", disable_tqdm=True,
                                          num_train_epochs=2, per_device_train_batch_size=8, logging_steps=1,
                                          eval_strategy="epoch", seed=0, **fields)
    trainer = transformers.Trainer(model=classifier(), args=args, train_dataset=TRAIN, eval_dataset=EVAL,
                                   compute_metrics=accuracy)
    trainer.train()
    return trainer.state.log_history


def test_hf_trainer_true_trains_with_the_trainers_defaults(tmp_path):
    """AdamW, the linear schedule, clipping at 1.0, no weight decay and the Trainer's batches,
    with only `hf_trainer=True` and the run's own values given (a rate large enough for clipping)."""
    theirs = trainer_logs(tmp_path, learning_rate=0.05)
    model = Model(classifier()).compile()
    model.fit(TRAIN, validation_data=EVAL, hf_trainer=True, epochs=2, batch_size=8, learning_rate=0.05,
              logging_strategy="steps", logging_steps=1, seed=0, compute_metrics=accuracy, verbose=0,
              output_dir=str(tmp_path / "fitkit"))
    assert any(r.get("grad_norm", 0) > 1.0 for r in theirs)  # clipping acted
    assert_same_logs(theirs, model.state.log_history)


class EvaluatedKeys(transformers.TrainerCallback):
    """A transformers callback keeping the keys of each `on_evaluate`'s metrics."""

    def __init__(self):
        self.keys = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.keys.append(sorted(metrics))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.keys.append("log")


def test_on_evaluate_metrics_carry_the_epoch_and_evaluate_prints_no_line_under_disable_tqdm(tmp_path, capsys):
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none", disable_tqdm=True,
                                          num_train_epochs=1, per_device_train_batch_size=8, eval_strategy="epoch",
                                          save_strategy="no", seed=0, dataloader_pin_memory=False)
    seen = {}
    for who in ("hf", "fitkit"):
        keys = EvaluatedKeys()
        if who == "hf":
            runner = transformers.Trainer(model=classifier(), args=args, train_dataset=TRAIN, eval_dataset=EVAL,
                                          compute_metrics=accuracy, callbacks=[keys])
            runner.train()
            runner.evaluate()
        else:
            runner = Model(classifier()).compile()
            runner.fit(TRAIN, validation_data=EVAL, args=args, compute_metrics=accuracy, callbacks=[keys])
            runner.evaluate(callbacks=[keys])
        printed = capsys.readouterr().out.splitlines()
        seen[who] = keys.keys, [line for line in printed if not line.startswith("{")]
    assert "epoch" in seen["hf"][0][1]
    # in fit and in evaluate() after it: the record logged, then on_evaluate with eval_loss, eval_accuracy,
    # the speed and epoch
    assert seen["fitkit"][0] == seen["hf"][0]
    assert seen["fitkit"][1] == seen["hf"][1] == []  # only the printer's records, no progress line


# -- TrainingArguments fields that change what a run computes (issue 46), each beside the Trainer ----------
def both_runs(tmp_path, make_model=classifier, train=TRAIN, compare=True, **fields):
    """The Trainer's and fitkit's log histories (and `predict`'s output) under the same
    `args=transformers.TrainingArguments(...)`: 2 epochs of 8-sample batches, a log every step,
    an evaluation per epoch, `fields` over those. (The Trainer's closing `total_flos` of a module
    that is not a transformers model, 0, is left out: fitkit counts no FLOPs for it.)"""
    out = {}
    for who in ("hf", "fitkit"):
        options = dict(output_dir=str(tmp_path / who), report_to="none", disable_tqdm=True, num_train_epochs=2,
                       per_device_train_batch_size=8, logging_steps=1, eval_strategy="epoch", save_strategy="no",
                       learning_rate=0.02, seed=0, dataloader_pin_memory=False)
        args = transformers.TrainingArguments(**{**options, **fields})
        if who == "hf":
            runner = transformers.Trainer(model=make_model(), args=args, train_dataset=train, eval_dataset=EVAL,
                                          compute_metrics=accuracy)
            runner.train()
            prediction = runner.predict(EVAL)
        else:
            runner = Model(make_model()).compile()
            runner.fit(train, validation_data=EVAL, args=args, compute_metrics=accuracy)
            prediction = runner.hf_predict(EVAL)
        out[who] = runner.state.log_history, prediction
    (theirs, hf_prediction), (ours, prediction) = out["hf"], out["fitkit"]
    if not isinstance(runner.module, transformers.PreTrainedModel):
        theirs = [{k: v for k, v in r.items() if k != "total_flos"} for r in theirs]
    if compare:
        assert_same_logs(theirs, ours)
    return theirs, hf_prediction, prediction


def test_adam_betas_and_epsilon_are_the_trainers(tmp_path):
    logs, _, _ = both_runs(tmp_path, adam_beta1=0.5, adam_beta2=0.9, adam_epsilon=1e-3)
    plain, _, _ = both_runs(tmp_path / "plain")
    assert logs[3]["loss"] != pytest.approx(plain[3]["loss"], abs=1e-4)  # the fields changed the run


def test_label_smoothing_is_the_trainers_label_smoother(tmp_path):
    logs, _, _ = both_runs(tmp_path, label_smoothing_factor=0.2)
    plain, _, _ = both_runs(tmp_path / "plain")
    assert logs[0]["loss"] != pytest.approx(plain[0]["loss"], abs=1e-4)  # eval_loss too: compared above


def test_dataloader_drop_last_drops_the_incomplete_batch(tmp_path):
    logs, _, _ = both_runs(tmp_path, train=token_data(30, seed=0), dataloader_drop_last=True)
    assert max(r["step"] for r in logs) == 6  # 3 full batches of 8 a epoch, not 4


def test_eval_on_start_evaluates_before_the_first_step(tmp_path):
    logs, _, _ = both_runs(tmp_path, eval_on_start=True)
    assert "eval_loss" in logs[0] and logs[0]["step"] == 0


def test_prediction_loss_only_computes_the_loss_alone(tmp_path):
    logs, theirs, ours = both_runs(tmp_path, prediction_loss_only=True)
    assert "eval_loss" in logs[4] and "eval_accuracy" not in logs[4]
    assert ours.predictions is None and ours.label_ids is None and theirs.predictions is None
    assert ours.metrics["test_loss"] == pytest.approx(theirs.metrics["test_loss"], abs=1e-5)


class InfiniteOnToken1(torch.nn.Module):
    """A classifier whose loss is infinite for a batch holding token 1 (its gradient stays finite)."""

    def __init__(self):
        super().__init__()
        self.net = classifier()

    def forward(self, input_ids, labels=None):
        out = self.net(input_ids=input_ids, labels=labels)
        loss = out.loss
        if loss is not None and bool((input_ids == 1).any()):
            loss = loss + float("inf")
        return {"loss": loss, "logits": out.logits}


def test_logging_nan_inf_filter_logs_the_mean_in_place_of_an_infinite_step_loss(tmp_path):
    rows = token_data(32, seed=0).to_dict()
    rows["input_ids"][5][0] = 1  # one training sample makes its step's loss infinite
    train = datasets.Dataset.from_dict(rows)
    logs, _, _ = both_runs(tmp_path, make_model=InfiniteOnToken1, train=train, logging_steps=2)
    losses = [r["loss"] for r in logs if "loss" in r]
    assert all(abs(loss) != float("inf") for loss in losses)  # on by default, as in the Trainer
    unfiltered, _, _ = both_runs(tmp_path / "off", make_model=InfiniteOnToken1, train=train, logging_steps=2,
                                 compare=False, logging_nan_inf_filter=False)
    assert any(r.get("loss") == float("inf") for r in unfiltered)  # the Trainer's run had its infinite step


class InfiniteOnToken1Kwargs(InfiniteOnToken1):
    """The same, with a forward that takes `**kwargs`: the Trainer's token-count loss path."""

    def forward(self, input_ids, labels=None, **kwargs):
        return super().forward(input_ids, labels)


@pytest.mark.parametrize("make_model", [InfiniteOnToken1, InfiniteOnToken1Kwargs])
def test_logging_nan_inf_filter_under_accumulation_filters_each_micro_batch(tmp_path, make_model):
    """One micro-batch of a window infinite: the Trainer filters it alone, in place of it the
    losses since the last log (the window's earlier micro-batches included) over the steps."""
    rows = token_data(32, seed=0).to_dict()
    rows["input_ids"][5][0] = 1
    logs, _, _ = both_runs(tmp_path, make_model=make_model, train=datasets.Dataset.from_dict(rows), logging_steps=2,
                           per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert all(abs(r["loss"]) != float("inf") for r in logs if "loss" in r)


# -- fields fitkit maps onto its own options: what each becomes --------------------------------------------
def from_hf_fields(**fields):
    from fitkit.config.hf_arguments import from_hf

    return from_hf(transformers.TrainingArguments(output_dir="out", report_to="none", **fields))


def test_torch_compile_and_jit_checkpoint_map_onto_fitkits_options():
    assert from_hf_fields(torch_compile=True).jit_compile == {"backend": "inductor"}  # HF fills the backend in
    assert from_hf_fields(torch_compile_mode="reduce-overhead").jit_compile == {"backend": "inductor",
                                                                               "mode": "reduce-overhead"}
    assert from_hf_fields(torch_compile_backend="eager").jit_compile == {"backend": "eager"}
    assert from_hf_fields().jit_compile == "auto" and from_hf_fields(enable_jit_checkpoint=True).save_on_sigterm


def test_tf32_is_left_to_transformers_and_generation_config_is_copied():
    """transformers sets torch's TF32 flags itself when its arguments are built (on an Ampere GPU;
    tf32=True is refused elsewhere): fitkit warns about nothing and keeps them."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_hf_fields(tf32=False)
    assert not [w for w in caught if "tf32" in str(w.message)]
    from fitkit.config.hf_arguments import from_hf

    config = transformers.GenerationConfig(max_length=7)
    args = transformers.Seq2SeqTrainingArguments(output_dir="out", report_to="none", generation_config=config)
    assert from_hf(args).generation_config.max_length == 7


def test_logging_first_step_is_the_trainers(tmp_path):
    logs, _, _ = both_runs(tmp_path, logging_first_step=True, logging_steps=3)
    assert logs[0]["step"] == 1 and "loss" in logs[0]


def test_ddp_fields_build_fabrics_ddp_strategy():
    from fitkit.engine.devices.strategies import ddp_strategy

    assert ddp_strategy("ddp", from_hf_fields()) == "ddp"  # HF's defaults: Fabric's own strategy
    assert from_hf_fields(ddp_timeout=60, ddp_static_graph=True).ddp_timeout == 60  # copied from HF's arguments
    # (a ddp_backend in HF's own arguments makes transformers start a process group: fitkit's fields here)
    strategy = ddp_strategy("ddp_spawn", TrainingArguments(ddp_timeout=60, ddp_backend="gloo", ddp_static_graph=True,
                                                           ddp_find_unused_parameters=False, ddp_bucket_cap_mb=5,
                                                           ddp_broadcast_buffers=False))
    assert strategy._start_method == "spawn" and strategy._process_group_backend == "gloo"
    assert strategy._timeout.total_seconds() == 60
    assert strategy._ddp_kwargs == {"find_unused_parameters": False, "bucket_cap_mb": 5, "broadcast_buffers": False,
                                    "static_graph": True}


def test_use_cache_gradient_checkpointing_kwargs_and_loader_options_reach_the_model_and_loader(tmp_path):
    seen = {}

    class Spy(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
            seen["use_cache"] = model.config.use_cache
            seen["checkpointing"] = model.is_gradient_checkpointing
            seen["loader"] = train_dataloader

    net = classifier()
    net.config.use_cache = True
    calls = []
    enable = net.gradient_checkpointing_enable
    net.gradient_checkpointing_enable = lambda **kw: (calls.append(kw), enable(**kw))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", disable_tqdm=True,
                                          max_steps=1, per_device_train_batch_size=8, save_strategy="no",
                                          gradient_checkpointing=True,
                                          gradient_checkpointing_kwargs={"use_reentrant": False},
                                          dataloader_num_workers=1, dataloader_persistent_workers=True,
                                          dataloader_prefetch_factor=3, dataloader_pin_memory=False,
                                          dataloader_multiprocessing_context="fork", dataloader_in_order=False)
    Model(net).compile().fit(TRAIN, args=args, callbacks=[Spy()])
    assert seen["use_cache"] is False and seen["checkpointing"]  # the Trainer sets use_cache=False too
    # through activation_checkpointing_enable, which calls the overridden older name as the Trainer's call does
    assert calls == [{"gradient_checkpointing_kwargs": {"use_reentrant": False}, "every_n_layers": 1, "offload": False}]
    loader = getattr(seen["loader"], "loader", seen["loader"])
    assert loader.persistent_workers and loader.prefetch_factor == 3 and not loader.in_order
    assert loader.multiprocessing_context.get_start_method() == "fork"


def test_full_determinism_turns_torchs_deterministic_algorithms_on_as_the_trainer(tmp_path):
    import os

    saved = {k: os.environ.get(k) for k in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG",
                                            "FLASH_ATTENTION_DETERMINISTIC")}
    try:
        seen = {}
        for who in ("hf", "fitkit"):
            torch.use_deterministic_algorithms(False)
            args = transformers.TrainingArguments(output_dir=str(tmp_path / who), report_to="none", max_steps=1,
                                                  disable_tqdm=True, save_strategy="no", full_determinism=True,
                                                  dataloader_pin_memory=False)
            if who == "hf":
                transformers.Trainer(model=classifier(), args=args, train_dataset=TRAIN).train()
            else:
                Model(classifier()).compile().fit(TRAIN, args=args)
            seen[who] = torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        assert seen["fitkit"] == seen["hf"] == (True, ":16:8")
    finally:
        torch.use_deterministic_algorithms(False)
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def test_lr_scheduler_kwargs_and_the_trainers_other_schedules_are_its_own(tmp_path):
    logs, _, _ = both_runs(tmp_path, lr_scheduler_type="cosine_with_restarts", lr_scheduler_kwargs={"num_cycles": 2},
                           warmup_steps=0.25)
    rates = [r["learning_rate"] for r in logs if "learning_rate" in r]
    assert rates[0] == 0.0 and any(b > a for a, b in zip(rates[2:], rates[3:]))  # warm-up, then a cycle restarts
    polynomial, _, _ = both_runs(tmp_path / "poly", lr_scheduler_type="polynomial",
                                 lr_scheduler_kwargs={"power": 2.0, "lr_end": 1e-4})
    assert [r["learning_rate"] for r in polynomial if "learning_rate" in r][5] != pytest.approx(rates[5])


def test_save_only_model_writes_no_optimizer_state_and_a_resume_starts_a_fresh_one(tmp_path, caplog):
    import logging
    import os

    from fitkit.engine.checkpoint.layout import WEIGHTS

    logs, _, _ = both_runs(tmp_path, save_only_model=True, save_strategy="epoch")
    assert not os.path.exists(tmp_path / "hf" / "checkpoint-4" / "optimizer.pt")  # the Trainer's, for reference
    saved = torch.load(tmp_path / "fitkit" / "checkpoint-4" / WEIGHTS, weights_only=True)
    assert "model" in saved and "optimizer" not in saved and "scheduler" not in saved
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "fitkit"), report_to="none", disable_tqdm=True,
                                          num_train_epochs=2, per_device_train_batch_size=8, save_strategy="no",
                                          dataloader_pin_memory=False)
    with caplog.at_level(logging.WARNING, logger="fitkit"):
        model = Model(classifier()).compile()
        model.fit(TRAIN, args=args, resume_from_checkpoint=str(tmp_path / "fitkit" / "checkpoint-4"))
    assert "save_only_model" in caplog.text and model.state.global_step == 8


def test_neftune_noise_is_the_trainers(tmp_path):
    logs, _, _ = both_runs(tmp_path, neftune_noise_alpha=50.0)
    plain, _, _ = both_runs(tmp_path / "plain")
    assert logs[1]["loss"] != pytest.approx(plain[1]["loss"], abs=1e-6)  # the noise changed training
    evaluated = [r["eval_loss"] for r in logs if "eval_loss" in r]
    assert evaluated  # evaluation, in eval mode, adds none: compared with the Trainer's above


def test_include_num_input_tokens_seen_logs_the_trainers_count(tmp_path):
    logs, _, _ = both_runs(tmp_path, include_num_input_tokens_seen=True)
    assert logs[0]["num_input_tokens_seen"] == 8 * 8 and "train_tokens_per_second" in logs[0]
    assert logs[-1]["num_input_tokens_seen"] == 2 * 32 * 8  # the closing record: the whole run's


def test_torch_empty_cache_steps_empties_the_cache_every_n_steps(tmp_path, monkeypatch):
    """Which steps empty the cache (on this CPU, `empty_device_cache` itself does nothing: counted instead)."""
    from fitkit.callbacks import empty_cache

    emptied = []
    state = {}

    class Steps(transformers.TrainerCallback):
        def on_step_end(self, args, s, control, **kwargs):
            state["step"] = s.global_step

    monkeypatch.setattr(empty_cache, "empty_device_cache", lambda: emptied.append(state["step"]))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none", disable_tqdm=True,
                                          num_train_epochs=2, per_device_train_batch_size=8, save_strategy="no",
                                          torch_empty_cache_steps=3, use_cpu=True, dataloader_pin_memory=False)
    Model(classifier()).compile().fit(TRAIN, args=args, callbacks=[Steps()])
    assert emptied == [3, 6]


def test_include_for_metrics_gives_compute_metrics_the_inputs_and_losses(tmp_path):
    seen = {}

    def metrics_with_inputs(eval_pred):
        parts = tuple(eval_pred)
        seen.setdefault("parts", []).append(len(parts))
        logits, labels, inputs, losses = parts
        seen.setdefault("inputs", []).append(inputs)
        return {"first_token": float(inputs[:, 0].mean()), "mean_loss": float(losses.mean())}

    out = {}
    for who in ("hf", "fitkit"):
        args = transformers.TrainingArguments(output_dir=str(tmp_path / who), report_to="none", disable_tqdm=True,
                                              num_train_epochs=1, per_device_train_batch_size=8,
                                              per_device_eval_batch_size=5, eval_strategy="epoch", save_strategy="no",
                                              include_for_metrics=["inputs", "loss"], seed=0,
                                              dataloader_pin_memory=False)
        if who == "hf":
            runner = transformers.Trainer(model=classifier(), args=args, train_dataset=TRAIN, eval_dataset=EVAL,
                                          compute_metrics=metrics_with_inputs)
            runner.train()
        else:
            runner = Model(classifier()).compile()
            runner.fit(TRAIN, validation_data=EVAL, args=args, compute_metrics=metrics_with_inputs)
        out[who] = runner.state.log_history
    assert_same_logs(out["hf"], out["fitkit"])
    assert seen["parts"] == [4, 4]
    assert (seen["inputs"][0] == seen["inputs"][1]).all() and seen["inputs"][1].shape == (16, 8)
