"""HF's `optim_args` and `debug="underflow_overflow"` beside the real Trainer: the optimizer built
with the options the Trainer reads for its `optim` (its param groups and defaults, and the logged
losses), none for the names whose builder ignores them; transformers' overflow detector attached as
the Trainer attaches it (the same report, then the same error)."""

import pytest
import torch

from fitkit import Model, TrainingArguments

transformers = pytest.importorskip("transformers")

from hf_tiny import accuracy, assert_same_logs, classifier, token_data  # noqa: E402

TRAIN, EVAL = token_data(16, seed=0), token_data(8, seed=1)
IMPLEMENTATION = ("fused", "foreach")  # how torch runs the update (fitkit picks the fastest exact one), not what


def hf_args(tmp_path, **fields):
    options = dict(output_dir=str(tmp_path), report_to="none", disable_tqdm=True, num_train_epochs=1,
                   per_device_train_batch_size=4, logging_steps=1, eval_strategy="epoch", save_strategy="no",
                   learning_rate=0.02, weight_decay=0.01, seed=0, dataloader_pin_memory=False, use_cpu=True)
    return transformers.TrainingArguments(**{**options, **fields})


def both(tmp_path, make_model=classifier, **fields):
    """The Trainer and fitkit's `Model` after training under the same arguments."""
    trainer = transformers.Trainer(model=make_model(), args=hf_args(tmp_path / "hf", **fields), train_dataset=TRAIN,
                                   eval_dataset=EVAL, compute_metrics=accuracy)
    trainer.train()
    model = Model(make_model()).compile()
    model.fit(TRAIN, validation_data=EVAL, args=hf_args(tmp_path / "fitkit", **fields), compute_metrics=accuracy)
    return trainer, model


def settings(optimizer):
    """The optimizer's class, defaults and param groups' hyperparameters (the rate, which the schedule moves, and
    the implementation flags left out)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    drop = ("lr", "initial_lr", "params", *IMPLEMENTATION)
    return (type(inner), {k: v for k, v in inner.defaults.items() if k not in drop},
            [{k: v for k, v in g.items() if k not in drop} for g in inner.param_groups])


@pytest.mark.parametrize("optim, optim_args, read", [
    ("sgd", "momentum=0.9, nesterov=True, dampening=0", {"momentum": 0.9, "nesterov": True}),
    ("rmsprop", "alpha=0.9,centered=yes,momentum=0.5,eps=1e-6,weight_decay=0.2", {"alpha": 0.9, "centered": True}),
    ("adagrad", "lr_decay=0.01,eps=1e-6,weight_decay=0.2,momentum=3", {"lr_decay": 0.01, "eps": 1e-6}),
])
def test_optim_args_build_the_trainers_optimizer(tmp_path, optim, optim_args, read):
    trainer, model = both(tmp_path, optim=optim, optim_args=optim_args)
    assert settings(model.optimizer) == settings(trainer.optimizer)
    kind, defaults, groups = settings(model.optimizer)
    assert read.items() <= defaults.items()
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]  # the groups keep the run's decay, as the Trainer's
    assert_same_logs(trainer.state.log_history, model.state.log_history)
    plain = Model(classifier()).compile()
    plain.fit(TRAIN, validation_data=EVAL, args=hf_args(tmp_path / "plain", optim=optim), compute_metrics=accuracy)
    assert settings(plain.optimizer) != settings(model.optimizer)  # the options changed the optimizer


@pytest.mark.parametrize("optim", ["adamw_torch", "adafactor"])
def test_names_whose_builder_ignores_optim_args_ignore_them_without_a_warning(tmp_path, optim, recwarn):
    trainer, model = both(tmp_path, optim=optim, optim_args="momentum=0.9,eps=0.5")
    plain = Model(classifier()).compile()
    plain.fit(TRAIN, args=hf_args(tmp_path / "plain", optim=optim, eval_strategy="no"))
    assert settings(model.optimizer)[1:] == settings(plain.optimizer)[1:]
    if optim == "adamw_torch":  # fitkit's Adafactor is torch's, the Trainer's transformers' own
        assert settings(model.optimizer) == settings(trainer.optimizer)
    assert not [w for w in recwarn if "fitkit cannot honour" in str(w.message)]


def test_a_malformed_optim_args_is_refused_naming_it():
    with pytest.raises(ValueError, match="`optim_args`='momentum' is invalid"):
        TrainingArguments(optim="sgd", optim_args="momentum")
    with pytest.raises(ValueError, match="`optim_args`=.*pass `optim` too"):
        TrainingArguments(optim_args="momentum=0.9")
    with pytest.raises(ValueError, match="`optim_args`: momentum='fast' is not a number"):
        Model(classifier()).compile().fit(TRAIN, optim="sgd", optim_args="momentum=fast", verbose=0, epochs=1)


def test_the_options_of_an_optimizer_fitkit_does_not_build_go_with_its_warning(tmp_path):
    from fitkit.config.hf_arguments import from_hf

    with pytest.warns(UserWarning, match="optim='galore_adamw'"):
        ours = from_hf(hf_args(tmp_path, optim="galore_adamw", optim_args="rank=64",
                               optim_target_modules=["attention"]))
    assert (ours.optim, ours.optim_args) == (None, None)


def exploding():
    """The tiny classifier with an output layer so large that its logits overflow to inf."""
    net = classifier()
    with torch.no_grad():
        net.classifier.weight.fill_(3e38)
        net.classifier.bias.fill_(3e38)
    return net


def test_underflow_overflow_attaches_the_trainers_detector(tmp_path, capsys):
    reports = []
    for run in ("hf", "fitkit"):
        args = hf_args(tmp_path / run, debug="underflow_overflow", eval_strategy="no")
        with pytest.raises(ValueError, match="DebugUnderflowOverflow: inf/nan detected"):
            if run == "hf":
                transformers.Trainer(model=exploding(), args=args, train_dataset=TRAIN).train()
            else:
                Model(exploding()).compile().fit(TRAIN, args=args)
        reports.append(capsys.readouterr().out)
    assert "Detected inf/nan during batch_number=0" in reports[0]
    assert reports[1] == reports[0]  # the frames before the overflow, as the Trainer's detector prints them


def test_underflow_overflow_changes_nothing_else_and_tpu_metrics_are_named_in_the_warning(tmp_path):
    trainer, model = both(tmp_path, debug="underflow_overflow")
    assert_same_logs(trainer.state.log_history, model.state.log_history)
    assert len(model.module._forward_hooks) == len(trainer.model._forward_hooks) == 1  # the detector's
    from fitkit.config.hf_arguments import from_hf

    with pytest.warns(UserWarning, match="debug='tpu_metrics_debug'"):
        ours = from_hf(hf_args(tmp_path, debug="tpu_metrics_debug underflow_overflow"))
    assert ours.debug == "underflow_overflow"
    with pytest.raises(ValueError, match="`debug`='tpu_metrics_debug' is invalid"):
        TrainingArguments(debug="tpu_metrics_debug")
