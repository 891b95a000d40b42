"""Hugging Face's `compute_metrics(EvalPrediction) -> dict`, over one evaluation.

The loop hands each evaluation batch's outputs and target to a `PredictionCollector`; after
the last batch, predictions and label ids (gathered over every process, as NumPy arrays) go to
`compute_metrics` once, and its values come back under the evaluation's prefix::

    def compute_metrics(eval_pred):
        logits, labels = eval_pred
        return {"accuracy": float((logits.argmax(-1) == labels).mean())}

    model.fit(x, y, validation_split=0.2, compute_metrics=compute_metrics)   # logs val_accuracy

Nothing here runs during training steps: only evaluations with `compute_metrics` set pay for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from fitkit.common.tensors import map_tensors, tensors_of
from fitkit.engine.gather import BatchJoiner, gather_batches, gather_blocks, pad_concat


class PredictionOutput(NamedTuple):
    """What `Model.hf_predict` returns (HF's `PredictionOutput`): NumPy `predictions` and
    `label_ids` (None without labels) over the whole set, and its `metrics` (`test_loss`, ...).
    Unpacks into exactly these three: `predictions, label_ids, metrics = model.hf_predict(ds)`."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float]


class EvalPrediction:
    """What `compute_metrics` receives (HF's fields): `predictions` (the model's logits, or its
    outputs other than the loss) and `label_ids`, NumPy arrays over the whole evaluation set.
    Unpacks as `predictions, label_ids = eval_pred`."""

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None) -> None:
        self.predictions, self.label_ids, self.inputs, self.losses = predictions, label_ids, inputs, losses

    def _items(self) -> tuple:
        """HF's elements: the predictions and labels, then the inputs and losses that were kept."""
        return (self.predictions, self.label_ids, *(v for v in (self.inputs, self.losses) if v is not None))

    def __iter__(self):
        return iter(self._items())

    def __getitem__(self, index: int) -> Any:
        return self._items()[index]

    def __len__(self) -> int:
        return len(self._items())


def predictions_of(outputs: Any) -> Any:
    """The prediction part of a module's outputs, as HF's Trainer takes it: a mapping's (or
    `ModelOutput`'s) `logits`, else its values but the loss; a tuple without a leading scalar
    loss; a tensor as it is."""
    if isinstance(outputs, Mapping) or hasattr(outputs, "keys"):
        if "logits" in outputs:
            return outputs["logits"]
        rest = tuple(v for k, v in outputs.items() if k != "loss")
        return rest[0] if len(rest) == 1 else rest
    if isinstance(outputs, (tuple, list)):
        if outputs and isinstance(outputs[0], torch.Tensor) and outputs[0].dim() == 0:
            outputs = outputs[1:]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
    return outputs


def _numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:  # NumPy has no bfloat16 (float16 stays, as in HF's nested_numpify)
            value = value.float()
        return value.cpu().numpy()
    if isinstance(value, (tuple, list)):
        return type(value)(_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: _numpy(v) for k, v in value.items()}
    return value


def generated_ids(module: Any, inputs: Any, target: Any, args: Any) -> tuple[torch.Tensor, Any]:
    """`module.generate` over one batch's inputs, as HF's `Seq2SeqTrainer` calls it for
    `predict_with_generate` (`generation_max_length`, `generation_num_beams`, `generation_config`
    when set), and the batch's target; both padded with the model's pad token to the generation
    config's `max_length` (or `max_new_tokens + 1`) when shorter, as the Trainer pads them."""
    generate = getattr(module, "generate", None)
    if not callable(generate) or not isinstance(inputs, Mapping):
        raise ValueError(f"`predict_with_generate=True` needs a module with `generate()` (a transformers generation "
                         f"model) and keyword batches; {type(module).__name__} has no generate() or the batch is not "
                         "a dict: set predict_with_generate=False")
    options = {name: value for name, value in (("max_length", args.generation_max_length),
                                               ("num_beams", args.generation_num_beams),
                                               ("generation_config", args.generation_config)) if value is not None}
    given = {k: v for k, v in inputs.items() if k not in ("decoder_input_ids", "decoder_attention_mask")}
    ids = generate(**given, **options)
    _settle_generation_config(module.generation_config)
    config = options.get("generation_config") or module.generation_config
    pad = getattr(module.config, "pad_token_id", None)
    pad = config.eos_token_id if pad is None else pad
    return _to_length(ids, config, pad), _to_length(target, config, pad)


def _settle_generation_config(config: Any) -> None:
    """What `Seq2SeqTrainer.prediction_step` does to the model's generation config after each
    `generate`: no longer re-read from the model's config, and its unset fields (transformers 5)
    filled with generate's defaults. Later calls then see `max_length=20` where the first, with
    it unset, generated up to the model-agnostic default (21 for an encoder-decoder)."""
    if getattr(config, "_from_model_config", False):
        config._from_model_config = False
    defaults = getattr(config, "_get_default_generation_params", None)
    if callable(defaults):
        config.update(**defaults(), defaults_only=True)


def _to_length(ids: Any, config: Any, pad: int) -> Any:
    """`ids` padded with `pad` to the generation config's `max_length` (the Trainer's rule: not
    `generation_max_length`), or to `max_new_tokens + 1`, when shorter."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return ids
    # transformers 5 leaves unset fields None; the Trainer reads them with generation's defaults (max_length 20)
    defaults: dict[str, Any] = getattr(config, "_get_default_generation_params", dict)()
    max_length = config.max_length if config.max_length is not None else defaults.get("max_length")
    max_new = config.max_new_tokens if config.max_new_tokens is not None else defaults.get("max_new_tokens")
    width = None
    if max_length and ids.shape[-1] < max_length:
        width = max_length
    elif max_new is not None and ids.shape[-1] < max_new + 1:
        width = max_new + 1
    if width is None:
        return ids
    padded = ids.new_full((ids.shape[0], width), int(pad))
    padded[:, : ids.shape[-1]] = ids
    return padded


class PredictionCollector:
    """Collects one evaluation's predictions and targets (detached, on their device), then calls
    `compute_metrics` once with them gathered; HF's `batch_eval_metrics`: once per batch instead,
    with that batch's tensors and `compute_result` True at the last, whose dict is the metrics;
    `eval_do_concat_batches=False`: lists of per-batch arrays in place of the joined ones."""

    def __init__(self, compute_metrics: Callable[..., Mapping[str, Any]] | None,
                 accumulation_steps: int | None = None, preprocess: Callable[[Any, Any], Any] | None = None,
                 keep: bool = False, post_process: Callable[[Any], Any] | None = None,
                 include: Any = (), concat: bool = True, per_batch: bool = False, objects: bool = False,
                 world_size: int = 1) -> None:
        self.compute_metrics, self.preprocess, self.keep = compute_metrics, preprocess, keep
        self.post_process, self.concat, self.objects = post_process, concat, objects
        # HF's batch_eval_metrics: on one process, each batch as it comes (nothing kept for the metrics)
        self.per_batch, self.online = per_batch, per_batch and world_size == 1 and compute_metrics is not None
        self.batch_values: Any = None  # the last per-batch call's return (compute_result=True: the metrics)
        self.waiting: tuple[EvalPrediction, bool] | None = None  # the batch `settle` hands to compute_metrics
        self.rows: int | None = None  # the first batch's samples (per-batch calls on several processes)
        self.include = include
        # HF's `include_for_metrics`: the main input ("inputs") and each sample's loss ("loss") kept too
        self.inputs = BatchJoiner("inputs", accumulation_steps, concat=concat) if "inputs" in include else None
        self.losses = BatchJoiner("losses", accumulation_steps, concat=concat) if "loss" in include else None
        self.kept: tuple[Any, Any] | None = None  # with `keep`: (predictions, label_ids) after `compute`
        self.predictions = BatchJoiner("predictions", accumulation_steps, concat=concat)
        self.labels = BatchJoiner("label_ids", accumulation_steps, concat=concat)
        self.chunk_rows: int | None = None  # rows per transfer between processes (with accumulation)

    @classmethod
    def of(cls, args: Any, keep: bool = False, world_size: int = 1) -> PredictionCollector | None:
        """A collector for `args.compute_metrics` (None when it is not set and nothing is to be
        kept, or under HF's `prediction_loss_only`); `keep`: also keep the gathered predictions and
        labels (HF's `predict`)."""
        fn = getattr(args, "compute_metrics", None)
        if (fn is None and not keep) or getattr(args, "prediction_loss_only", False):  # HF: the loss alone
            return None
        return cls(fn, getattr(args, "eval_accumulation_steps", None),
                   getattr(args, "preprocess_logits_for_metrics", None), keep,
                   getattr(args, "post_process_function", None),
                   getattr(args, "include_for_metrics", None) or (), getattr(args, "eval_do_concat_batches", True),
                   getattr(args, "batch_eval_metrics", False), getattr(args, "eval_use_gather_object", False),
                   world_size)

    def add(self, outputs: Any, target: Any, generated: tuple[torch.Tensor, Any] | None = None,
            inputs: Any = None, loss: torch.Tensor | None = None, size: int = 0, last: bool = False,
            batch_inputs: Any = None) -> None:
        """One batch: its outputs and target, or with `predict_with_generate` the `generated`
        (ids, target) pair (`generated_ids`); its main input and loss when they are kept; `last`:
        it is the evaluation's last batch, `batch_inputs` its inputs (HF's `batch_eval_metrics`)."""
        # the batch's loss for each sample (HF), when kept
        losses = loss.detach().reshape(1).repeat(size) if loss is not None and "loss" in self.include else None
        predictions, target = generated if generated is not None else (predictions_of(outputs), target)
        if self.preprocess is not None:  # per batch, before gathering (HF's preprocess_logits_for_metrics)
            predictions = self.preprocess(predictions, target)
        if self.online:
            if target is not None:  # called by `settle`, after the batch's on_prediction_step (HF's order)
                kept = {k: v for k, v in (("inputs", batch_inputs), ("loss", losses)) if k in self.include}
                self.waiting = (EvalPrediction(predictions, target, kept.get("inputs"), kept.get("loss")), last)
            if not self.keep:  # HF's evaluate keeps nothing; its predict keeps the predictions
                return
        if self.inputs is not None and isinstance(inputs, torch.Tensor):
            self.inputs.add(inputs)
        if self.losses is not None and losses is not None:
            self.losses.add(losses)
        self.predictions.add(predictions)
        if target is not None:
            self.labels.add(target)
        if self.rows is None:
            rows = tensors_of(predictions)
            self.rows = rows[0].shape[0] if rows and rows[0].dim() else None
        if self.predictions.every and self.chunk_rows is None:
            self.chunk_rows = max(1, self.rows * self.predictions.every) if self.rows else None

    def settle(self) -> None:
        """HF's `batch_eval_metrics`: `compute_metrics` over the batch just added (if it had
        labels), `compute_result` True at the last; its return is kept."""
        if self.waiting is not None:
            eval_pred, last = self.waiting
            self.waiting = None
            fn = self.compute_metrics
            assert fn is not None  # `online` implies it is set
            self.batch_values = fn(eval_pred, compute_result=last)

    def _gathered(self, fabric: Any, joiner: BatchJoiner | None, chunk: int | None = None) -> Any:
        """What `joiner` holds, over every process (None for an empty or absent one)."""
        if joiner is None or not joiner:
            return None
        if not self.concat:
            return gather_batches(fabric, joiner.joined(), objects=self.objects) if fabric.world_size > 1 \
                else joiner.joined()
        if fabric.world_size > 1:
            return gather_blocks(fabric, joiner.joined(), chunk_rows=chunk, objects=self.objects)
        return joiner.joined()

    def compute(self, fabric: Any, prefix: str) -> dict[str, float]:
        """`compute_metrics` over everything added (joined over the processes of `fabric`, padded
        with -100 across batches and processes), its values named `prefix + name` (an `eval_` it
        already has is replaced by the prefix)."""
        if not self.predictions and not self.online:
            return {}
        chunk = None
        if fabric.world_size > 1 and self.predictions.every:  # the same on every process: one chunk size
            chunk = int(fabric.all_gather(torch.tensor([self.chunk_rows or 0], device=fabric.device)).max()) or None
        predictions, labels = (self._gathered(fabric, j, chunk) for j in (self.predictions, self.labels))
        if self.keep:
            self.kept = (_numpy(predictions), _numpy(labels))
        if self.compute_metrics is None:
            return {}
        if self.online:
            values = self.batch_values
            if values is None:  # no batch with labels, or None returned at the last
                return {}
        elif self.post_process is not None:  # run_qa.py's QuestionAnsweringTrainer: metrics of the processed output
            values = self.compute_metrics(self.post_process(_numpy(predictions)))
        elif labels is None:  # the Trainer calls compute_metrics only with labels
            return {}
        else:
            inputs, losses = (self._gathered(fabric, j) for j in (self.inputs, self.losses))
            if self.per_batch:  # several processes: the gathered rows, a step of every process at a time
                values = self._per_step(fabric, predictions, labels, inputs, losses)
            else:
                values = self.compute_metrics(EvalPrediction(_numpy(predictions), _numpy(labels), _numpy(inputs),
                                                             _numpy(losses)))
        return named_metrics(values, prefix)

    def _per_step(self, fabric: Any, predictions: Any, labels: Any, inputs: Any, losses: Any) -> Any:
        """HF's `batch_eval_metrics` over the gathered values of several processes: one call per
        `rows x world_size` samples, in order (a step of the Trainer's), `compute_result` at the last."""
        if not self.concat:  # the steps cut from every sample in order, whatever the batches kept
            predictions, labels, inputs, losses = (None if v is None else pad_concat(v)
                                                   for v in (predictions, labels, inputs, losses))
        step = (self.rows or 1) * fabric.world_size
        total = tensors_of(labels)[0].shape[0]
        fn, values = self.compute_metrics, None
        assert fn is not None  # called only when set
        for at in range(0, total, step):
            def part(value: Any, at: int = at) -> Any:
                return None if value is None else map_tensors(lambda t: t[at: at + step].to(fabric.device), value)

            values = fn(EvalPrediction(part(predictions), part(labels), part(inputs), part(losses)),
                        compute_result=at + step >= total)
        return values


def named_metrics(values: Any, prefix: str) -> dict[str, Any]:
    """`compute_metrics`' dict under `prefix` (an `eval_` it already has replaced by it), NumPy
    numbers and one-element tensors as Python numbers (HF's `denumpify_detensorize`)."""
    if not isinstance(values, Mapping):
        raise TypeError(f"`compute_metrics` must return a dict of values, e.g. {{'accuracy': 0.9}}; "
                        f"got {type(values).__name__}")
    out = {}
    for key, value in values.items():
        name = key[len("eval_"):] if key.startswith("eval_") else key
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        out[prefix + name] = float(value) if isinstance(value, (int, float, np.number)) else value
    return out
