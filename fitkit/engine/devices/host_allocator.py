"""Keep glibc's malloc from giving a CPU step's freed tensors back to the kernel every step.

With glibc's defaults, a block of memory over the mmap threshold is unmapped when freed, and
free memory at the top of the heap beyond the trim threshold is returned to the kernel; both
thresholds also move with what the process frees. A CPU training step frees its gradients
(`zero_grad()` sets them to None) and allocates them again at the next backward, so once the
thresholds settle low every step faults in its gradients' pages afresh: a 4 x Linear(2048, 2048)
MLP with Adam then takes 8,000 - 24,000 page faults and 20 - 45% more time per step, from one
run to the next and mid-run, in a hand-written loop as in `fit`. Fixing the thresholds keeps
those blocks in the heap, reused step after step (no fault; the same bits)::

    from fitkit.engine.devices.host_allocator import keep_freed_memory
    keep_freed_memory()    # True where glibc took the settings (once per process)

Blocks of 32 MiB and more are still mapped and unmapped each time (glibc's ceiling for the
mmap threshold); for those, an allocator such as jemalloc or tcmalloc (`LD_PRELOAD`) helps.
The process keeps up to `TRIM_THRESHOLD` of freed memory for reuse instead of returning it.
Nothing is changed where the user set glibc's `MALLOC_*` variables, preloads another
allocator, or passes `tune_cpu_allocator=False`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger("fitkit")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the highest glibc accepts on 64-bit
TRIM_THRESHOLD = 1 << 30
#: The environment through which a user already tunes glibc's malloc: left to them.
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                 "GLIBC_TUNABLES")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once per process (see the module's text); True
    when they are in effect, False where the platform, the environment or glibc declined."""
    global _applied
    if _applied is None:
        _applied = _apply()
        if _applied:
            logger.debug("glibc malloc: mmap threshold %d, trim threshold %d", MMAP_THRESHOLD, TRIM_THRESHOLD)
    return _applied


def _apply() -> bool:
    if not sys.platform.startswith("linux") or any(os.environ.get(name) for name in USER_SETTINGS):
        return False
    if any(name in os.environ.get("LD_PRELOAD", "") for name in OTHER_ALLOCATORS):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt thresholds)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
