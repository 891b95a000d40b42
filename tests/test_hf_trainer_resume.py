"""A checkpoint of the Hugging Face Trainer resumed by fitkit (issue 35, the starred item): the run
ends with the weights, step, log history and callback state the Trainer reaches when it resumes
the same checkpoint itself; and a fitkit run never writes over the Trainer's checkpoints in its
`output_dir` unless it resumes from them.

One real `transformers.Trainer` run (a tiny BERT, dropout off, shuffled data, HF's linear schedule,
clipping, an evaluation every 4 steps with `EarlyStoppingCallback`) writes checkpoints 4, 8, 12, 16
and 18 (three epochs of 6 steps); each test resumes one of them, with the Trainer and with fitkit.
"""

import hashlib
import os
import shutil

import pytest
import torch

from fitkit import Model
from fitkit.engine.checkpoint import CheckpointError
from fitkit.engine.checkpoint.trainer_checkpoints import position

transformers = pytest.importorskip("transformers")

STEPS_PER_EPOCH, EPOCHS = 6, 3


def tiny_bert(seed):
    transformers.set_seed(seed)
    config = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertForSequenceClassification(config)


def samples(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, 30, (8,), generator=g).tolist(), "label": i % 2} for i in range(n)]


TRAIN, EVAL = samples(4 * STEPS_PER_EPOCH, 1), samples(8, 2)


def hf_args(output_dir, **kw):
    base = dict(output_dir=str(output_dir), report_to="none", disable_tqdm=True, num_train_epochs=EPOCHS,
                per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=2, save_strategy="steps",
                save_steps=4, eval_strategy="steps", eval_steps=4, metric_for_best_model="eval_loss")
    base.update(kw)
    return transformers.TrainingArguments(**base)


def early_stopping():
    return transformers.EarlyStoppingCallback(early_stopping_patience=50)  # counts, never stops


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """The Trainer's uninterrupted run: its output_dir holds checkpoint-4, 8, 12, 16 and 18."""
    root = tmp_path_factory.mktemp("hf")
    transformers.logging.set_verbosity_error()
    transformers.Trainer(model=tiny_bert(0), args=hf_args(root / "trainer"), train_dataset=TRAIN,
                         eval_dataset=EVAL, callbacks=[early_stopping()]).train()
    return root


_RESUMED: dict = {}


def resumed_by_trainer(hf_run, step, **kw):
    """(module, Trainer) of the Trainer resumed from its checkpoint-`step` (each case run once)."""
    key = (step, tuple(sorted(kw.items())))
    if key not in _RESUMED:
        net, callback = tiny_bert(7), early_stopping()
        trainer = transformers.Trainer(model=net, args=hf_args(hf_run / f"trainer-{step}-{len(_RESUMED)}", **kw),
                                       train_dataset=TRAIN, eval_dataset=EVAL, callbacks=[callback])
        trainer.train(resume_from_checkpoint=str(hf_run / "trainer" / f"checkpoint-{step}"))
        _RESUMED[key] = net, trainer.state, callback
    return _RESUMED[key]


def resumed_by_fitkit(output_dir, checkpoint, **kw):
    net, callback = tiny_bert(9), early_stopping()  # other initial weights: the checkpoint's must replace them
    model = Model(net).compile()
    model.fit(TRAIN, validation_data=EVAL, args=hf_args(output_dir, **kw), callbacks=[callback],
              resume_from_checkpoint=checkpoint, verbose=0)
    return net, model.state, callback


def training_logs(history):
    return [(r["step"], r["loss"], r["learning_rate"], r["epoch"]) for r in history if "loss" in r]


def assert_same_run(theirs, ours):
    (their_net, their_state, their_stop), (our_net, our_state, our_stop) = theirs, ours
    for (name, a), b in zip(their_net.state_dict().items(), our_net.state_dict().values()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=name)
    assert our_state.global_step == their_state.global_step == STEPS_PER_EPOCH * EPOCHS
    ours_logged, theirs_logged = training_logs(our_state.log_history), training_logs(their_state.log_history)
    assert [r[0] for r in ours_logged] == [r[0] for r in theirs_logged]
    for (_, loss, rate, epoch), (_, their_loss, their_rate, their_epoch) in zip(ours_logged, theirs_logged):
        assert loss == pytest.approx(their_loss, abs=1e-5)
        assert rate == pytest.approx(their_rate, rel=1e-9)
        assert epoch == pytest.approx(their_epoch, abs=1e-4)  # fitkit rounds a logged epoch to 4 decimals
    assert our_state.best_metric == pytest.approx(their_state.best_metric, abs=1e-6)
    assert our_state.best_global_step == their_state.best_global_step
    assert our_stop.early_stopping_patience_counter == their_stop.early_stopping_patience_counter


@pytest.mark.parametrize("step, options", [
    (8, {}),                            # in the middle of the second epoch: 2 of its batches skipped
    (12, {}),                           # at the end of the second epoch
    (8, {"ignore_data_skip": True}),    # the second epoch starts over, the run ends at max_steps
], ids=["mid-epoch", "epoch-end", "ignore_data_skip"])
def test_fitkit_ends_where_the_trainer_ends_from_the_same_checkpoint(hf_run, tmp_path, step, options):
    checkpoint = str(hf_run / "trainer" / f"checkpoint-{step}")
    theirs = resumed_by_trainer(hf_run, step, **options)
    ours = resumed_by_fitkit(tmp_path / "fitkit", checkpoint, **options)
    assert_same_run(theirs, ours)
    # the checkpoint's own history first, as recorded, then the records of the resumed steps
    recorded = transformers.TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json")).log_history
    assert ours[1].log_history[:len(recorded)] == recorded
    assert sorted(os.listdir(tmp_path / "fitkit")) == [f"checkpoint-{s}" for s in (12, 16, 18) if s > step]


def digests(directory):
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_resume_true_takes_the_trainers_newest_checkpoint_and_keeps_the_older_ones(hf_run, tmp_path):
    out = tmp_path / "moved"
    for step in (4, 8):  # a run moved mid-training: the Trainer's checkpoints so far
        shutil.copytree(hf_run / "trainer" / f"checkpoint-{step}", out / f"checkpoint-{step}")
    before = digests(out / "checkpoint-4")
    ours = resumed_by_fitkit(out, True, save_total_limit=1)
    assert_same_run(resumed_by_trainer(hf_run, 8), ours)
    assert digests(out / "checkpoint-4") == before  # rotation counts fitkit's own checkpoints only
    own = {name for name in os.listdir(out) if os.path.isfile(out / name / "fitkit_checkpoint.json")}
    best = os.path.basename(ours[1].best_model_checkpoint)
    assert own == {best} != {"checkpoint-8"}  # a limit of 1 with a best tracked: the best alone, as the Trainer
    assert set(os.listdir(out)) == own | {"checkpoint-4", "checkpoint-8"}


def test_a_fresh_run_into_the_trainers_output_dir_is_refused_and_writes_nothing(hf_run, tmp_path):
    out = tmp_path / "shared"
    shutil.copytree(hf_run / "trainer", out)
    before = digests(out)
    net = tiny_bert(3)
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    model = Model(net).compile()
    with pytest.raises(CheckpointError) as caught:
        model.fit(TRAIN, args=hf_args(out, eval_strategy="no"), verbose=0)
    message = str(caught.value)
    for named in ("checkpoint-4", "checkpoint-18", "resume_from_checkpoint=True", "another `output_dir`",
                  "move or delete"):
        assert named in message
    assert digests(out) == before
    assert all(torch.equal(v, initial[k]) for k, v in net.state_dict().items())  # nothing trained either
    # a run that writes no checkpoint there may use the directory
    model.fit(TRAIN, args=hf_args(out, eval_strategy="no", save_strategy="no", max_steps=1), verbose=0)
    assert digests(out) == before


def test_a_trainer_checkpoint_without_the_optimizer_state_is_refused(hf_run, tmp_path):
    checkpoint = tmp_path / "checkpoint-8"
    shutil.copytree(hf_run / "trainer" / "checkpoint-8", checkpoint)
    os.remove(checkpoint / "optimizer.pt")
    with pytest.raises(CheckpointError, match=r"optimizer\.pt.*save_only_model"):
        resumed_by_fitkit(tmp_path / "out", str(checkpoint))


def test_a_trainer_checkpoint_of_another_model_is_refused_before_loading(hf_run, tmp_path):
    transformers.set_seed(0)
    other = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16, num_labels=2))
    initial = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointError, match="another model.*other shapes"):
        Model(other).compile().fit(TRAIN, args=hf_args(tmp_path / "out", eval_strategy="no"), verbose=0,
                                   resume_from_checkpoint=str(hf_run / "trainer" / "checkpoint-8"))
    assert all(torch.equal(v, initial[k]) for k, v in other.state_dict().items())


def test_the_trainers_position_rule():
    assert position(8, epoch_length=6, accumulation=1, ignore_data_skip=False) == (1, 2)
    assert position(12, epoch_length=6, accumulation=1, ignore_data_skip=False) == (2, 0)
    assert position(5, epoch_length=12, accumulation=2, ignore_data_skip=False) == (0, 10)  # micro-batches
    assert position(8, epoch_length=6, accumulation=1, ignore_data_skip=True) == (1, 0)
    assert position(8, epoch_length=None, accumulation=2, ignore_data_skip=False) == (0, 16)  # one long epoch


class Averaged(torch.nn.Module):
    """A model whose forward takes no **kwargs: the Trainer then averages the micro-batches of an
    accumulation window, as fitkit does, so the two runs take the same steps."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.EmbeddingBag(30, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


def test_under_gradient_accumulation_the_skipped_batches_are_micro_batches(tmp_path):
    # 12 micro-batches of 2 an epoch, 6 steps; checkpoint-5 resumes after 10 micro-batches of epoch 0
    args = dict(gradient_accumulation_steps=2, per_device_train_batch_size=2, save_steps=5, eval_strategy="no")
    transformers.Trainer(model=Averaged(0), args=hf_args(tmp_path / "trainer", **args), train_dataset=TRAIN).train()
    checkpoint = str(tmp_path / "trainer" / "checkpoint-5")
    theirs = Averaged(1)
    transformers.Trainer(model=theirs, args=hf_args(tmp_path / "again", **args),
                         train_dataset=TRAIN).train(resume_from_checkpoint=checkpoint)
    ours = Averaged(2)
    model = Model(ours).compile()
    model.fit(TRAIN, args=hf_args(tmp_path / "fitkit", **args), resume_from_checkpoint=checkpoint, verbose=0)
    assert model.state.global_step == 18
    for a, b in zip(theirs.parameters(), ours.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)


@pytest.mark.parametrize("ignore, last_epoch", [(False, 2.0), (True, 1.5)])
def test_ignore_data_skip_on_a_fitkit_checkpoint_starts_the_epoch_over(tmp_path, ignore, last_epoch):
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))

    def model():
        torch.manual_seed(0)
        return Model(torch.nn.Linear(4, 2)).compile("sgd", "cross_entropy")

    # 4 steps an epoch; the checkpoint of step 2 is in the middle of the first epoch
    model().fit(x, y, epochs=2, batch_size=8, output_dir=str(tmp_path), save_strategy="steps", save_steps=2,
                max_steps=2, verbose=0)
    again = model()
    again.fit(x, y, epochs=2, batch_size=8, output_dir=str(tmp_path), save_strategy="no", verbose=0,
              resume_from_checkpoint=str(tmp_path / "checkpoint-2"), ignore_data_skip=ignore)
    assert again.state.global_step == 8  # the plan's max_steps either way, as the Trainer
    assert again.state.epoch == last_epoch  # the first epoch trained whole again: the run ends inside the second


def test_pytorch_model_bin_resumes_like_safetensors(hf_run, tmp_path):
    from safetensors.torch import load_file

    checkpoint = tmp_path / "checkpoint-8"  # as the Trainer writes it with save_safetensors=False
    shutil.copytree(hf_run / "trainer" / "checkpoint-8", checkpoint)
    torch.save(load_file(checkpoint / "model.safetensors"), checkpoint / "pytorch_model.bin")
    os.remove(checkpoint / "model.safetensors")
    assert_same_run(resumed_by_trainer(hf_run, 8), resumed_by_fitkit(tmp_path / "fitkit", str(checkpoint)))


def test_weights_tied_to_another_are_loaded_through_it(tmp_path):
    from fitkit.engine.checkpoint.trainer_checkpoints import load_weights

    def masked_lm(seed):
        transformers.set_seed(seed)
        return transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
            max_position_embeddings=16))

    saved, loaded = masked_lm(0), masked_lm(1)
    saved.save_pretrained(tmp_path)  # the Trainer's own save: a tied weight is written once
    load_weights(loaded, str(tmp_path))
    for (name, a), b in zip(saved.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight


class CountedSteps(transformers.TrainerCallback, transformers.trainer_callback.ExportableState):
    """A stateful transformers callback counting optimizer steps: what a resume gives back to it."""

    def __init__(self, steps=0):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1

    def state(self):
        return {"args": {}, "attributes": {"steps": self.steps}}


@pytest.mark.parametrize("restore", [False, True])
def test_callback_states_come_back_only_with_restore_callback_states_from_checkpoint(tmp_path, restore):
    transformers.Trainer(model=tiny_bert(0), args=hf_args(tmp_path / "first", max_steps=8), train_dataset=TRAIN,
                         eval_dataset=EVAL, callbacks=[CountedSteps()]).train()
    checkpoint = str(tmp_path / "first" / "checkpoint-8")
    ours = CountedSteps()
    trainer = transformers.Trainer(model=tiny_bert(7), train_dataset=TRAIN, eval_dataset=EVAL, callbacks=[CountedSteps()],
                                   args=hf_args(tmp_path / "hf", restore_callback_states_from_checkpoint=restore))
    trainer.train(resume_from_checkpoint=checkpoint)
    # the Trainer restores into a new instance of the callback, fitkit into the one given
    theirs = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, CountedSteps))
    Model(tiny_bert(9)).compile().fit(
        TRAIN, validation_data=EVAL, args=hf_args(tmp_path / "fitkit", restore_callback_states_from_checkpoint=restore),
        callbacks=[ours], resume_from_checkpoint=checkpoint, verbose=0)
    # the Trainer's default (False) restores no callback's state; True: the 8 steps counted before come back
    assert ours.steps == theirs.steps == (STEPS_PER_EPOCH * EPOCHS if restore else STEPS_PER_EPOCH * EPOCHS - 8)


def test_the_trainer_face_restores_no_callback_state_by_default_and_the_keras_face_does():
    model = Model(tiny_bert(0)).compile()
    assert model.training_arguments(hf_trainer=True).restore_callback_states_from_checkpoint is False  # the Trainer's
    assert model.training_arguments().restore_callback_states_from_checkpoint is True  # Keras' resume (BackupAndRestore)
