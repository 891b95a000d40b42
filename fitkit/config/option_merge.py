"""One rule for the options of a fit given in three places: `compile(**options)`, `fit(args=...)`
and `fit(**options)`. Nothing given is dropped without a word::

    model.compile("adamw", devices=2, strategy="ddp", data_collator=collate)
    model.fit(train, args=transformers.TrainingArguments(output_dir="out", learning_rate=3e-4), epochs=2)
    # runs on 2 processes with `collate`, learning_rate 3e-4 and 2 epochs

The rule, field by field (later wins):

1. `TrainingArguments`' defaults, or the defaults of the object given as `args=` (HF's defaults
   for a `transformers.TrainingArguments`);
2. what `compile` was given;
3. what `args=` sets (a field whose value differs from its class's default);
4. what `fit` was given beside `args=` (fit's `batch_size`, `epochs`, `shuffle`, `max_steps`
   count as given when not None).

When two places give a field different values (compile and `args=`, or `args=` and fit's own
keywords), the later one is used and one `UserWarning` names every such field with both
values. A fit keyword over a compile option is no conflict: compile's options are the defaults
of every fit (Keras). The optimizer follows the same rule: compile's optimizer (other than
the default "adam") is used unless `args.optim` was set to a non-default name, which then wins
with a warning.

`in_force` / `for_evaluation` carry the data options of the last fit (`data_collator`,
`compute_metrics`, `remove_unused_columns`, `processing_class`, `label_names`,
`eval_accumulation_steps`, `preprocess_logits_for_metrics`, `per_device_eval_batch_size`,
`post_process_function`) into
`evaluate` and `predict` when those are not given to them.
"""

from __future__ import annotations

import warnings
from typing import Any

from fitkit.config.arguments import TrainingArguments
from fitkit.config.names import canonical

#: The options of the last fit that `evaluate` and `predict` use when not given.
CARRIED = ("data_collator", "compute_metrics", "remove_unused_columns", "processing_class", "label_names",
           "eval_accumulation_steps", "preprocess_logits_for_metrics", "per_device_eval_batch_size",
           "predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config",
           "post_process_function")
#: what else of a fit's arguments `evaluate` and `predict` keep (not keywords of theirs): HF's
#: Trainer mode (an `evaluate()` after fit logs its record) and, with it, `disable_tqdm`'s printing.
FROM_FIT = ("hf_trainer", "data_order", "verbose", "prediction_loss_only", "label_smoothing_factor",
            "dataloader_drop_last", "include_for_metrics",
            "bf16_full_eval", "fp16_full_eval", "eval_do_concat_batches", "batch_eval_metrics", "eval_use_gather_object",
            "train_sampling_strategy", "length_column_name", "seed", "data_seed")

#: compile's default optimizer: it does not count as given against `args.optim`.
DEFAULT_OPTIMIZER = "adam"


def canonical_names(options: dict[str, Any]) -> dict[str, Any]:
    """`options` by field name (aliases and HF-only names resolved), without repeating warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return canonical(dict(options), TrainingArguments.names())


def explicit_fields(args: TrainingArguments) -> set[str]:
    """The fields of a fitkit `TrainingArguments` its caller set (by name or position, or by
    `replace`); for one built otherwise, those that differ from the defaults."""
    given = args.__dict__.get("_given")
    if given is not None:
        return set(given)
    default = _default_arguments()
    return {name for name in TrainingArguments.names() if not _same(getattr(args, name), getattr(default, name))}


def merge(compiled: TrainingArguments, compile_options: dict[str, Any], compile_optimizer: Any,
          args: TrainingArguments, explicit: set[str], fit_options: dict[str, Any]) -> TrainingArguments:
    """The arguments of a fit given `args=` (already a fitkit `TrainingArguments`, `explicit` its
    fields set by the user) between compile's (`compiled`, built from `compile_options`) and
    fit's own keywords (`fit_options`, "not given" already removed). See the module docstring."""
    conflicts: list[str] = []
    over: dict[str, Any] = {}
    for name in canonical_names(compile_options):
        mine = getattr(compiled, name)
        if name not in explicit:
            over[name] = mine
        elif not _same(mine, getattr(args, name)):
            conflicts.append(f"`{name}`: compile({name}={_short(mine)}) and args.{name}={_short(getattr(args, name))}"
                             " -> args= is used")
    if args.optim and compile_optimizer != DEFAULT_OPTIMIZER:
        if "optim" in explicit:
            conflicts.append(f"the optimizer: compile({_short(compile_optimizer)}) and args.optim={args.optim!r} "
                             "-> args.optim is used")
        else:
            over["optim"] = None  # compile's optimizer
    given = canonical_names(fit_options)
    for name, value in given.items():
        if name in explicit and not _same(value, getattr(args, name)):
            conflicts.append(f"`{name}`: args.{name}={_short(getattr(args, name))} and fit({name}={_short(value)}) "
                             "-> fit's is used")
    if conflicts:
        warnings.warn("options given twice with different values: " + "; ".join(conflicts)
                      + " (the rule: fit's keywords > args= > compile's options; see docs/migrating-from-hf.md)",
                      UserWarning, stacklevel=4)
    over.update(given)
    return args.replace(**over) if over else args


def in_force(run_args: TrainingArguments) -> dict[str, Any]:
    """The data options of a fit that `evaluate` and `predict` carry on using."""
    return {name: getattr(run_args, name) for name in (*CARRIED, *FROM_FIT)}


def for_evaluation(args: TrainingArguments, carried: dict[str, Any] | None, given: dict[str, Any]) -> TrainingArguments:
    """`args` (compile's) with the last fit's data options (`carried`) and then `given` (the
    evaluate/predict keywords that are not None) over them."""
    values = {k: v for k, v in (carried or {}).items() if not _same(v, getattr(args, k))}
    values.update({k: v for k, v in given.items() if v is not None and not _same(v, getattr(args, k))})
    return args.replace(**values) if values else args


_DEFAULT: list[TrainingArguments] = []


def _default_arguments() -> TrainingArguments:
    if not _DEFAULT:
        _DEFAULT.append(TrainingArguments())
    return _DEFAULT[0]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:  # noqa: BLE001 - values whose == is not a bool (arrays): compared by identity
        return a is b


def _short(value: Any) -> str:
    text = getattr(value, "__qualname__", None) or repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
