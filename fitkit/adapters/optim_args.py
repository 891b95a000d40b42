"""HF's `optim_args` ("key=value,key=value"): the options the Trainer gives the optimizer it builds by
name, read as transformers 5.23 reads them (`trainer_optimizer.py`)::

    optim_options("sgd", "momentum=0.9, nesterov=True")   # (("momentum", 0.9), ("nesterov", True))
    optim_options("adamw_torch", "momentum=0.9")          # (): the Trainer's AdamW reads none of them

Only `sgd` (`momentum`, `dampening`, `weight_decay`, `nesterov`), `adagrad` (`lr_decay`,
`weight_decay`, `eps`) and `rmsprop` (`momentum`, `alpha`, `eps`, `weight_decay`, `centered`) read
any; other keys, and every key for the other names fitkit builds, are ignored, as the Trainer
ignores them. A `weight_decay` here sets the optimizer's default only: the parameter groups keep
the run's own, as under the Trainer.
"""

from __future__ import annotations

from typing import Any

#: The keys each HF `optim` name reads: number keys and switch keys (true, 1 or yes, any case).
READ: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sgd": (("momentum", "dampening", "weight_decay"), ("nesterov",)),
    "adagrad": (("lr_decay", "weight_decay", "eps"), ()),
    "rmsprop": (("momentum", "alpha", "eps", "weight_decay"), ("centered",)),
}


def parse_optim_args(text: str | None) -> dict[str, str]:
    """`optim_args` as its pairs ({} for None or ""); spaces anywhere are dropped, as HF drops them."""
    if not text:
        return {}
    pairs = {}
    for item in str(text).replace(" ", "").split(","):
        key, sep, value = item.partition("=")
        if not sep or "=" in value:
            raise ValueError(f"`optim_args`={text!r} is invalid: {item!r} is not one key=value; pass pairs "
                             "separated by commas, such as 'momentum=0.9,nesterov=True'")
        pairs[key] = value
    return pairs


def optim_options(optim: str, text: str | None) -> tuple[tuple[str, Any], ...]:
    """The keyword arguments `optim_args` gives the optimizer of the HF name `optim` (sorted pairs)."""
    pairs = parse_optim_args(text)
    numbers, switches = READ.get(optim, ((), ()))
    options: dict[str, Any] = {}
    for key in numbers:
        if key in pairs:
            try:
                options[key] = float(pairs[key])
            except ValueError:
                raise ValueError(f"`optim_args`: {key}={pairs[key]!r} is not a number; pass {key}=<number>") from None
    for key in switches:
        if key in pairs:
            options[key] = pairs[key].lower() in ("true", "1", "yes")
    return tuple(sorted(options.items()))
