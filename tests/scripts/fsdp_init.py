"""An FSDP run whose module comes from `model_init`, for tests/test_fsdp_large.py: each process
writes RESULTS/rank-N.json with how the module was built and its weights.

usage: fsdp_init.py --results DIR --output DIR

Two steps, each writing a sharded checkpoint; then, on the same processes, a fresh model from
`model_init` resumed from the first checkpoint, which must end equal to the first run.
"""

import argparse
import json
import os
import weakref

import torch

from fitkit import Model, TrainerCallback


class Watched(torch.nn.Linear):
    """A Linear that counts how many full-size weights of its kind are alive at each init: one at a
    time when the module is initialized layer by layer, all of them when it is built whole."""

    alive: list = []
    most = 0

    def reset_parameters(self):
        super().reset_parameters()
        Watched.alive = [r for r in Watched.alive if r() is not None] + [weakref.ref(self.weight)]
        Watched.most = max(Watched.most, len(Watched.alive))


def net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(Watched(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), Watched(16, 16),
                               torch.nn.ReLU(), Watched(16, 2))


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return x, (x[:, 0] > 0).long()


def full_state(module):
    """Every parameter whole (a collective under FSDP: every process calls it), as lists."""
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten().tolist()
            for n, p in module.named_parameters()}


class Initial(TrainerCallback):
    """The whole weights before training and after the first step (only in this test, to compare)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0:
            self.weights = full_state(model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == 1:
            self.first_step = full_state(model)


class CountGathers:
    """Counts whole-tensor gathers (`DTensor.full_tensor`) while a checkpoint loads."""

    def __init__(self):
        self.count = 0

    def install(self):
        from torch.distributed.tensor import DTensor

        from fitkit.engine.checkpoint import elastic

        original_full, original_load = DTensor.full_tensor, elastic.load_state

        def full_tensor(t, *args, **kwargs):
            self.count += 1
            return original_full(t, *args, **kwargs)

        def load_state(*args, **kwargs):
            DTensor.full_tensor = full_tensor
            try:
                return original_load(*args, **kwargs)
            finally:
                DTensor.full_tensor = original_full

        elastic.load_state = load_state


def fit(built_on, runtime=None, **options):
    """A fresh model from `model_init` on the same processes as `runtime` (None: launch them)."""

    def model_init():
        module = net()
        built_on.append(next(module.parameters()).device.type)
        return module

    model = Model(model_init=model_init).compile("sgd", "cross_entropy", learning_rate=0.1, strategy="fsdp",
                                                 devices=2, accelerator="cpu")
    if runtime is not None:
        model.runtime.fabric, model.runtime.key = runtime.fabric, runtime.key
    watch = Initial()
    model.fit(*data(), batch_size=8, shuffle=False, verbose=0, seed=1, callbacks=[watch], **options)
    return model, watch


def main(opts):
    """Two steps writing a sharded checkpoint each; then a fresh model resumed from the first."""
    gathers = CountGathers()
    gathers.install()
    built_on, resumed_on = [], []
    options = {"max_steps": 2, "save_strategy": "steps", "save_steps": 1, "output_dir": opts.output}
    model, watch = fit(built_on, **options)
    Watched.most, most = 0, Watched.most
    resumed, _ = fit(resumed_on, model.runtime, resume_from_checkpoint=os.path.join(opts.output, "checkpoint-1"),
                     **options)
    result = {"rank": model.fabric.global_rank, "built_on": built_on, "most_alive": most,
              "initial": watch.weights, "first_step": watch.first_step, "weights": full_state(model.module),
              "local": {n: list(p.to_local().shape) for n, p in model.module.named_parameters()},
              "resumed_on": resumed_on, "resumed_step": resumed.state.global_step, "load_gathers": gathers.count,
              "resumed_weights": full_state(resumed.module)}
    with open(os.path.join(opts.results, f"rank-{result['rank']}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--output", required=True)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    main(opts)
