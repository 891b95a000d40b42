"""Misuses a real user makes, one row each (DESIGN section 7): every one fails early, with an
error of the stated type whose message names the argument, before any training step and before
anything is written; the legitimate look-alikes do the right thing instead.

The table is also the "Common errors" page: `docs/common-errors.md` holds `markdown()` of it
between its two markers (`python tests/test_misuse.py` rewrites that part of the page).
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from helpers import Pairs, blobs, mlp

from fitkit import Model, TrainerCallback, TrainingArguments
from fitkit.callbacks import (
    BackupAndRestore,
    CSVLogger,
    EarlyStopping,
    LambdaCallback,
    LearningRateScheduler,
    ModelCheckpoint,
    ReduceLROnPlateau,
)

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "common-errors.md"
BEGIN, END = "<!-- table: generated from tests/test_misuse.py -->", "<!-- end of table -->"


class Ctx:
    """One row's world: models it builds (their starting weights kept), data, `output_dir`."""

    def __init__(self, tmp: pathlib.Path):
        self.tmp = tmp
        self.out = tmp / "out"
        self.x, self.y = blobs(48)
        self.models: list[tuple[Model, dict]] = []

    def model(self, net: torch.nn.Module | None = None, compile: bool = True, **options: Any) -> Model:
        model = Model(net if net is not None else mlp())
        if compile:
            kwargs = {"optimizer": "adam", "loss": "cross_entropy", **options}
            model.compile(kwargs.pop("optimizer"), kwargs.pop("loss"), kwargs.pop("metrics", None), **kwargs)
        self.models.append((model, {k: v.clone() for k, v in model.module.state_dict().items()}))
        return model

    def fit(self, model: Model | None = None, *args: Any, **kwargs: Any):
        model = model if model is not None else self.model()
        if not args and "x" not in kwargs:
            args = (self.x, self.y)
        options = {"verbose": 0, "output_dir": str(self.out), "save_strategy": "epoch", **kwargs}
        return model.fit(*args, **options)

    def trained(self) -> bool:
        return any(any(not torch.equal(v, start[k]) for k, v in m.module.state_dict().items() if k in start)
                   for m, start in self.models)

    def files(self) -> dict[str, float]:
        return {str(p): p.stat().st_mtime_ns for p in self.tmp.rglob("*") if p.is_file()}


@dataclass
class Row:
    id: str
    area: str
    what: str  # what the user did
    call: Callable[[Ctx], Any]
    error: type | None  # None: legitimate, `check` says what must hold
    names: str = ""  # text the message must contain (the argument)
    setup: Callable[[Ctx], Any] | None = None
    check: Callable[[Any, Ctx], None] | None = None
    warns: str | None = None  # a warning whose text must appear (legitimate rows)


def _ok(cond: bool, why: str = "") -> None:
    assert cond, why


class NeedsArgs(TrainerCallback):
    def __init__(self, threshold):
        self.threshold = threshold


class LossAsFloat(torch.nn.Module):
    def forward(self, outputs, targets):
        return 1.0


def _bad_metric_none(preds, target):
    return None


def _per_sample_metric(preds, target):
    return (preds.argmax(-1) == target).float()


def _float_metric(preds, target):
    return float((preds.argmax(-1) == target).float().mean())


def _flat_output() -> torch.nn.Module:
    """A regression module whose outputs have shape (N,)."""
    return torch.nn.Sequential(mlp(d_out=1), torch.nn.Flatten(0))


def _model_init(trial=None):
    return mlp()


def _search_model(ctx: Ctx, optimizer: Any = "adam") -> Model:
    model = Model(model_init=_model_init).compile(optimizer, "cross_entropy")
    return model


def _search(ctx: Ctx, model: Model | None = None, **kw: Any):
    model = model or _search_model(ctx)
    options = {"n_trials": 1, "hp_space": lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-2)},
               "epochs": 1, "verbose": 0, "output_dir": str(ctx.out), **kw}
    return model.hyperparameter_search(ctx.x, ctx.y, **options)


def _first_checkpoint(ctx: Ctx) -> None:
    ctx.fit(epochs=1)


def _compile(**options: Any) -> Callable[[Ctx], Any]:
    return lambda ctx: ctx.model(**options)


def _fit(**kwargs: Any) -> Callable[[Ctx], Any]:
    return lambda ctx: ctx.fit(**kwargs)


def _eq_epochs(n: int) -> Callable[[Any, Ctx], None]:
    return lambda history, ctx: _ok(len(history.epoch) == n, f"{len(history.epoch)} epochs")


def _xy(ctx: Ctx, x=None, y=None) -> tuple:
    return (ctx.x if x is None else x, ctx.y if y is None else y)


ROWS: list[Row] = [
    # -- constructing a Model -------------------------------------------------------------------
    Row("model-none", "Model", "`Model()` with neither a module nor `model_init`", lambda c: Model(), ValueError, "model_init"),
    Row("model-both", "Model", "`Model(net, model_init=f)`", lambda c: Model(mlp(), model_init=mlp), ValueError, "model_init"),
    Row("model-not-module", "Model", "`Model(42)`", lambda c: Model(42), TypeError, "module"),
    Row("model-init-not-callable", "Model", "`Model(model_init=42)`", lambda c: Model(model_init=42), TypeError, "model_init"),
    Row("model-init-returns-other", "Model", "`model_init` returns something that is not a module",
        lambda c: Model(model_init=lambda: "net").module, TypeError, "model_init"),
    # -- compile --------------------------------------------------------------------------------
    Row("optimizer-unknown", "compile", "an unknown optimizer name (`\"adamm\"`)", _compile(optimizer="adamm"),
        ValueError, "optimizer"),
    Row("optimizer-type", "compile", "`optimizer=42`", _compile(optimizer=42), TypeError, "optimizer"),
    Row("loss-unknown", "compile", "an unknown loss name (`\"crossentropy\"`)", _compile(loss="crossentropy"), ValueError,
        "loss"),
    Row("loss-type", "compile", "`loss=42`", _compile(loss=42), TypeError, "loss"),
    Row("metric-unknown", "compile", "an unknown metric name (`\"acc@5\"`)", _compile(metrics=["acc@5"]), ValueError,
        "metrics"),
    Row("metric-type", "compile", "`metrics=[42]`", _compile(metrics=[42]), TypeError, "metrics"),
    Row("metric-one-name", "compile", "`metrics=\"accuracy\"` (one name, not a list)",
        lambda c: c.fit(c.model(metrics="accuracy"), epochs=1), None,
        check=lambda h, c: _ok("accuracy" in h.history)),
    Row("option-unknown", "compile", "an unknown option (`learning_rat=0.1`)", _compile(learning_rat=0.1), TypeError,
        "learning_rate"),
    Row("option-epoch", "compile", "`epoch=3` for `epochs=3`", _compile(epoch=3), TypeError, "epochs"),
    Row("lr-negative", "compile", "`learning_rate=-1`", _compile(learning_rate=-1), ValueError, "learning_rate"),
    Row("lr-nan", "compile", "`learning_rate=float('nan')`", _compile(learning_rate=float("nan")), ValueError,
        "learning_rate"),
    Row("lr-text", "compile", "`learning_rate=\"fast\"`", _compile(learning_rate="fast"), ValueError, "learning_rate"),
    Row("lr-string-number", "compile", "`learning_rate=\"1e-3\"` (a number as a string)",
        lambda c: c.model(learning_rate="1e-3").config.args.learning_rate, None,
        check=lambda v, c: _ok(v == pytest.approx(1e-3), repr(v))),
    Row("wd-string-number", "compile", "`weight_decay=\"0.01\"`",
        lambda c: c.model(weight_decay="0.01").config.args.weight_decay, None,
        check=lambda v, c: _ok(v == pytest.approx(0.01), repr(v))),
    Row("wd-negative", "compile", "`weight_decay=-0.1`", _compile(weight_decay=-0.1), ValueError, "weight_decay"),
    Row("clip-zero", "compile", "`max_grad_norm=0`", _compile(max_grad_norm=0), ValueError, "max_grad_norm"),
    Row("accum-zero", "compile", "`gradient_accumulation_steps=0`", _compile(gradient_accumulation_steps=0),
        ValueError, "gradient_accumulation_steps"),
    Row("warmup-ratio", "compile", "`warmup_ratio=1.5`", _compile(warmup_ratio=1.5), ValueError, "warmup_ratio"),
    Row("warmup-steps", "compile", "`warmup_steps=-1`", _compile(warmup_steps=-1), ValueError, "warmup_steps"),
    Row("scheduler-unknown", "compile", "`lr_scheduler=\"exponential\"`", _compile(lr_scheduler="exponential"),
        ValueError, "lr_scheduler"),
    Row("precision-unknown", "compile", "`precision=\"8-bit\"`", _compile(precision="8-bit"), ValueError, "precision"),
    Row("jit-compile-unknown", "compile", "`jit_compile=\"fast\"` (not a torch.compile mode)",
        _compile(jit_compile="fast"), ValueError, "jit_compile"),
    Row("strategy-unknown", "compile", "`strategy=\"ddpp\"`", _compile(strategy="ddpp"), ValueError, "strategy"),
    Row("accelerator-unknown", "compile", "`accelerator=\"quantum\"`", _compile(accelerator="quantum"), ValueError,
        "accelerator"),
    Row("accelerator-cuda", "compile", "`accelerator=\"cuda\"` on a machine without CUDA",
        _compile(accelerator="cuda"), ValueError, "accelerator"),
    Row("devices-zero", "compile", "`devices=0`", _compile(devices=0), ValueError, "devices"),
    Row("devices-negative", "compile", "`devices=-2`", _compile(devices=-2), ValueError, "devices"),
    Row("devices-text", "compile", "`devices=\"two\"`", _compile(devices="two"), ValueError, "devices"),
    Row("nodes-zero", "compile", "`num_nodes=0`", _compile(num_nodes=0), ValueError, "num_nodes"),
    Row("log-level", "compile", "`log_level=\"loud\"`", _compile(log_level="loud"), ValueError, "log_level"),
    Row("verbose-3", "compile", "`verbose=3`", _compile(verbose=3), ValueError, "verbose"),
    Row("eval-strategy-unknown", "compile", "`eval_strategy=\"sometimes\"`", _compile(eval_strategy="sometimes"),
        ValueError, "eval_strategy"),
    Row("save-strategy-unknown", "compile", "`save_strategy=\"always\"`", _compile(save_strategy="always"), ValueError,
        "save_strategy"),
    Row("logging-strategy-unknown", "compile", "`logging_strategy=\"often\"`", _compile(logging_strategy="often"),
        ValueError, "logging_strategy"),
    Row("logging-steps-zero", "compile", "`logging_steps=0`", _compile(logging_steps=0), ValueError, "logging_steps"),
    Row("save-limit-zero", "compile", "`save_total_limit=0`", _compile(save_total_limit=0), ValueError,
        "save_total_limit"),
    Row("seed-text", "compile", "`seed=\"lucky\"`", _compile(seed="lucky"), ValueError, "seed"),
    Row("seed-bool", "compile", "`seed=True`", _compile(seed=True), ValueError, "seed"),
    Row("compile-epochs", "compile", "`compile(epochs=3)` then `fit(x, y)`: compile's options are fit's defaults",
        lambda c: c.fit(c.model(epochs=3)), None, check=_eq_epochs(3)),
    Row("compile-epochs-fit-wins", "compile", "`compile(epochs=3)` then `fit(x, y, epochs=2)`: an explicit value wins",
        lambda c: c.fit(c.model(epochs=3), epochs=2), None, check=_eq_epochs(2)),
    Row("compile-batch-size", "compile", "`compile(batch_size=16)` then `fit(x, y)`",
        lambda c: c.fit(c.model(batch_size=16), save_strategy="no"), None,
        check=lambda h, c: _ok(c.models[-1][0].state.global_step == 3, str(c.models[-1][0].state.global_step))),
    # -- TrainingArguments ------------------------------------------------------------------------
    Row("args-unknown", "TrainingArguments", "`TrainingArguments(epocs=3)`", lambda c: TrainingArguments(epocs=3),
        TypeError, "epocs"),
    Row("args-epochs-zero", "TrainingArguments", "`num_train_epochs=0`", lambda c: TrainingArguments(num_train_epochs=0),
        ValueError, "num_train_epochs"),
    Row("args-batch-float", "TrainingArguments", "`per_device_train_batch_size=2.5`",
        lambda c: TrainingArguments(per_device_train_batch_size=2.5), ValueError, "per_device_train_batch_size"),
    Row("args-max-steps-zero", "TrainingArguments", "`max_steps=0`", lambda c: TrainingArguments(max_steps=0), ValueError,
        "max_steps"),
    Row("args-eval-steps-zero", "TrainingArguments", "`eval_steps=0`", lambda c: TrainingArguments(eval_steps=0),
        ValueError, "eval_steps"),
    Row("args-shuffle-text", "TrainingArguments", "`shuffle=\"no\"`", lambda c: TrainingArguments(shuffle="no"),
        ValueError, "shuffle"),
    Row("args-type", "fit", "`fit(args={...})` (a dict, not TrainingArguments)",
        lambda c: c.fit(args={"num_train_epochs": 2}), TypeError, "args"),
    Row("args-beside-options", "fit", "`fit(args=TrainingArguments(...), epochs=3)`: merged, not dropped",
        lambda c: c.fit(args=TrainingArguments(num_train_epochs=1, verbose=0, output_dir=str(c.out)), epochs=3,
                        save_strategy="no"), None, check=_eq_epochs(3)),
    # -- fit: options ------------------------------------------------------------------------------
    Row("fit-before-compile", "fit", "`fit` before `compile`", lambda c: c.fit(c.model(compile=False)), RuntimeError,
        "compile"),
    Row("fit-unknown-option", "fit", "`fit(x, y, epoch=3)`", _fit(epoch=3), TypeError, "epochs"),
    Row("fit-unknown-none", "fit", "`fit(x, y, foo=None)` (an unknown option set to None)", _fit(foo=None), TypeError,
        "foo"),
    Row("fit-epochs-zero", "fit", "`epochs=0`", _fit(epochs=0), ValueError, "epochs"),
    Row("fit-epochs-negative", "fit", "`epochs=-1`", _fit(epochs=-1), ValueError, "epochs"),
    Row("fit-batch-zero", "fit", "`batch_size=0`", _fit(batch_size=0), ValueError, "batch_size"),
    Row("fit-batch-float", "fit", "`batch_size=2.5`", _fit(batch_size=2.5), ValueError, "batch_size"),
    Row("fit-max-steps-negative", "fit", "`max_steps=-5`", _fit(max_steps=-5), ValueError, "max_steps"),
    Row("fit-shuffle-text", "fit", "`shuffle=\"no\"`", _fit(shuffle="no"), ValueError, "shuffle"),
    Row("fit-prefetch-text", "fit", "`prefetch=\"yes\"`", _fit(prefetch="yes"), ValueError, "prefetch"),
    Row("fit-initial-epoch-past-end", "fit", "`fit(x, y, epochs=3, initial_epoch=3)` (Keras' `epochs` is the last epoch)",
        _fit(epochs=3, initial_epoch=3), ValueError, "initial_epoch"),
    Row("fit-keras-workers", "fit", "`fit(x, y, workers=4)` (a Keras option)", _fit(workers=4), TypeError, "num_workers"),
    Row("fit-steps-per-epoch-zero", "fit", "`steps_per_epoch=0`", _fit(steps_per_epoch=0), ValueError, "steps_per_epoch"),
    Row("fit-validation-freq-zero", "fit", "`validation_freq=0`", _fit(validation_freq=0), ValueError, "validation_freq"),
    Row("evaluate-verbose-bad", "evaluate", "`evaluate(x, y, verbose=3)`",
        lambda c: c.model().evaluate(c.x, c.y, verbose=3), ValueError, "verbose"),
    Row("backward-outside-step", "Model", "`model.backward(loss)` outside an overridden step",
        lambda c: c.model().backward(torch.tensor(1.0, requires_grad=True)), RuntimeError, "train_step"),
    Row("fit-load-best-without-eval", "fit", "`load_best_model_at_end=True` without validation data",
        _fit(load_best_model_at_end=True), ValueError, "load_best_model_at_end"),
    Row("fit-eval-steps-without-data", "fit", "`eval_strategy=\"steps\"` without validation data",
        _fit(eval_strategy="steps", eval_steps=2), ValueError, "eval_strategy"),
    Row("fit-eval-steps-at-the-end", "fit", "`eval_strategy=\"steps\"` without `eval_steps` on a run shorter than "
        "`logging_steps`: evaluated once, at `max_steps` (HF 5.x)", _fit(eval_strategy="steps", validation_split=0.25),
        None, check=lambda h, c: _ok(sum(1 for v in h.history["val_loss"] if v == v) == 1, repr(h.history))),
    Row("fit-output-dir-file", "fit", "`output_dir` is an existing file",
        lambda c: c.fit(output_dir=str(c.tmp / "file.txt")), ValueError, "output_dir",
        setup=lambda c: (c.tmp / "file.txt").write_text("not a directory")),
    Row("fit-class-weight-empty", "fit", "`class_weight={}`", _fit(class_weight={}), ValueError, "class_weight"),
    Row("fit-class-weight-list", "fit", "`class_weight=[1, 2, 3]`", _fit(class_weight=[1, 2, 3]), ValueError,
        "class_weight"),
    Row("fit-resume-missing", "fit", "`resume_from_checkpoint` names a path that does not exist",
        lambda c: c.fit(resume_from_checkpoint=str(c.tmp / "nope")), ValueError, "resume_from_checkpoint"),
    Row("fit-resume-not-checkpoint", "fit", "`resume_from_checkpoint` names a folder that is not a checkpoint",
        lambda c: c.fit(resume_from_checkpoint=str(c.tmp)), ValueError, "resume_from_checkpoint"),
    Row("fit-resume-other-architecture", "fit", "resuming a checkpoint written for another architecture",
        lambda c: c.fit(c.model(mlp(hidden=24)), resume_from_checkpoint=True, epochs=2), ValueError, "checkpoint",
        setup=_first_checkpoint),
    Row("fit-resume-other-classes", "fit", "resuming a checkpoint written for another number of classes",
        lambda c: c.fit(c.model(mlp(d_out=4)), resume_from_checkpoint=True, epochs=2), ValueError, "checkpoint",
        setup=_first_checkpoint),
    Row("fit-resume-other-optimizer", "fit", "resuming a checkpoint written with another optimizer",
        lambda c: c.fit(c.model(optimizer="sgd"), resume_from_checkpoint=True, epochs=2), ValueError, "optimizer",
        setup=_first_checkpoint),
    Row("fit-optimizer-other-module", "fit", "an optimizer instance built on another module's parameters",
        lambda c: c.fit(c.model(optimizer=torch.optim.SGD(mlp().parameters(), lr=0.1))), ValueError, "optimizer"),
    # -- fit: data ---------------------------------------------------------------------------------
    Row("x-none", "data", "`fit()` with no data", lambda c: c.fit(c.model(), None), ValueError, "x"),
    Row("x-empty-tensor", "data", "an empty tensor as `x`", lambda c: c.fit(c.model(), c.x[:0], c.y[:0]), ValueError,
        "x"),
    Row("x-empty-list", "data", "an empty Python list as `x`", lambda c: c.fit(c.model(), []), ValueError, "x"),
    Row("x-string", "data", "a string as `x`", lambda c: c.fit(c.model(), "data.csv"), TypeError, "x"),
    Row("x-generator", "data", "a one-shot generator of batches as `x`",
        lambda c: c.fit(c.model(), ((c.x[i:i + 8], c.y[i:i + 8]) for i in range(0, 48, 8))), TypeError, "x"),
    Row("xy-length", "data", "`x` and `y` of different lengths", lambda c: c.fit(c.model(), c.x, c.y[:-1]), ValueError,
        "y"),
    Row("sw-length", "data", "`sample_weight` of another length",
        lambda c: c.fit(sample_weight=torch.ones(10)), ValueError, "sample_weight"),
    Row("y-with-loader", "data", "`y` given beside a DataLoader",
        lambda c: c.fit(c.model(), torch.utils.data.DataLoader(Pairs(c.x, c.y), batch_size=8), c.y), ValueError, "y"),
    Row("x-features", "data", "`x` with the wrong number of features",
        lambda c: c.fit(c.model(), torch.randn(48, 5), c.y), ValueError, "x"),
    Row("val-features", "data", "`validation_data` with the wrong number of features",
        lambda c: c.fit(validation_data=(torch.randn(16, 5), c.y[:16])), ValueError, "validation_data"),
    Row("val-one-tuple", "data", "`validation_data=(x,)` (no targets)", lambda c: c.fit(validation_data=(c.x,)),
        ValueError, "validation_data"),
    Row("val-split-big", "data", "`validation_split=1.5`", _fit(validation_split=1.5), ValueError, "validation_split"),
    Row("val-split-empty", "data", "`validation_split` so small the split is empty", _fit(validation_split=0.001),
        ValueError, "validation_split"),
    Row("val-split-and-data", "data", "both `validation_split` and `validation_data`",
        lambda c: c.fit(validation_split=0.2, validation_data=(c.x, c.y)), ValueError, "validation_split"),
    Row("val-split-loader", "data", "`validation_split` with a DataLoader",
        lambda c: c.fit(c.model(), torch.utils.data.DataLoader(Pairs(c.x, c.y), batch_size=8), validation_split=0.2),
        ValueError, "validation_split"),
    Row("labels-range", "data", "class labels >= the number of outputs", lambda c: c.fit(c.model(), c.x, c.y + 3),
        ValueError, "y"),
    Row("labels-negative", "data", "negative class labels", lambda c: c.fit(c.model(), c.x, c.y - 1), ValueError, "y"),
    Row("labels-float", "data", "float class labels for `cross_entropy`", lambda c: c.fit(c.model(), c.x, c.y.float()),
        ValueError, "y"),
    Row("labels-column", "data", "labels of shape (N, 1) for `cross_entropy`",
        lambda c: c.fit(c.model(), c.x, c.y[:, None]), ValueError, "y"),
    Row("labels-one-hot", "data", "one-hot float targets for `cross_entropy` (class probabilities)",
        lambda c: c.fit(c.model(), c.x, torch.nn.functional.one_hot(c.y, 3).float(), epochs=1), None,
        check=lambda h, c: _ok(len(h.history["loss"]) == 1)),
    Row("mse-shapes", "data", "`mse` with outputs (N,) and targets (N, 1) (would broadcast to N x N)",
        lambda c: c.fit(c.model(_flat_output(), loss="mse"), c.x, c.y.float()[:, None]), ValueError, "y"),
    Row("mae-shapes", "data", "`mae` with outputs (N,) and targets (N, 1)",
        lambda c: c.fit(c.model(_flat_output(), loss="mae"), c.x, c.y.float()[:, None]), ValueError, "y"),
    Row("huber-shapes", "data", "`huber` with outputs (N, 2) and targets (N,)",
        lambda c: c.fit(c.model(mlp(d_out=2), loss="huber"), c.x, c.y.float()), ValueError, "y"),
    Row("mse-matching", "data", "`mse` with outputs (N, 1) and targets (N, 1)",
        lambda c: c.fit(c.model(mlp(d_out=1), loss="mse"), c.x, c.y.float()[:, None], epochs=1), None,
        check=lambda h, c: _ok(len(h.history["loss"]) == 1)),
    Row("mse-squeezed", "data", "`mse` with outputs (N, 1) and targets (N,) (the outputs are squeezed, as Keras does)",
        lambda c: c.fit(c.model(mlp(d_out=1), loss="mse"), c.x, c.y.float(), epochs=1), None,
        check=lambda h, c: _ok(len(h.history["loss"]) == 1)),
    Row("bce-labels", "data", "`binary_crossentropy` with labels {0, 1, 2}",
        lambda c: c.fit(c.model(mlp(d_out=1), loss="binary_crossentropy"), c.x, c.y.float()[:, None]), ValueError, "y"),
    Row("bce-shapes", "data", "`binary_crossentropy` with outputs (N,) and targets (N, 1)",
        lambda c: c.fit(c.model(_flat_output(), loss="binary_crossentropy"), c.x, (c.y > 0).float()[:, None]),
        ValueError, "y"),
    Row("x-int64", "data", "int64 features for a module of Linear layers",
        lambda c: c.fit(c.model(), (c.x * 10).long(), c.y), TypeError, "x"),
    Row("x-float64-torch", "data", "float64 torch features (cast to float32, as NumPy input is)",
        lambda c: c.fit(c.model(), c.x.double(), c.y, epochs=1), None,
        check=lambda h, c: _ok(len(h.history["loss"]) == 1)),
    Row("x-float64-numpy", "data", "float64 NumPy features", lambda c: c.fit(c.model(), c.x.double().numpy(),
        c.y.numpy(), epochs=1), None, check=lambda h, c: _ok(len(h.history["loss"]) == 1)),
    Row("x-embedding-ints", "data", "integer token ids for a module that starts with an Embedding",
        lambda c: c.fit(c.model(torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Flatten(),
                                                    torch.nn.Linear(32, 3))),
                        torch.randint(0, 10, (48, 8)), c.y, epochs=1), None,
        check=lambda h, c: _ok(len(h.history["loss"]) == 1)),
    Row("x-nan", "data", "NaN in `x` (a warning, training goes on)",
        lambda c: c.fit(c.model(), torch.where(torch.arange(48)[:, None] == 0, float("nan"), c.x), c.y, epochs=1,
                        save_strategy="no"), None, warns="x", check=lambda h, c: None),
    Row("y-inf", "data", "inf in float targets (a warning)",
        lambda c: c.fit(c.model(mlp(d_out=1), loss="mse"), c.x,
                        torch.where(torch.arange(48) == 0, float("inf"), c.y.float())[:, None], epochs=1,
                        save_strategy="no"), None, warns="y", check=lambda h, c: None),
    Row("loss-forgotten", "data", "no `loss` for a module that does not return its loss",
        lambda c: c.fit(c.model(loss=None)), ValueError, "loss"),
    Row("loss-returns-float", "data", "a loss that returns a Python float",
        lambda c: c.fit(c.model(loss=LossAsFloat())), TypeError, "loss"),
    Row("loss-per-sample", "data", "a loss that returns one value per sample (reduced as Keras does)",
        lambda c: c.fit(c.model(loss=torch.nn.CrossEntropyLoss(reduction="none")), epochs=1, save_strategy="no"),
        None, check=lambda h, c: _ok(math.isfinite(h.history["loss"][0]), str(h.history))),
    Row("metric-returns-none", "data", "a metric callable that returns None",
        lambda c: c.fit(c.model(metrics=[_bad_metric_none])), TypeError, "metrics"),
    Row("metric-per-sample", "data", "a metric callable that returns one value per sample",
        lambda c: c.fit(c.model(metrics=[_per_sample_metric])), TypeError, "metrics"),
    Row("metric-returns-float", "data", "a metric callable that returns a Python float",
        lambda c: c.fit(c.model(metrics=[_float_metric]), epochs=1, save_strategy="no"), None,
        check=lambda h, c: _ok("_float_metric" in h.history or any("float_metric" in k for k in h.history), str(h.history))),
    # -- callbacks -----------------------------------------------------------------------------------
    Row("callbacks-not-list", "callbacks", "`callbacks=EarlyStopping()` (not in a list)",
        _fit(callbacks=EarlyStopping(monitor="loss")), TypeError, "callbacks"),
    Row("callbacks-number", "callbacks", "`callbacks=[42]`", _fit(callbacks=[42]), TypeError, "callbacks[0]"),
    Row("callbacks-lambda", "callbacks", "`callbacks=[lambda ...]`", _fit(callbacks=[lambda *a: None]), TypeError,
        "LambdaCallback"),
    Row("callbacks-string", "callbacks", "`callbacks=[\"early_stopping\"]`", _fit(callbacks=["early_stopping"]),
        TypeError, "callbacks[0]"),
    Row("callbacks-second-bad", "callbacks", "a bad item after a good one", _fit(callbacks=[EarlyStopping(), 1.5]),
        TypeError, "callbacks[1]"),
    Row("callbacks-class-needs-args", "callbacks", "a callback class whose constructor needs arguments",
        _fit(callbacks=[NeedsArgs]), TypeError, "NeedsArgs"),
    Row("callbacks-class", "callbacks", "a callback class with a default constructor",
        lambda c: c.fit(callbacks=[EarlyStopping], epochs=1, validation_split=0.25), None,
        check=lambda h, c: _ok(len(h.epoch) == 1)),
    Row("add-callback-number", "callbacks", "`model.add_callback(42)`", lambda c: c.model().add_callback(42), TypeError,
        "callback"),
    Row("es-mode", "callbacks", "`EarlyStopping(mode=\"lowest\")`", lambda c: EarlyStopping(mode="lowest"), ValueError,
        "mode"),
    Row("es-patience", "callbacks", "`EarlyStopping(patience=-1)`", lambda c: EarlyStopping(patience=-1), ValueError,
        "patience"),
    Row("es-monitor-unknown", "callbacks", "`EarlyStopping(monitor=\"val_custom\")` with `mode=\"auto\"`",
        lambda c: EarlyStopping(monitor="val_custom"), ValueError, "mode"),
    Row("es-start", "callbacks", "`EarlyStopping(start_from_epoch=-1)`", lambda c: EarlyStopping(start_from_epoch=-1),
        ValueError, "start_from_epoch"),
    Row("mc-empty", "callbacks", "`ModelCheckpoint(\"\")`", lambda c: ModelCheckpoint(""), ValueError, "filepath"),
    Row("mc-freq", "callbacks", "`ModelCheckpoint(save_freq=0)`", lambda c: ModelCheckpoint("m.pt", save_freq=0),
        ValueError, "save_freq"),
    Row("csv-empty", "callbacks", "`CSVLogger(\"\")`", lambda c: CSVLogger(""), ValueError, "filename"),
    Row("csv-separator", "callbacks", "`CSVLogger(separator=\";;\")`", lambda c: CSVLogger("t.csv", separator=";;"),
        ValueError, "separator"),
    Row("plateau-factor", "callbacks", "`ReduceLROnPlateau(factor=1.5)`", lambda c: ReduceLROnPlateau(factor=1.5),
        ValueError, "factor"),
    Row("plateau-min-lr", "callbacks", "`ReduceLROnPlateau(min_lr=-1)`", lambda c: ReduceLROnPlateau(min_lr=-1),
        ValueError, "min_lr"),
    Row("backup-empty", "callbacks", "`BackupAndRestore(\"\")`", lambda c: BackupAndRestore(""), ValueError,
        "backup_dir"),
    Row("backup-freq", "callbacks", "`BackupAndRestore(dir, save_freq=0)`", lambda c: BackupAndRestore("b", save_freq=0),
        ValueError, "save_freq"),
    Row("lrs-type", "callbacks", "`LearningRateScheduler(0.1)`", lambda c: LearningRateScheduler(0.1), TypeError,
        "schedule"),
    Row("lambda-type", "callbacks", "`LambdaCallback(on_epoch_end=42)`", lambda c: LambdaCallback(on_epoch_end=42),
        TypeError, "on_epoch_end"),
    # -- evaluate and predict -------------------------------------------------------------------------
    Row("evaluate-before-compile", "evaluate", "`evaluate` before `compile`",
        lambda c: c.model(compile=False).evaluate(c.x, c.y), RuntimeError, "compile"),
    Row("evaluate-none", "evaluate", "`evaluate()` with no data", lambda c: c.model().evaluate(), ValueError, "x"),
    Row("evaluate-empty", "evaluate", "`evaluate` on empty tensors", lambda c: c.model().evaluate(c.x[:0], c.y[:0]),
        ValueError, "x"),
    Row("evaluate-length", "evaluate", "`evaluate` with `x` and `y` of different lengths",
        lambda c: c.model().evaluate(c.x, c.y[:5]), ValueError, "y"),
    Row("evaluate-features", "evaluate", "`evaluate` with the wrong number of features",
        lambda c: c.model().evaluate(torch.randn(8, 5), c.y[:8]), ValueError, "x"),
    Row("evaluate-batch", "evaluate", "`evaluate(batch_size=0)`", lambda c: c.model().evaluate(c.x, c.y, batch_size=0),
        ValueError, "batch_size"),
    Row("evaluate-callbacks", "evaluate", "`evaluate(callbacks=[42])`",
        lambda c: c.model().evaluate(c.x, c.y, callbacks=[42]), TypeError, "callbacks[0]"),
    Row("predict-none", "predict", "`predict(None)`", lambda c: c.model().predict(None), ValueError, "x"),
    Row("predict-empty", "predict", "`predict` on an empty tensor", lambda c: c.model().predict(c.x[:0]), ValueError,
        "x"),
    Row("predict-features", "predict", "`predict` with the wrong number of features",
        lambda c: c.model().predict(torch.randn(8, 5)), ValueError, "x"),
    Row("predict-batch", "predict", "`predict(batch_size=-1)`", lambda c: c.model().predict(c.x, batch_size=-1),
        ValueError, "batch_size"),
    Row("predict-uncompiled", "predict", "`predict` without `compile` (allowed: no loss is needed)",
        lambda c: c.model(compile=False).predict(c.x), None, check=lambda out, c: _ok(tuple(out.shape) == (48, 3))),
    # -- save and load -----------------------------------------------------------------------------------
    Row("load-missing", "save/load", "`Model.load` of a path that does not exist",
        lambda c: Model.load(str(c.tmp / "nope.pt"), mlp()), FileNotFoundError, "path"),
    Row("load-not-fitkit", "save/load", "`Model.load` of a torch file fitkit did not write",
        lambda c: Model.load(str(c.tmp / "w.pt"), mlp()), ValueError, "Model.save",
        setup=lambda c: torch.save(mlp().state_dict(), c.tmp / "w.pt")),
    Row("load-garbage", "save/load", "`Model.load` of a file that is not a torch file",
        lambda c: Model.load(str(c.tmp / "g.pt"), mlp()), ValueError, "fitkit model file",
        setup=lambda c: (c.tmp / "g.pt").write_bytes(b"not a checkpoint")),
    # -- search ---------------------------------------------------------------------------------------------
    Row("search-no-init", "search", "`hyperparameter_search` on a model built from a module",
        lambda c: c.model().hyperparameter_search(c.x, c.y, n_trials=1), ValueError, "model_init"),
    Row("search-before-compile", "search", "`hyperparameter_search` before `compile`",
        lambda c: Model(model_init=_model_init).hyperparameter_search(c.x, c.y, n_trials=1), RuntimeError, "compile"),
    Row("search-optimizer-instance", "search", "an optimizer instance in a search",
        lambda c: _search(c, _search_model(c, torch.optim.SGD(mlp().parameters(), lr=0.1))), ValueError, "optimizer"),
    Row("search-trials-zero", "search", "`n_trials=0`", lambda c: _search(c, n_trials=0), ValueError, "n_trials"),
    Row("search-trials-text", "search", "`n_trials=\"5\"`", lambda c: _search(c, n_trials="5"), ValueError, "n_trials"),
    Row("search-backend", "search", "`backend=\"ray\"`", lambda c: _search(c, backend="ray"), ValueError, "backend"),
    Row("search-hp-none", "search", "`hp_space` returning None", lambda c: _search(c, hp_space=lambda t: None),
        ValueError, "hp_space"),
    Row("search-hp-unknown", "search", "`hp_space` returning a name that is not an option",
        lambda c: _search(c, hp_space=lambda t: {"hidden": t.suggest_int("hidden", 4, 8)}), ValueError, "model_init"),
    Row("search-direction-max", "search", "`direction=\"max\"` (Optuna spells it \"maximize\")",
        lambda c: _search(c, direction="max", validation_split=0.25), None,
        check=lambda best, c: _ok(best.run_id == "0", repr(best))),
    Row("search-direction-unknown", "search", "`direction=\"up\"`", lambda c: _search(c, direction="up"), ValueError,
        "direction"),
    Row("search-option-unknown", "search", "an unknown search option (`n_trial=3`)", lambda c: _search(c, n_trial=3),
        TypeError, "n_trials"),
]


def _messages(err: BaseException) -> str:
    """The error's text and the texts it was raised from."""
    parts = []
    while err is not None:
        parts.append(str(err))
        err = err.__cause__
    return "\n".join(parts)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_misuse(row: Row, tmp_path):
    if row.id == "accelerator-cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is present here: accelerator='cuda' is legitimate")
    ctx = Ctx(tmp_path)
    if row.setup is not None:
        row.setup(ctx)
    ctx.models.clear()  # models built for the set-up may have trained
    before = ctx.files()
    if row.error is None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            value = row.call(ctx)
        if row.warns is not None:
            texts = [str(w.message) for w in seen if issubclass(w.category, UserWarning)]
            assert any(f"`{row.warns}`" in t or f"'{row.warns}'" in t for t in texts), texts
        row.check(value, ctx)
        return
    with pytest.raises(row.error) as caught:
        row.call(ctx)
    message = str(caught.value)
    assert row.names in message, f"{row.names!r} not named in: {message}"
    assert not ctx.trained(), "a training step ran before the error"
    assert ctx.files() == before, "a file was written before the error"


def test_the_table_is_large_and_unique():
    assert len(ROWS) >= 120
    assert len({r.id for r in ROWS}) == len(ROWS)


def markdown() -> str:
    """The table as the docs page shows it, by area."""
    lines = []
    for area in dict.fromkeys(r.area for r in ROWS):
        lines += [f"### {area}", "", "| you wrote | fitkit says |", "| --- | --- |"]
        for r in (r for r in ROWS if r.area == area):
            said = f"`{r.error.__name__}` naming `{r.names}`" if r.error else "accepted: " + (
                f"trains, with a warning naming `{r.warns}`" if r.warns else "does the right thing")
            lines.append(f"| {r.what} | {said} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _page_table(text: str) -> re.Match:
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, re.S)
    assert match, f"{DOC} lacks the markers {BEGIN!r} ... {END!r}"
    return match


def test_the_common_errors_page_shows_this_table():
    assert _page_table(DOC.read_text(encoding="utf-8")).group(1) == markdown(), "run: python tests/test_misuse.py"


if __name__ == "__main__":  # rewrite the table in docs/common-errors.md
    text = DOC.read_text(encoding="utf-8")
    span = _page_table(text).span(1)
    DOC.write_text(text[: span[0]] + markdown() + text[span[1]:], encoding="utf-8")
    print(f"wrote {len(ROWS)} rows to {DOC}")
