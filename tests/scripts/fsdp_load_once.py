"""FSDP runs whose `model_init` loads a pretrained Hugging Face model (`from_pretrained` from a
directory `save_pretrained` wrote), for tests/test_fsdp_load_once.py: each process writes
RESULTS/rank-N.json.

usage: fsdp_load_once.py --results DIR --pretrained DIR

On the same two processes: a fit with `fsdp_load_once=True` (given as Hugging Face's
`fsdp_config={"cpu_ram_efficient_loading": True}`), a fit without it (`from_pretrained` in every
process), a 2-trial `hyperparameter_search` with `fsdp_load_once=True`, and one of a plain torch
`model_init` (built on the meta device, each process initializing its shard).
"""

import argparse
import json
import os

import torch
import transformers

from fitkit import Model, TrainerCallback


def full_state(module):
    """Every parameter and buffer whole (a collective under FSDP), as lists."""
    out = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().flatten().tolist()
           for n, p in module.named_parameters()}
    out.update({n: b.detach().flatten().tolist() for n, b in module.named_buffers()})
    return out


def data(n=32):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (n, 6), generator=g)
    return [{"input_ids": ids[i], "labels": ids[i, 0] % 2} for i in range(n)]


class Initial(TrainerCallback):
    """The whole weights when training begins, after the set-up."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.weights = full_state(model)


class WatchSharding:
    """The devices of the tensors of each module FSDP2's `fully_shard` receives: what this
    process built before sharding."""

    def __init__(self):
        import torch.distributed.fsdp as fsdp

        self.devices, original = set(), fsdp.fully_shard

        def fully_shard(module, *args, **kwargs):
            self.devices.update(t.device.type for t in module.state_dict().values())
            return original(module, *args, **kwargs)

        fsdp.fully_shard = fully_shard


def compiled(model_init):
    return Model(model_init=model_init).compile("sgd", strategy="fsdp", devices=2, accelerator="cpu")


def fit(model_init, watch, runtime=None, **options):
    model = compiled(model_init)
    if runtime is not None:
        model.runtime.fabric, model.runtime.key = runtime.fabric, runtime.key
    hf = transformers.TrainingArguments(output_dir=options.pop("output_dir"), max_steps=2, learning_rate=0.5,
                                        per_device_train_batch_size=4, save_strategy="no", report_to="none",
                                        disable_tqdm=True, use_cpu=True, **options)
    initial = Initial()
    watch.devices.clear()
    model.fit(data(), args=hf, callbacks=[initial], verbose=0)
    return model, initial.weights, sorted(watch.devices)


def net():
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def search(model_init, runtime, out, *data, **options):
    """Two 1-step trials; each trial's whole weights when training begins and when it ends."""
    model = Model(model_init=model_init).compile("sgd", "cross_entropy" if len(data) > 1 else None, strategy="fsdp",
                                                 devices=2, accelerator="cpu", **options)
    model.runtime.fabric, model.runtime.key = runtime.fabric, runtime.key
    weights = []

    class Weights(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            weights.append(full_state(model))

        def on_train_end(self, args, state, control, model=None, **kwargs):
            weights.append(full_state(model))

    model.hyperparameter_search(*data, hp_space=lambda t: {"learning_rate": t.suggest_float("lr", 0.1, 0.5)},
                                n_trials=2, max_steps=1, batch_size=4, verbose=0, output_dir=out,
                                save_strategy="no", callbacks=[Weights()])
    return weights


def main(opts):
    calls = []

    def model_init(trial=None):
        calls.append(1)
        return transformers.AutoModelForSequenceClassification.from_pretrained(opts.pretrained)

    watch = WatchSharding()
    out = os.path.join(opts.results, "out")
    once, once_initial, once_devices = fit(model_init, watch, output_dir=out,
                                           fsdp_config={"cpu_ram_efficient_loading": True})
    once_calls = len(calls)
    each, each_initial, each_devices = fit(model_init, watch, once.runtime, output_dir=out)
    each_calls = len(calls) - once_calls
    before = len(calls)
    watch.devices.clear()
    searched = search(model_init, once.runtime, out, data(), fsdp_load_once=True)
    search_calls, search_devices = len(calls) - before, sorted(watch.devices)
    watch.devices.clear()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=g)
    plain = search(lambda trial: net(), once.runtime, out, x, (x[:, 0] > 0).long())
    rank = once.fabric.global_rank
    result = {"rank": rank, "once_calls": once_calls, "once_devices": once_devices, "once_initial": once_initial,
              "once_final": full_state(once.module), "each_calls": each_calls, "each_devices": each_devices,
              "each_initial": each_initial, "each_final": full_state(each.module), "search_calls": search_calls,
              "search_devices": search_devices, "search_weights": searched, "plain_devices": sorted(watch.devices),
              "plain_weights": plain}
    with open(os.path.join(opts.results, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--pretrained", required=True)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    main(opts)
