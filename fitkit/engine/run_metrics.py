"""The figures of a finished run: speed (always) and memory (with `skip_memory_metrics=False`).

Names follow HF: `train_runtime`, `train_samples_per_second`, `train_steps_per_second`,
`train_loss`, and `train_mem_cpu_alloc_delta`, `train_mem_cpu_peaked_delta`,
`train_mem_gpu_alloc_delta`, `train_mem_gpu_peaked_delta` (bytes).
"""

from __future__ import annotations

import os
import resource
import threading
import time

import torch

from fitkit.events.hf_view import speed_metrics


def _rss() -> int:
    """Resident memory of this process, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # not Linux: the peak is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _PeakSampler(threading.Thread):
    """Samples the resident memory every few milliseconds and keeps the highest value."""

    def __init__(self, interval: float = 0.005):
        super().__init__(daemon=True)
        self.interval, self.peak = interval, _rss()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return max(self.peak, _rss())


class RunMetrics:
    """Start when training starts, `finish()` when it ends."""

    def __init__(self, device: torch.device, memory: bool):
        self.device, self.memory = device, memory
        self.start = time.perf_counter()
        self._sampler = None
        if memory:
            self._cpu_start = _rss()
            self._sampler = _PeakSampler()
            self._sampler.start()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                self._gpu_start = torch.cuda.memory_allocated(device)

    def finish(self, samples: int, steps: int) -> dict[str, float]:
        out = speed_metrics("train", time.perf_counter() - self.start, samples, steps)
        if self._sampler is not None:
            peak = self._sampler.stop()
            end = _rss()
            out["train_mem_cpu_alloc_delta"] = end - self._cpu_start
            out["train_mem_cpu_peaked_delta"] = max(0, peak - end)
            if self.device.type == "cuda":
                gpu_end = torch.cuda.memory_allocated(self.device)
                out["train_mem_gpu_alloc_delta"] = gpu_end - self._gpu_start
                out["train_mem_gpu_peaked_delta"] = max(0, torch.cuda.max_memory_allocated(self.device) - gpu_end)
        return out
