"""The Trainer's result files and printout (a mixin of `Model`): `log_metrics`, `save_metrics`
and `save_state` write what Hugging Face's example scripts leave in `output_dir`::

    train_result = model.fit(train_ds, args=training_args, ...)
    model.log_metrics("train", train_result.metrics)      # ***** train metrics *****
    model.save_metrics("train", train_result.metrics)     # train_results.json, all_results.json
    model.save_state()                                    # trainer_state.json
    metrics = model.evaluate(metric_key_prefix="eval")    # eval_loss, ... on fit's validation data
    model.save_metrics("eval", metrics)                   # eval_results.json, all_results.json

Only the world-zero process prints and writes, as the Trainer does.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

from fitkit.facade.members import ModelMembers


class HFResults(ModelMembers):
    """`log_metrics`, `save_metrics`, `save_state` (they read `state` and the output directory
    of the last fit, else compile's)."""

    def log_metrics(self, split: str, metrics: dict[str, Any]) -> None:
        """Print `metrics` as the Trainer does: a `***** {split} metrics *****` header, then one
        aligned `name = value` line per value (runtimes as h:mm:ss.cc, memory in MB, flos in GF)."""
        if not self.state.is_world_process_zero:
            return
        shown = {k: _shown(k, v) for k, v in metrics.items()}
        print(f"***** {split} metrics *****")
        if not shown:
            return
        k_width, v_width = max(len(str(k)) for k in shown), max(len(str(v)) for v in shown.values())
        for key in sorted(shown):
            print(f"  {key: <{k_width}} = {shown[key]:>{v_width}}")

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> str:
        """Write `metrics` to `{split}_results.json` in the output directory and, with `combined`,
        merge them into `all_results.json` there; returns the first file's path."""
        directory = self._results_directory()
        path = os.path.join(directory, f"{split}_results.json")
        if not self.state.is_world_process_zero:
            return path
        os.makedirs(directory, exist_ok=True)
        _write_json(path, metrics)
        if combined:
            every = os.path.join(directory, "all_results.json")
            merged: dict[str, Any] = {}
            if os.path.exists(every):
                with open(every, encoding="utf-8") as f:
                    merged = json.load(f)
            merged.update(metrics)
            _write_json(every, merged)
        return path

    def save_state(self) -> str:
        """Write the last run's `TrainerState` to `trainer_state.json` in the output directory."""
        directory = self._results_directory()
        path = os.path.join(directory, "trainer_state.json")
        if self.state.is_world_process_zero:
            os.makedirs(directory, exist_ok=True)
            self.state.save_to_json(path)
        return path

    def _results_directory(self) -> str:
        if self._last_output_dir:
            return self._last_output_dir
        return self.config.args.output_dir if self.config is not None else "fitkit_output"


def _write_json(path: str, values: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(values, f, indent=4, sort_keys=True)


def _shown(key: str, value: Any) -> Any:
    """One value as the Trainer prints it (its `metrics_format`)."""
    if "_mem_" in key and isinstance(value, int):
        return f"{value >> 20}MB"
    if "_runtime" in key and isinstance(value, (int, float)):
        whole = int(value)
        return f"{datetime.timedelta(seconds=whole)}.{int(abs(value - whole) * 100):02d}"
    if key == "total_flos" and isinstance(value, (int, float)):
        return f"{int(value) >> 30}GF"
    return round(value, 4) if isinstance(value, float) else value
