"""The evaluation fields of HF's `TrainingArguments` (issue 46), each beside the real
`transformers.Trainer` on a tiny BERT from a config (dropout off), the same data and seed:
`bf16_full_eval` / `fp16_full_eval`, `eval_do_concat_batches`, `batch_eval_metrics`,
`eval_use_gather_object`, and `hf_predict` ending with `on_predict` as the Trainer's `predict`."""

import numpy as np
import pytest
import torch

from fitkit import Model

transformers = pytest.importorskip("transformers")
from hf_tiny import SPEED, accuracy, assert_same_logs, classifier, token_data  # noqa: E402

TRAIN, EVAL = token_data(16, seed=0), token_data(14, seed=1)  # evaluation batches of 6, 6 and 2


def hf_args(tmp_path, who, **fields):
    options = dict(output_dir=str(tmp_path / who), report_to="none", disable_tqdm=True, num_train_epochs=1,
                   per_device_train_batch_size=8, per_device_eval_batch_size=6, logging_steps=1,
                   eval_strategy="epoch", save_strategy="no", learning_rate=0.02, seed=0, dataloader_pin_memory=False)
    return transformers.TrainingArguments(**{**options, **fields})


def both(tmp_path, compute_metrics=accuracy, callbacks=(), train=True, only=("hf", "fitkit"), **fields):
    """{who: (log history, predict's output, module)} of the Trainer and of fitkit, each trained
    (or not: `train=False`) under the same arguments, then predicting EVAL (`only`: one of them)."""
    out = {}
    for who in only:
        args = hf_args(tmp_path, who, **({} if train else {"eval_strategy": "no"}), **fields)
        net = classifier()
        if who == "hf":
            runner = transformers.Trainer(model=net, args=args, train_dataset=TRAIN, eval_dataset=EVAL,
                                          compute_metrics=compute_metrics, callbacks=list(callbacks))
            if train:
                runner.train()
            prediction = runner.predict(EVAL)
        else:
            if train:
                runner = Model(net).compile()
                runner.fit(TRAIN, validation_data=EVAL, args=args, compute_metrics=compute_metrics,
                           callbacks=list(callbacks))
                prediction = runner.hf_predict(EVAL, callbacks=list(callbacks))
            else:  # no fit: the arguments as compile's options
                runner = Model(net).compile(**fields, hf_trainer=True, per_device_eval_batch_size=6)
                prediction = runner.hf_predict(EVAL, compute_metrics=compute_metrics, callbacks=list(callbacks))
        out[who] = runner.state.log_history, prediction, net
    return out


def same_metrics(theirs, ours, abs=1e-5):
    # the Trainer's first evaluation without training times its model preparation (Accelerate's): not here
    theirs = {k: v for k, v in theirs.items() if not k.endswith("_model_preparation_time")}
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        if not key.endswith(SPEED):
            assert ours[key] == pytest.approx(value, abs=abs), key


# -- bf16_full_eval / fp16_full_eval -----------------------------------------------------------------------------
def in_bf16(array):
    """True when every value is a bfloat16 (what a module cast to bf16 computes)."""
    return np.array_equal(torch.from_numpy(array).bfloat16().float().numpy(), array)


def test_bf16_full_eval_leaves_fits_evaluations_alone_then_casts_the_module_for_predict(tmp_path):
    runs = both(tmp_path, bf16_full_eval=True, use_cpu=True)  # transformers wants use_cpu for bf16 on a CPU
    (theirs, their_out, their_net), (ours, our_out, our_net) = runs["hf"], runs["fitkit"]
    assert_same_logs(theirs, ours)  # the evaluation inside the fit: at the training precision, within 1e-5
    assert not in_bf16(np.array([r["eval_loss"] for r in ours if "eval_loss" in r]))
    # after the fit, predict casts the module in place, for good
    assert {p.dtype for p in their_net.parameters()} == {p.dtype for p in our_net.parameters()} == {torch.bfloat16}
    assert in_bf16(our_out.predictions) and in_bf16(their_out.predictions)
    np.testing.assert_allclose(our_out.predictions, their_out.predictions, atol=2e-2, rtol=0)
    np.testing.assert_array_equal(our_out.label_ids, their_out.label_ids)
    same_metrics(their_out.metrics, our_out.metrics, abs=2e-2)


def test_fp16_full_eval_without_training_casts_before_the_first_batch(tmp_path):
    runs = both(tmp_path, train=False, fp16_full_eval=True)
    (_, their_out, their_net), (_, our_out, our_net) = runs["hf"], runs["fitkit"]
    assert {p.dtype for p in their_net.parameters()} == {p.dtype for p in our_net.parameters()} == {torch.float16}
    assert our_out.predictions.dtype == their_out.predictions.dtype
    np.testing.assert_allclose(our_out.predictions, their_out.predictions, atol=1e-2, rtol=0)
    same_metrics(their_out.metrics, our_out.metrics, abs=1e-2)


# -- eval_do_concat_batches=False -------------------------------------------------------------------------------
class Seen:
    """A `compute_metrics` recording what it is given: the shapes of each batch's predictions
    and labels (a list of per-batch arrays), and accuracy over all of them."""

    def __init__(self):
        self.calls = []

    def __call__(self, eval_pred):
        predictions, labels = eval_pred
        self.calls.append(([p.shape for p in predictions], [x.shape for x in labels]))
        right = sum(int((p.argmax(-1) == y).sum()) for p, y in zip(predictions, labels))
        return {"accuracy": right / sum(len(y) for y in labels)}


def test_eval_do_concat_batches_false_gives_lists_of_batches(tmp_path):
    seen = {"hf": Seen(), "fitkit": Seen()}
    runs = {}
    for who in seen:  # one compute_metrics each: its calls are compared
        runs[who] = both(tmp_path, compute_metrics=seen[who], only=(who,), eval_do_concat_batches=False)[who]
    (theirs, their_out, _), (ours, our_out, _) = runs["hf"], runs["fitkit"]
    assert_same_logs(theirs, ours)
    assert seen["fitkit"].calls == seen["hf"].calls
    assert seen["hf"].calls[0][0] == [(6, 2), (6, 2), (2, 2)]
    assert isinstance(our_out.predictions, list) and isinstance(our_out.label_ids, list)
    assert len(our_out.predictions) == len(their_out.predictions) == 3
    for ours_batch, theirs_batch in zip(our_out.predictions + our_out.label_ids,
                                        their_out.predictions + their_out.label_ids):
        np.testing.assert_allclose(ours_batch, theirs_batch, atol=1e-5, rtol=0)
    same_metrics(their_out.metrics, our_out.metrics)


# -- batch_eval_metrics -----------------------------------------------------------------------------------------
class PerBatch:
    """HF's batch-wise `compute_metrics`: counts right answers batch by batch (tensors), the
    accuracy returned at `compute_result=True`; every call recorded."""

    def __init__(self):
        self.calls, self.right, self.total = [], 0, 0

    def __call__(self, eval_pred, compute_result=False):
        logits, labels = eval_pred
        self.calls.append((type(logits).__name__, tuple(logits.shape), tuple(labels.shape), compute_result))
        self.right += int((logits.argmax(-1) == labels).sum())
        self.total += len(labels)
        if not compute_result:
            return None
        batches = sum(isinstance(call, tuple) for call in self.calls)
        values = {"accuracy": self.right / self.total, "batches": torch.tensor(float(batches))}
        self.calls.append("result")
        self.right = self.total = 0
        return values


class StepMarks(transformers.TrainerCallback):
    """Marks each `on_prediction_step` in a list shared with a `compute_metrics`."""

    def __init__(self, log):
        self.log = log

    def on_prediction_step(self, args, state, control, **kwargs):
        self.log.append("step")


def test_batch_eval_metrics_calls_compute_metrics_per_batch_as_the_trainer(tmp_path):
    metrics = {"hf": PerBatch(), "fitkit": PerBatch()}
    runs = {who: both(tmp_path, compute_metrics=metrics[who], callbacks=[StepMarks(metrics[who].calls)], only=(who,),
                      batch_eval_metrics=True)[who] for who in metrics}
    (theirs, their_out, _), (ours, our_out, _) = runs["hf"], runs["fitkit"]
    assert_same_logs(theirs, ours)  # eval_accuracy and eval_batches of the fit's evaluation
    # each batch's call after its on_prediction_step
    batches = ["step", ("Tensor", (6, 2), (6,), False), "step", ("Tensor", (6, 2), (6,), False),
               "step", ("Tensor", (2, 2), (2,), True), "result"]
    assert metrics["hf"].calls == batches * 2  # the fit's evaluation, then predict
    assert metrics["fitkit"].calls == metrics["hf"].calls
    np.testing.assert_allclose(our_out.predictions, their_out.predictions, atol=1e-5, rtol=0)
    same_metrics(their_out.metrics, our_out.metrics)
    assert isinstance(our_out.metrics["test_batches"], float)  # a one-element tensor returned: a number


def test_batch_eval_metrics_needs_a_compute_result_argument():
    with pytest.raises(ValueError, match="batch_eval_metrics.*compute_result"):
        Model(classifier()).compile(batch_eval_metrics=True, compute_metrics=accuracy)


# -- eval_use_gather_object: on one process, nothing changes (as in the Trainer) ----------------------------------
def test_eval_use_gather_object_on_one_process_changes_nothing(tmp_path):
    runs = both(tmp_path, eval_use_gather_object=True)
    (theirs, their_out, _), (ours, our_out, _) = runs["hf"], runs["fitkit"]
    assert_same_logs(theirs, ours)
    np.testing.assert_allclose(our_out.predictions, their_out.predictions, atol=1e-5, rtol=0)
    same_metrics(their_out.metrics, our_out.metrics)


# -- predict's events ---------------------------------------------------------------------------------------------
class Events(transformers.TrainerCallback):
    """A transformers callback recording the evaluation events and their metrics."""

    def __init__(self):
        self.seen = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.seen.append(("on_evaluate", dict(metrics)))

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self.seen.append(("on_predict", dict(metrics)))

    def on_prediction_step(self, args, state, control, **kwargs):
        self.seen.append(("on_prediction_step", None))


def test_hf_predict_fires_on_predict_with_its_metrics_not_on_evaluate(tmp_path):
    events = {"hf": Events(), "fitkit": Events()}
    runs = {who: both(tmp_path, callbacks=[events[who]], only=(who,))[who] for who in events}
    assert runs["hf"][1].metrics  # predict's metrics: test_loss, test_accuracy and the speed
    theirs, ours = events["hf"].seen, events["fitkit"].seen
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    assert [name for name, _ in theirs][-4:] == ["on_prediction_step"] * 3 + ["on_predict"]
    for (_, their_metrics), (_, our_metrics) in zip(theirs, ours):
        if their_metrics is not None:
            same_metrics(their_metrics, our_metrics)
    assert ours[-1][1] == runs["fitkit"][1].metrics  # the metrics hf_predict returns


def counted_accuracy(eval_pred, compute_result=False):
    """A batch-wise accuracy whose running counts live on the function (one per process)."""
    logits, labels = eval_pred
    counts = counted_accuracy.__dict__.setdefault("counts", [0, 0])
    counts[0] += int((torch.as_tensor(logits).argmax(-1) == torch.as_tensor(labels)).sum())
    counts[1] += len(labels)
    if compute_result:
        right, total = counts
        counts[:] = [0, 0]
        return {"accuracy": right / total}
    return None


@pytest.mark.slow
def test_two_processes_gather_lists_of_batches_objects_and_batch_metrics_as_one():
    """Two CPU processes (ddp_spawn, gloo) give what one process gives: the batches of every process
    in order (`eval_do_concat_batches=False`, sent pickled with `eval_use_gather_object`), and
    `batch_eval_metrics` over the gathered steps."""
    fields = dict(eval_do_concat_batches=False, eval_use_gather_object=True, batch_eval_metrics=True,
                  compute_metrics=counted_accuracy, per_device_eval_batch_size=3, hf_trainer=True)
    alone = Model(classifier()).compile(**fields).hf_predict(EVAL)
    spawned = Model(classifier()).compile(**fields, devices=2, strategy="ddp_spawn", accelerator="cpu")
    both_ranks = spawned.hf_predict(EVAL)
    assert isinstance(both_ranks.predictions, list) and len(both_ranks.predictions) == 2 * 3  # 7 samples a rank
    np.testing.assert_allclose(np.concatenate(both_ranks.predictions), np.concatenate(alone.predictions), atol=1e-5)
    np.testing.assert_array_equal(np.concatenate(both_ranks.label_ids), np.concatenate(alone.label_ids))
    assert both_ranks.metrics["test_accuracy"] == pytest.approx(alone.metrics["test_accuracy"], abs=1e-9)
    assert both_ranks.metrics["test_loss"] == pytest.approx(alone.metrics["test_loss"], abs=1e-5)
