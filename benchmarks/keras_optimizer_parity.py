"""How far each named optimizer's weights are from Keras 3's (torch backend) after the same steps:
the figures of docs/migrating-from-keras.md ("Optimizer defaults"). Same initial weights (a 4x3
matrix and a bias), six steps of the same random gradients, at gradient sizes 1, 1e-3 and 1e-4,
and at 1e-2 with the rate cut from the default to 3e-4 after the third step; the largest relative
difference of any weight after any step. torch's own classes (what the names built before) are
measured the same way.

    .venv/bin/python benchmarks/keras_optimizer_parity.py      # needs keras 3 installed
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
import torch

from fitkit.adapters.optimizers import KERAS_DEFAULTS, OPTIMIZERS

#: (label, Keras class, Keras keywords, fitkit name or a torch class, torch keywords)
CASES = [
    ("adam", "Adam", {}, "adam", {}),
    ("adam amsgrad, weight_decay", "Adam", {"amsgrad": True, "weight_decay": 0.1}, "adam",
     {"amsgrad": True, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("adamw", "AdamW", {}, "adamw", {}),
    ("sgd", "SGD", {}, "sgd", {}),
    ("sgd momentum, weight_decay", "SGD", {"momentum": 0.9, "weight_decay": 0.1}, "sgd",
     {"momentum": 0.9, "weight_decay": 0.1}),
    ("sgd momentum, nesterov", "SGD", {"momentum": 0.9, "nesterov": True}, "sgd", {"momentum": 0.9, "nesterov": True}),
    ("rmsprop", "RMSprop", {}, "rmsprop", {}),
    ("rmsprop rho, momentum, centered, weight_decay", "RMSprop",
     {"rho": 0.8, "momentum": 0.9, "centered": True, "weight_decay": 0.1}, "rmsprop",
     {"alpha": 0.8, "momentum": 0.9, "centered": True, "weight_decay": 0.1}),
    ("adagrad", "Adagrad", {}, "adagrad", {}),
    ("adadelta weight_decay", "Adadelta", {"weight_decay": 0.1}, "adadelta", {"weight_decay": 0.1}),
    ("adamax weight_decay", "Adamax", {"weight_decay": 0.1}, "adamax", {"weight_decay": 0.1}),
    ("nadam weight_decay", "Nadam", {"weight_decay": 0.1}, "nadam", {"weight_decay": 0.1}),
    ("lion weight_decay", "Lion", {"weight_decay": 0.1}, "lion", {"weight_decay": 0.1}),
    ("before: torch.optim.Adam", "Adam", {}, torch.optim.Adam, {"lr": 1e-3, "eps": 1e-7}),
    ("before: torch.optim.RMSprop", "RMSprop", {}, torch.optim.RMSprop, {"lr": 1e-3, "alpha": 0.9, "eps": 1e-7}),
    ("before: torch.optim.Adagrad", "Adagrad", {}, torch.optim.Adagrad,
     {"lr": 1e-3, "initial_accumulator_value": 0.1, "eps": 1e-7}),
    ("before: torch.optim.SGD momentum", "SGD", {"momentum": 0.9}, torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9}),
]


def same_steps(keras, kopt, opt, params, scale: float, generator: torch.Generator, steps: int = 6,
               new_rate: float | None = None) -> float:
    """Step Keras' `kopt` and torch's `opt` from the same weights with the same gradients (of size
    `scale`, drawn from `generator`); the rate changes to `new_rate` after the third step. Returns
    the largest relative difference of the weights seen (tests/test_keras_optimizers.py uses it)."""
    kvars = [keras.Variable(p.detach().numpy().copy()) for p in params]
    worst = 0.0
    for step in range(steps):
        if new_rate is not None and step == 3:
            kopt.learning_rate.assign(new_rate)
            for group in opt.param_groups:
                group["lr"] = new_rate
        grads = [torch.randn(p.shape, generator=generator) * scale for p in params]
        kopt.apply_gradients([(grad.clone(), v) for grad, v in zip(grads, kvars)])
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        opt.step()
        for p, v in zip(params, kvars):
            theirs = torch.from_numpy(np.asarray(v.numpy()))
            worst = max(worst, ((p.detach() - theirs).abs() / theirs.abs()).max().item())
    return worst


def worst_difference(keras_name: str, keras_options: dict, spec: object, options: dict) -> float:
    """The largest relative weight difference over the four runs."""
    worst = 0.0
    for scale, new_rate in ((1.0, None), (1e-3, None), (1e-4, None), (1e-2, 3e-4)):
        g = torch.Generator().manual_seed(0)
        start = [torch.randn(4, 3, generator=g), torch.randn(3, generator=g)]
        params = [torch.nn.Parameter(w.clone()) for w in start]
        if isinstance(spec, str):
            opt = OPTIMIZERS[spec][0](params, **{**KERAS_DEFAULTS[spec], **options})
        else:
            opt = spec(params, **options)
        kopt = getattr(keras.optimizers, keras_name)(**keras_options)
        worst = max(worst, same_steps(keras, kopt, opt, params, scale, g, new_rate=new_rate))
    return worst


def main() -> None:
    print(f"keras {keras.__version__}, torch {torch.__version__}")
    print("| optimizer (options) | largest relative weight difference |")
    print("| --- | --- |")
    for label, keras_name, keras_options, spec, options in CASES:
        print(f"| {label} | {worst_difference(keras_name, keras_options, spec, options):.1e} |")


if __name__ == "__main__":
    main()
