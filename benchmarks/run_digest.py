"""Digests of what a set of runs computes: the final weights and the logged records, bit for bit.

A behaviour-neutral change (a refactor, a split by job) must leave every digest as it was: run this
on the commit before and after the change and compare the lines::

    python -m benchmarks.run_digest > before.txt      # on the old commit (PYTHONPATH=old checkout)
    python -m benchmarks.run_digest > after.txt
    diff before.txt after.txt                          # nothing: the same bits

The runs cover both faces (Keras' records and the Trainer's), gradient accumulation with a schedule
and clipping, validation with metrics, an overridden `train_step`, a stop from a callback and
checkpoints written and resumed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script: make the checkout's `benchmarks` package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch


def _data(n: int = 96, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _digest(model: Any) -> str:
    """sha256 over the weights' bytes and the logged records (timings left out)."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    timed = ("runtime", "per_second", "samples_per_second", "steps_per_second")
    records = [{k: v for k, v in r.items() if not any(t in k for t in timed)} for r in model.state.log_history]
    h.update(json.dumps(records, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _keras(out: str) -> Any:
    from fitkit import Model

    x, y = _data()
    model = Model(_net()).compile("adam", "cross_entropy", metrics=["accuracy"])
    model.fit(x, y, epochs=3, batch_size=16, validation_split=0.25, verbose=0, seed=1)
    return model


def _trainer(out: str) -> Any:
    from fitkit import Model

    x, y = _data()
    model = Model(_net()).compile("adamw", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=8, hf_trainer=True, logging_steps=3, gradient_accumulation_steps=2,
              lr_scheduler="linear", warmup_steps=2, max_grad_norm=1.0, validation_data=_data(32, 1),
              eval_strategy="steps", eval_steps=4, verbose=0, seed=2)
    return model


def _checkpoints(out: str) -> Any:
    from fitkit import Model

    x, y = _data()
    first = Model(_net()).compile("sgd", "cross_entropy")
    first.fit(x, y, epochs=2, batch_size=16, save_strategy="epoch", output_dir=out, verbose=0, seed=3)
    again = Model(_net(5)).compile("sgd", "cross_entropy")
    again.fit(x, y, epochs=3, batch_size=16, save_strategy="epoch", output_dir=out, verbose=0, seed=3,
              resume_from_checkpoint=True)
    return again


def _custom_step(out: str) -> Any:
    from fitkit import Model

    class Own(Model):
        def train_step(self, data: Any) -> dict:
            x, y = data
            loss = torch.nn.functional.cross_entropy(self.module(x), y)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return {"loss": loss, "scale": loss.detach() * 2}

    x, y = _data()
    model = Own(_net()).compile("rmsprop", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=12, gradient_accumulation_steps=2, verbose=0, seed=4)
    return model


def _stopped(out: str) -> Any:
    from fitkit import Model, TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if state.global_step == 5:
                model.stop_training = True

    x, y = _data()
    model = Model(_net()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=4, batch_size=16, callbacks=[Stop()], verbose=0, seed=5)
    return model


RUNS: dict[str, Callable[[str], Any]] = {"keras": _keras, "trainer": _trainer, "checkpoints": _checkpoints,
                                         "custom_step": _custom_step, "stopped": _stopped}


def main() -> int:
    torch.set_num_threads(1)
    for name, run in RUNS.items():
        with tempfile.TemporaryDirectory() as out:
            print(f"{name}: {_digest(run(out))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
