"""The Trainer face chosen by name (`hf_trainer=True`, no transformers arguments) and the smaller
Trainer habits of issue 46, each beside the real `transformers.Trainer` on a tiny BERT from a
config (dropout off), the same data and seed: every logged value within 1e-5."""

import pytest

from fitkit import Model

transformers = pytest.importorskip("transformers")
from hf_tiny import accuracy, assert_same_logs, classifier, token_data  # noqa: E402

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
    assert "epoch" in seen["hf"][0][0]
    assert seen["fitkit"][0][0] == seen["hf"][0][0]  # in fit: eval_loss, eval_accuracy, the speed, epoch
    assert "epoch" in seen["fitkit"][0][1]  # evaluate() after fit
    assert seen["fitkit"][1] == seen["hf"][1] == []  # only the printer's records, no progress line
