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

After a set-up that allocates and frees many large temporaries (an FSDP module initialized one
whole layer at a time), glibc holds tens of MiB of free blocks between live ones, which no
threshold returns; `release_freed_memory()` gives them back once (`malloc_trim`). A CPU FSDP
run does the opposite of `keep_freed_memory`: its steps allocate and free whole layers among
longer-lived shards, which fragments a heap that keeps them (with 32 layers of 16 MiB on 4
processes, the peak was 2.7 x the ideal); `map_large_blocks()` maps each block of 1 MiB or more
on its own and unmaps it when freed::

    release_freed_memory()    # True where glibc's malloc_trim ran
    map_large_blocks()        # True where glibc took the setting (not where the user tunes malloc)
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
MAP_THRESHOLD = 1 << 20  # map_large_blocks: a fixed threshold also stops glibc from raising it
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


def release_freed_memory() -> bool:
    """Return the free memory glibc's malloc holds to the kernel (`malloc_trim(0)`: also the
    free pages between live blocks, which no threshold releases); False off glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    libc.malloc_trim(0)
    return True


def map_large_blocks() -> bool:
    """Have glibc map every block of `MAP_THRESHOLD` bytes or more on its own, and unmap it when
    freed (see the module's text); False where the platform, the environment or glibc declined."""
    libc = None if _user_tuned() else _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc.mallopt(M_MMAP_THRESHOLD, MAP_THRESHOLD) == 1


def _user_tuned() -> bool:
    """Whether the user tunes glibc's malloc (its variables) or preloads another allocator."""
    return (any(os.environ.get(name) for name in USER_SETTINGS)
            or any(name in os.environ.get("LD_PRELOAD", "") for name in OTHER_ALLOCATORS))


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has no mallopt thresholds)
    except (OSError, AttributeError):
        return None
    return libc


def _apply() -> bool:
    libc = None if _user_tuned() else _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
